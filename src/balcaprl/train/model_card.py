"""The model card (``README.md``) of a trained policy: the base model, the recipe, how to load it.

TRL writes a generic card into the run folder at every checkpoint ("a fine-tuned version of [None]":
it finds no hub id in a local checkpoint's config and knows nothing of the recipe). balcaprl writes
its own card over it (:class:`ModelCardCallback`, after every save) and next to the final policy
(``OUTPUT/final/README.md``), from the recipe, the one source of what the run did.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from balcaprl.files import atomic_write_text
from balcaprl.recipe import Recipe

CARD_FILE = "README.md"
PAPER = "BalCapRL: A Balanced Framework for RL-Based MLLM Image Captioning"


def _is_hub_id(path: str) -> bool:
    """``org/name`` that is not a folder on this machine: what the hub's ``base_model`` field takes."""
    return (
        not Path(path).expanduser().exists() and path.count("/") == 1 and not path.startswith((".", "/", "~"))
    )


def _recipe_rows(recipe: Recipe, global_step: int | None) -> list[tuple[str, Any]]:
    t, r, w, length = recipe.train, recipe.rollout, recipe.rewards.weights, recipe.rewards.length
    band = f"[{length.tau_low:g}, {length.tau_high:g}]" if length.mode != "none" else "-"
    judge = getattr(recipe.judge, "model", None)
    steps = f"{global_step} of {t.max_steps}" if global_step is not None and t.max_steps else global_step
    return [
        ("advantage estimator", recipe.advantage.estimator),
        (
            "reward weights (precision / recall / linguistic)",
            f"{w.precision:g} / {w.recall:g} / {w.linguistic:g}",
        ),
        ("length control", f"{length.mode}, rho band {band}"),
        ("rollouts per prompt", r.rollouts_per_prompt),
        ("prompts per batch", t.prompts_per_batch),
        ("learning rate, schedule", f"{t.learning_rate:g}, {t.lr_scheduler}"),
        ("optimizer steps", steps if steps is not None else t.max_steps),
        (
            "loss",
            f"{t.loss_aggregation}, clip {t.clip_epsilon:g}, dual-clip {t.dual_clip_c}, KL {t.kl_beta:g}",
        ),
        ("weights trained", "LoRA adapters" if recipe.model.lora is not None else "all (full fine-tuning)"),
        ("training data", recipe.data.path),
        ("judge model", judge if judge is not None else "(a judge passed in code)"),
        ("seed", t.seed),
    ]


def model_card(recipe: Recipe, global_step: int | None = None, where: str = "PATH") -> str:
    """The card's text; ``where`` is the folder shown in the loading example."""
    base = recipe.model.path
    header = ["---", "library_name: transformers", "pipeline_tag: image-text-to-text"]
    if _is_hub_id(base):
        header.append(f"base_model: {base}")
    header += ["tags:", "- balcaprl", "- c-gdpo", "- image-captioning", "- reinforcement-learning", "---", ""]
    name = recipe.name or Path(recipe.run.output_dir).name
    lines = [
        f"# {name}",
        "",
        f"An image captioner: `{base}` trained with reinforcement learning by balcaprl, the implementation of",
        f'"{PAPER}" (c-GDPO: precision, recall and linguistic rewards from an LLM judge, each normalised in',
        "its group before they are weighted, with the length mask on the linguistic reward).",
        "",
        "## Recipe",
        "",
        "| setting | value |",
        "|---------|-------|",
        *(f"| {key} | {value} |" for key, value in _recipe_rows(recipe, global_step)),
        "",
        "The whole recipe is `recipe.yaml` in the run folder.",
        "",
        "## How to load",
        "",
    ]
    if recipe.model.lora is None:
        lines += [
            "```python",
            "from transformers import AutoModelForImageTextToText, AutoProcessor",
            "",
            f'model = AutoModelForImageTextToText.from_pretrained("{where}")',
            f'processor = AutoProcessor.from_pretrained("{where}")',
            "```",
        ]
    else:
        lines += [
            "The folder holds LoRA adapters over the base model:",
            "",
            "```python",
            "from peft import PeftModel",
            "from transformers import AutoModelForImageTextToText, AutoProcessor",
            "",
            f'base = AutoModelForImageTextToText.from_pretrained("{base}")',
            f'model = PeftModel.from_pretrained(base, "{where}")',
            f'processor = AutoProcessor.from_pretrained("{where}")',
            "```",
        ]
    lines += [
        "",
        "Or caption a folder of images with balcaprl:",
        "",
        "```bash",
        f"balcaprl caption --model {where} --images IMAGES --out captions.jsonl",
        "```",
        "",
    ]
    return "\n".join(header + lines)


def write_model_card(folder: Path | str, recipe: Recipe, global_step: int | None = None) -> Path:
    """Write ``folder/README.md`` (atomically, over TRL's generic card if one is there)."""
    path = Path(folder) / CARD_FILE
    atomic_write_text(path, model_card(recipe, global_step, where=str(folder)))
    return path


class ModelCardCallback(TrainerCallback):
    """After every save: balcaprl's card in the checkpoint and over TRL's in the run folder."""

    def __init__(self, recipe: Recipe) -> None:
        self.recipe = recipe

    def on_save(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        write_model_card(args.output_dir, self.recipe, state.global_step)
        checkpoint = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if checkpoint.is_dir():
            write_model_card(checkpoint, self.recipe, state.global_step)
