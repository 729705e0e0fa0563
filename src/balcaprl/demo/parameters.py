"""Every parameter of the synthetic world and of the demo's defaults, and where its value comes from.

One entry per parameter (or per group that is one choice), classified:

- **paper**: a value the paper states (``why`` names the line);
- **principle**: fixed by arithmetic or by a principle stated first (``why`` says which);
- **free**: nothing fixes it; where the pre-flight statistics depend on it, ``table`` names the table of
  ``scripts/world_preflight_table.py`` that shows them over a range of it;
- **tuned**: picked by a tuning round (comparing runs on what the demo then shows), so what it shows
  is not an independent measurement of that value;
- **plumbing**: changes how a run is carried out, not what it measures.

The values are never written here: :func:`parameter_table` reads each one from the code (a module
constant of ``balcaprl.synthetic``, a demo config default, a ``PolicySpec`` field), and
docs/synthetic-world.md holds that table (``scripts/render_world_parameters.py`` writes it; a test keeps
it current and checks that every demo default is listed).
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass, fields
from typing import Any, Literal

from balcaprl.recipe import PROVENANCE

Source = Literal["paper", "principle", "free", "tuned", "plumbing"]
SOURCES: tuple[Source, ...] = ("paper", "principle", "free", "tuned", "plumbing")
# The top-level sections of the demo config (a key under one of them is a config key); any other
# first part names a module of balcaprl.synthetic.
_CONFIG_SECTIONS = {"output_dir", "threads", "dataset", "sft", "evaluation", "judge", "recipe"}


@dataclass(frozen=True)
class WorldParameter:
    keys: tuple[str, ...]  # demo config keys (dataset.max_objects), policy.FIELD, or MODULE.CONSTANT
    source: Source
    why: str
    table: str | None = None  # the pre-flight table over a range of it (world_preflight_table.py)


def _p(keys: str, source: Source, why: str, table: str | None = None) -> WorldParameter:
    return WorldParameter(tuple(keys.split()), source, why, table)


def _from_recipe(keys: str) -> WorldParameter:
    """Recipe settings the demo keeps at the paper's value: their provenance is the recipe's own."""
    whys = (PROVENANCE[key.removeprefix("recipe.")] for key in keys.split())
    return _p(keys, "paper", "; ".join(dict.fromkeys(entry.why for entry in whys)))


WORLD_PARAMETERS: tuple[WorldParameter, ...] = (
    # ------------------------------------------------------------------------------- the rewards (RL)
    _p("recipe.rewards.weights.precision recipe.rewards.weights.recall recipe.rewards.weights.linguistic",
       "paper", "Table 3's 'Full' row, equal weights: the row the demo's variants ablate"),
    _from_recipe("recipe.rewards.length.mode recipe.rewards.length.tau_low recipe.rewards.length.tau_high"),
    _from_recipe("recipe.rewards.pointability"),
    _from_recipe("recipe.advantage.estimator"),
    _from_recipe("recipe.rollout.rollouts_per_prompt"),
    _p("recipe.rollout.max_caption_tokens evaluation.max_new_tokens", "principle",
       "room past tau_u x the references (~85 tokens, at most ~120), so the mask's upper side can bind"),
    _p("recipe.rollout.temperature", "tuned", "1.0 gained a third as much held-out rise in an earlier round"),
    _p("recipe.train.prompts_per_batch", "free",
       "8 prompts x G = 64 captions a batch, a size for 2 CPU cores (paper: 256)"),
    _p("recipe.train.updates_per_batch", "principle",
       "2: the second update is off-policy, so the PPO clip and dual-clip act (with 1 they cannot)"),
    _p("recipe.train.learning_rate", "tuned", "~10x below SFT's; 1e-4 and 2e-4 moved along the P/R trade-off"),
    _p("recipe.train.max_steps", "tuned", "250 and 350 steps gave the same rise (an earlier world)"),
    _p("recipe.train.warmup recipe.train.seed", "free", "no paper value for the demo's scale"),
    _p("recipe.train.per_device_batch_size recipe.train.precision recipe.train.use_cpu "
       "recipe.run.save_total_limit recipe.run.log_rollouts_every", "plumbing",
       "memory, CPU and checkpoints: the same updates"),
    # ---------------------------------------------------------------------------------- the scenes
    _p("dataset.min_objects dataset.max_objects", "tuned",
       "what a 0.6 M-parameter policy learns to see in minutes of SFT (the full world has 2-7)",
       "shapes per scene"),
    _p("dataset.kinds dataset.colors", "tuned", "4 x 4 of the world's 8 x 8, for the same reason",
       "kinds x colours"),
    _p("dataset.text_probability dataset.texture_probability", "tuned",
       "none, for the same reason (the full world: 0.3 and 0.5)", "words and textures"),
    _p("dataset.n_train dataset.n_eval dataset.seed dataset.image_size", "free",
       "sizes and a seed; the probe reads the first 48 training scenes"),
    _p("scenes.SceneSpec", "free", "the full world's defaults (build without the demo)"),
    _p("lexicon.KINDS lexicon.COLORS lexicon.SIZES lexicon.TEXTURES lexicon.TEXT_WORDS", "free",
       "the closed vocabulary; the oracle knows all of it, whatever a scene draws"),
    _p("lexicon.CELL_NAMES", "free", "a 3 x 3 grid, one shape per cell, so every position word names one cell"),
    # ------------------------------------------------------------------------- the references
    _p("captions.RELATIONS_BY_SCENE_SIZE", "tuned",
       "version 3 lengthened the references after what-ifs on the c-GDPO/GRPO correlation, the statistic "
       "a pre-flight test measures", "reference relations"),
    _p("captions.REFERENCE_SHUFFLED", "free", "variety of order in the references"),
    # ------------------------------------------------------------------------------- the judge
    _p("parser._CaptionParser._placed_mention", "paper",
       "a placed shape is five claims (there, size, colour, kind, word): 'the shortest possible factual "
       "claims' (Appendix, training prompt)"),
    _p("linguistic.BUDGET_BASE linguistic.BUDGET_PER_SHAPE", "principle",
       "what the re-captioner's complete description takes: no reference exceeds it (a test, 500 scenes)"),
    _p("linguistic.OVERLOAD_WORDS", "free", "words past the budget per clarity point", "overload step"),
    _p("linguistic.LONG_SENTENCE", "free", "a run-on threshold above the references' ~18-token sentences"),
    # ------------------------------------------------------------------------ the base captioner
    _p("captioners.BASE_MODE_WEIGHTS", "free", "how often the base captioner is detailed, terse or "
       "enumerating", "base mode mix"),
    _p("captioners.ERROR_FIRST captioners.ERROR_STEP captioners.ERROR_SMALL", "free",
       "the chance of naming a shape wrongly, rising with its place and for small shapes; the paper states "
       "the direction (saying less raises precision), no size", "error schedule"),
    _p("captioners.GUESSES_PER_SHAPE", "free", "the enumerating mode's wrong guesses beside each shape",
       "guesses per shape"),
    _p("captioners.TERSE_NAMES_A_SHAPE", "free", "a terse caption names its most salient shape or nothing",
       "terse names a shape"),
    _p("sft.flawed_fraction", "free", "share of flawed SFT targets, the mistakes RL is there to remove",
       "flawed share"),
    _p("flaws.FLAW_KINDS", "free", "six kinds, drawn evenly; each one's inner choices (how many wrong "
       "shapes, repeated or commentary sentences) are literals of balcaprl.synthetic.flaws"),
    # ------------------------------------------------------------------- the original references
    _p("captioners.ORIGINAL_WRONG_ATTRIBUTE captioners.ORIGINAL_COMMENTARY captioners.ORIGINAL_INFERENCE",
       "free", "the degraded original ('w/o recap'); its test asks only the direction (below the "
       "re-captioned references on recall and precision)", "original caption noise"),
    # ------------------------------------------------------------------------------- the policy, SFT
    _p("policy.vision_hidden policy.vision_layers policy.vision_heads policy.vision_ffn policy.text_hidden "
       "policy.text_layers policy.text_heads policy.text_kv_heads policy.text_ffn policy.max_positions "
       "policy.projector_init_std", "free", "a ~0.6 M-parameter LLaVA-architecture model that trains on 2 cores"),
    _p("policy.image_size policy.patch_size", "principle", "one 28-pixel patch per cell of the 3 x 3 grid"),
    _p("policy.image_mean policy.image_std", "principle",
       "pixels centred on the world's background colour, so an empty cell embeds near zero"),
    _p("sft.steps", "tuned", "held-out b-CapScore after 800, 1,500 and 2,000 steps (an earlier world)"),
    _p("sft.vision_lr_scale", "tuned", "the vision tower learns to see faster at 5x"),
    _p("sft.batch_size sft.lr sft.warmup_steps sft.seed", "free", "the SFT warm start's optimiser"),
    _p("sft.micro_batches", "plumbing", "the same gradient as the whole padded batch, less compute"),
    # ---------------------------------------------------------------------------- the evaluation
    _p("evaluation.temperature", "principle", "null: the rollout temperature, the policy RL optimises"),
    _p("evaluation.level", "principle", "a 95% interval, the convention the pre-flight bounds use too"),
    _p("evaluation.scenes evaluation.bootstrap_samples evaluation.seed", "free", "the interval's width"),
    _p("output_dir threads evaluation.show judge.transport judge.concurrency", "plumbing",
       "where and how fast a run goes, not what it measures"),
)  # fmt: skip


def _config_defaults() -> dict[str, Any]:
    from balcaprl.demo.config import DemoConfig

    return DemoConfig().model_dump(mode="json")


def _policy_defaults() -> dict[str, Any]:
    from balcaprl.synthetic.policy import PolicySpec

    return {f.name: getattr(PolicySpec(), f.name) for f in fields(PolicySpec)}


def parameter_value(key: str, config: dict[str, Any] | None = None) -> Any:
    """The value of ``key`` in the code: a demo config default, a ``PolicySpec`` default, or a constant
    of a ``balcaprl.synthetic`` module. An unknown key is a KeyError."""
    head, _, rest = key.partition(".")
    if head in _CONFIG_SECTIONS:
        value: Any = _config_defaults() if config is None else config
        for part in key.split("."):
            value = value[part]
        return value
    if head == "policy":
        return _policy_defaults()[rest]
    value = importlib.import_module(f"balcaprl.synthetic.{head}")
    for part in rest.split("."):
        try:
            value = getattr(value, part)
        except AttributeError:
            raise KeyError(f"{key}: balcaprl.synthetic.{head} has no {rest}") from None
    return value


def _shown(value: Any) -> str:
    if value is None:
        return "null"
    if callable(value) and not isinstance(value, type):
        return "(a rule of the code)"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, dict) and len(value) > 4:
        return f"{len(value)} entries"
    if isinstance(value, dict):
        return ", ".join(f"{k} {_shown(v)}" for k, v in value.items())
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        return f"{len(value)}: " + ", ".join(value) if len(value) > 4 else ", ".join(value)
    if isinstance(value, list | tuple):
        return "(" + ", ".join(_shown(v) for v in value) + ")"
    if isinstance(value, float):
        return f"{value:g}"
    if hasattr(value, "__dataclass_fields__"):
        return "; ".join(f"{f.name} {_shown(getattr(value, f.name))}" for f in fields(value) if f.name not in
                         ("kinds", "colors")) + "; every kind and colour"  # fmt: skip
    return str(value)


def parameter_table() -> str:
    """The Markdown table docs/synthetic-world.md holds: each parameter, its value read from the code,
    its provenance and the pre-flight table over a range of it."""
    config = _config_defaults()
    lines = ["| parameter | value | source | why | pre-flight table |", "| --- | --- | --- | --- | --- |"]
    for entry in WORLD_PARAMETERS:
        keys = "<br>".join(f"`{k}`" for k in entry.keys)
        values = "<br>".join(_shown(parameter_value(k, config)) for k in entry.keys)
        table = f"[{entry.table}](#{entry.table.replace(' ', '-')})" if entry.table else ""
        lines.append(f"| {keys} | {values} | {entry.source} | {entry.why} | {table} |")
    return "\n".join(lines) + "\n"


_BLOCK = re.compile(r"(?P<open><!-- parameters:world -->\n).*?(?P<close><!-- /parameters -->)", re.S)


def with_parameter_table(text: str) -> str:
    """``text`` (docs/synthetic-world.md) with its ``<!-- parameters:world -->`` block rewritten from
    the code; a text without the block is an error."""
    if not _BLOCK.search(text):
        raise ValueError(
            "no <!-- parameters:world --> ... <!-- /parameters --> block to write the table into"
        )
    return _BLOCK.sub(lambda m: m.group("open") + parameter_table() + m.group("close"), text)
