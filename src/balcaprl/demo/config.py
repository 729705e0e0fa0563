"""The demo's settings: a small synthetic world, the SFT warm start, held-out evaluation, the judge
transport, and the RL recipe (a ``balcaprl train`` recipe less what the demo fills in: the policy, the
dataset, the run folder and the judge).

Every default is declared here, once: the RL recipe's in :func:`demo_recipe` as the few settings in
which the demo departs from the paper's recipe (everything else is the paper's default, declared with
the recipe schema). Each says where it comes from: the paper, a derivation (e.g. the caption cap from
tau_u and the references' length), or a tuning round ("tuned": picked by comparing demo runs on the
held-out rise, so the rise it shows is not an independent measurement of that value), or that it is
free (no paper statement fixes it). A config file holds only what it changes (``configs/demo.yaml`` is a short
example); ``--set key.sub=value`` changes one value from the command line
(``--set recipe.train.learning_rate=1e-4``). Loaded with the common machinery
(:func:`balcaprl.config.load_config`): one error type, keys named by their dotted paths.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import ConfigDict, Field, model_validator

from balcaprl.config import Override, Section, apply_overrides, load_config, section_without, validate_config
from balcaprl.errors import ConfigError
from balcaprl.recipe import (
    AdvantageConfig,
    Recipe,
    RecipeRewards,
    RolloutConfig,
    RunConfig,
    TrainConfig,
)
from balcaprl.rewards import RewardWeights
from balcaprl.synthetic.lexicon import COLORS, KINDS
from balcaprl.synthetic.sft_config import SFTConfig


class _Frozen(Section):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DatasetSettings(_Frozen):
    """``balcaprl synthetic build`` arguments: a small corner of the world, tuned (picked by what a tiny
    policy learns to see, not by the paper). Two or three shapes per scene (references of ~85 tokens in
    world version 3); four kinds x four colours, no words
    and plain backgrounds let a 0.6 M-parameter policy learn to see in a few minutes of SFT (with all
    8 x 8, words and textures it still named one colour and kind for every shape after 1,500 steps,
    so RL could only trade recall for precision). The oracle still knows every word of the world."""

    n_train: int = Field(2000, ge=1, description="Training scenes (RL prompts and SFT targets).")
    n_eval: int = Field(1000, ge=1, description="Held-out scenes (the before/after evaluation).")
    seed: int = 0
    min_objects: int = Field(2, ge=1, le=9)
    max_objects: int = Field(3, ge=1, le=9)
    text_probability: float = Field(
        0.0, ge=0, le=1, description="Chance a medium/large shape carries a word."
    )
    texture_probability: float = Field(
        0.0, ge=0, le=1, description="Chance of a striped/dotted/checkered background."
    )
    image_size: int = Field(224, ge=24, description="Rendered side in pixels (the policy resizes to 84).")
    kinds: tuple[str, ...] = Field(
        ("circle", "square", "triangle", "star"), description=f"Shape kinds drawn, from {', '.join(KINDS)}."
    )
    colors: tuple[str, ...] = Field(
        ("red", "green", "blue", "yellow"), description=f"Colours drawn, from {', '.join(COLORS)}."
    )

    @model_validator(mode="after")
    def _valid_world(self) -> DatasetSettings:
        self.scene_spec()  # SceneSpec's own checks: known words, enough (kind, colour) pairs
        return self

    def scene_spec(self):  # -> SceneSpec
        from balcaprl.synthetic.scenes import SceneSpec

        return SceneSpec(
            min_objects=self.min_objects,
            max_objects=self.max_objects,
            text_probability=self.text_probability,
            texture_probability=self.texture_probability,
            kinds=self.kinds,
            colors=self.colors,
        )


class PolicySettings(_Frozen):
    """Architecture of the tiny policy: ``balcaprl.synthetic.policy.PolicySpec`` fields to change
    (empty: the synthetic world's default policy)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    @model_validator(mode="after")
    def _known_fields(self) -> PolicySettings:
        from dataclasses import fields

        from balcaprl.synthetic.policy import PolicySpec

        known = {f.name for f in fields(PolicySpec)}
        unknown = sorted(set(self.model_extra or {}) - known)
        if unknown:
            raise ValueError(f"unknown policy field(s) {unknown}; PolicySpec has {sorted(known)}")
        PolicySpec(**(self.model_extra or {}))  # its own checks (e.g. image_size % patch_size)
        return self


_SFT = SFTConfig()  # the defaults live there, one copy for the demo, the command and the library


class SFTSettings(_Frozen):
    """``balcaprl synthetic sft`` settings (``balcaprl.synthetic.sft.SFTConfig``, whose defaults these
    are); stopped early on purpose, so RL starts from a policy that still makes mistakes."""

    steps: int = Field(
        _SFT.steps,
        ge=1,
        description="Tuned: held-out b-CapScore 37 after 800, 41.3 after 1,500, 42.5 after 2,000 "
        "steps (an earlier world); about 5.5 minutes on one idle core.",
    )
    batch_size: int = Field(_SFT.batch_size, ge=1)
    lr: float = Field(_SFT.lr, gt=0)
    vision_lr_scale: float = Field(
        _SFT.vision_lr_scale,
        gt=0,
        description="Tuned: the vision tower and projector train at lr x this (faster to see; "
        "at 1 one run named colours right more often but agreed more with GRPO, docs/synthetic-world.md).",
    )
    warmup_steps: int = Field(_SFT.warmup_steps, ge=0)
    micro_batches: int = Field(
        _SFT.micro_batches,
        ge=1,
        description="Each batch runs as this many parts of similar caption length, each padded to its own "
        "longest: the same gradient as the whole padded batch, ~20% less compute.",
    )
    flawed_fraction: float = Field(
        _SFT.flawed_fraction,
        ge=0,
        le=1,
        description="Free (no paper statement fixes it): share of flawed SFT targets, the "
        "mistakes RL is there to remove; scripts/world_preflight_table.py measures the start over 0..1.",
    )
    seed: int = _SFT.seed


class EvaluationSettings(_Frozen):
    scenes: int = Field(1000, ge=1, description="Held-out scenes captioned before and after RL.")
    max_new_tokens: int = Field(
        192, ge=1, description="Caption cap: the rollouts' (room past twice the ~85-token references)."
    )
    temperature: float | None = Field(
        None,
        ge=0,
        description="Sampling temperature of the held-out captions; null: the rollout temperature (what "
        "RL optimises), 0: greedy. Sampling is seeded by `seed`.",
    )
    bootstrap_samples: int = Field(10_000, ge=100)
    level: float = Field(0.95, gt=0, lt=1, description="Confidence level of the paired bootstrap interval.")
    seed: int = 0
    show: int = Field(6, ge=0, description="Held-out scenes whose captions samples.md shows.")


class JudgeSettings(_Frozen):
    transport: Literal["http", "in-process"] = Field(
        "http",
        description="http: the real OpenAI-compatible judge client against `judge serve --oracle` on "
        "127.0.0.1 (started in this process); in-process: call the oracle directly (faster, no HTTP).",
    )
    concurrency: int = Field(64, ge=1, description="Judge calls in flight (http).")


# The recipe's run section less the run folder, which the demo sets (OUTPUT/rl/VARIANT).
DemoRunConfig = section_without(RunConfig, "output_dir", name="DemoRunConfig")

# The recipe keys the demo sets itself, and where it takes them from.
_FILLED_IN = {
    "model": "the SFT policy",
    "data": "the synthetic dataset",
    "judge": "the oracle judge; its transport is the demo config's judge.transport",
}


class DemoRecipe(_Frozen):
    """A ``balcaprl train`` recipe less what the demo fills in (model, data, run.output_dir, judge); each
    section is the recipe's own model, so it is validated exactly as a recipe is."""

    name: str | None = Field("demo", description="Short label of the RL run.")
    description: str | None = Field(
        "balcaprl demo: c-GDPO on the synthetic world with the oracle judge, 2 CPU cores.",
        description="One line on what the run is for.",
    )
    rewards: RecipeRewards = Field(default_factory=RecipeRewards, description="Rewards (Sec. 2).")
    advantage: AdvantageConfig = Field(default_factory=AdvantageConfig, description="Advantages (Sec. 2.3).")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="Caption sampling.")
    train: TrainConfig = Field(default_factory=TrainConfig, description="Optimisation.")
    run: DemoRunConfig = Field(  # type: ignore[valid-type]
        default_factory=DemoRunConfig,
        description="Checkpoints and logs (the run folder is OUTPUT/rl/VARIANT).",
    )

    @model_validator(mode="before")
    @classmethod
    def _no_filled_in_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key, what in _FILLED_IN.items():
                if key in data:
                    raise ValueError(f"{key} is set by the demo ({what}); remove it")
            if isinstance(data.get("run"), dict) and "output_dir" in data["run"]:
                raise ValueError("run.output_dir is set by the demo (OUTPUT/rl/VARIANT); remove it")
        return data

    @model_validator(mode="after")
    def _a_whole_recipe(self) -> DemoRecipe:
        # The recipe's rules across sections (e.g. save_steps vs updates_per_batch), now, not after SFT.
        try:
            self.to_recipe("policy", "data", "out", prefix="")
        except ConfigError as error:
            problems = [line.strip().removeprefix("(top level): ") for line in str(error).splitlines()[1:]]
            raise ValueError("; ".join(problems)) from None
        return self

    def to_recipe(
        self,
        policy: str | Path,
        data: str | Path,
        output_dir: str | Path,
        overrides: Iterable[Override] = (),
        prefix: str = "recipe.",
    ) -> Recipe:
        """The full recipe of one RL run: these settings, the three paths, then ``overrides``; errors name
        keys with ``prefix`` (as the demo config writes them)."""
        values = self.model_dump(mode="json")
        values["model"] = {"path": str(policy)}
        values["data"] = {"path": str(data)}
        values["run"]["output_dir"] = str(output_dir)
        merged = apply_overrides(values, overrides)
        return validate_config(Recipe, merged, "the demo's RL recipe", "recipe", prefix=prefix)


def demo_recipe() -> DemoRecipe:
    """The demo's RL recipe: the paper's recipe with the changes a tiny policy on 2 CPU cores needs."""
    return DemoRecipe(
        # Table 3's "Full" row (equal weights), which the demo's variants ablate. The main-results
        # weights (0.1 / 0.3 / 0.3) let captions grow here: recall up, precision down (docs/demo.md).
        rewards=RecipeRewards(weights=RewardWeights(precision=0.3, recall=0.3, linguistic=0.3)),
        rollout=RolloutConfig(
            # References average ~85 tokens (<= ~120): 192 leaves room past tau_u = 2 x most references,
            # so the upper side of the length mask can bind (at 128 against ~55-token ones it did).
            max_caption_tokens=192,
            temperature=0.7,  # tuned (not given by the paper): 1.0 gained a third as much in an earlier round
        ),
        train=TrainConfig(
            prompts_per_batch=8,  # x 8 rollouts = 64 captions per batch
            # Two optimizer steps per batch of rollouts: the second is off-policy, so the PPO clip and
            # dual-clip act (with one, the ratio is 1 and neither does); and half the generation.
            updates_per_batch=2,
            per_device_batch_size=32,
            learning_rate=5e-5,  # tuned: ~10x below SFT's; 1e-4 and 2e-4 moved along the precision/recall trade-off
            warmup=10,
            max_steps=200,  # tuned: 250 and 350 gave the same rise (an earlier world); 100 batches of rollouts
            precision="fp32",
            use_cpu=True,
            seed=0,
        ),
        run=DemoRunConfig(save_steps=50, save_total_limit=2, log_rollouts_every=50),
    )


class DemoConfig(_Frozen):
    """The whole demo: ``balcaprl demo --config FILE --set key.sub=value``."""

    output_dir: str = Field("runs/demo", min_length=1, description="The run folder (resumable).")
    threads: int = Field(
        1,
        ge=1,
        description="torch intra-op threads. 1 is the fastest for this tiny model: its matrix products are "
        "too small to split, and with 2 threads every op waits on the second core, which cost up to 40x "
        "whenever another process was busy on it (measured on a 2-core machine).",
    )
    dataset: DatasetSettings = Field(default_factory=DatasetSettings, description="The synthetic world.")
    policy: PolicySettings = Field(default_factory=PolicySettings, description="The tiny policy's shape.")
    sft: SFTSettings = Field(default_factory=SFTSettings, description="The SFT warm start.")
    evaluation: EvaluationSettings = Field(
        default_factory=EvaluationSettings, description="The held-out evaluation before and after RL."
    )
    judge: JudgeSettings = Field(
        default_factory=JudgeSettings, description="How the oracle judge is reached."
    )
    recipe: DemoRecipe = Field(
        default_factory=demo_recipe, description="The RL recipe (variants override it)."
    )

    @model_validator(mode="after")
    def _check(self) -> DemoConfig:
        if self.dataset.min_objects > self.dataset.max_objects:
            raise ValueError(
                f"dataset.min_objects ({self.dataset.min_objects}) exceeds max_objects ({self.dataset.max_objects})"
            )
        if self.evaluation.scenes > self.dataset.n_eval:
            raise ValueError(
                f"evaluation.scenes ({self.evaluation.scenes}) exceeds dataset.n_eval ({self.dataset.n_eval})"
            )
        return self

    def evaluation_temperature(self) -> float:
        """The held-out captions' sampling temperature: the evaluation's own, else the rollouts'."""
        if self.evaluation.temperature is not None:
            return self.evaluation.temperature
        return self.recipe.rollout.temperature

    def training_recipe(
        self, policy: str | Path, data: str | Path, output_dir: str | Path, overrides: Iterable[Override] = ()
    ) -> Recipe:
        """The ``balcaprl train`` recipe of one RL run (a variant's overrides applied last)."""
        return self.recipe.to_recipe(policy, data, output_dir, overrides)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


def load_demo_config(path: Path | str | None = None, overrides: Iterable[Override] = ()) -> DemoConfig:
    """The built-in defaults, changed by a YAML file (which holds only what it changes, and may name a
    ``base:``) and then by ``key.sub=value`` overrides."""
    return load_config(
        DemoConfig, path, overrides, defaults=DemoConfig().model_dump(mode="json"), what="demo config"
    )
