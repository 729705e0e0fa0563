"""The demo's settings: a small synthetic world, the SFT warm start, held-out evaluation, the judge
transport, and the RL recipe (a normal ``balcaprl train`` recipe minus the three paths the demo fills).

``configs/demo.yaml`` spells out exactly these defaults (a test keeps the two equal), so a user can
copy it, change a line and run ``balcaprl demo --config my.yaml``; ``--set key.sub=value`` changes one
value from the command line (``--set recipe.train.learning_rate=1e-4``).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from balcaprl.config import Recipe, RecipeError, apply_overrides, deep_merge, recipe_from_dict
from balcaprl.errors import ConfigError
from balcaprl.synthetic.lexicon import COLORS, KINDS

__all__ = [
    "DEFAULT_RECIPE",
    "DemoConfig",
    "DemoConfigError",
    "load_demo_config",
]


class DemoConfigError(ConfigError):
    """A demo config that cannot be used; the message names the key."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DatasetSettings(_Section):
    """``balcaprl synthetic build`` arguments: a small corner of the world. Two or three shapes per
    scene keep references near 50 tokens (2..7 shapes give ~90); four kinds x four colours, no words
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


class PolicySettings(_Section):
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


class SFTSettings(_Section):
    """``balcaprl synthetic sft`` settings (``balcaprl.synthetic.sft.SFTConfig``); stopped early on
    purpose, so RL starts from a policy that still makes mistakes."""

    steps: int = Field(2000, ge=1, description="~6 minutes on one idle core.")
    batch_size: int = Field(32, ge=1)
    lr: float = Field(5e-4, gt=0)
    vision_lr_scale: float = Field(
        5.0, gt=0, description="The vision tower and projector train at lr x this (faster to see)."
    )
    warmup_steps: int = Field(20, ge=0)
    flawed_fraction: float = Field(
        0.5, ge=0, le=1, description="Share of flawed SFT targets: the mistakes RL is there to remove."
    )
    seed: int = 0


class EvaluationSettings(_Section):
    scenes: int = Field(1000, ge=1, description="Held-out scenes captioned before and after RL.")
    max_new_tokens: int = Field(96, ge=1, description="Caption cap (references are <= ~90 tokens).")
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


class JudgeSettings(_Section):
    transport: Literal["http", "in-process"] = Field(
        "http",
        description="http: the real OpenAI-compatible judge client against `serve-judge --oracle` on "
        "127.0.0.1 (started in this process); in-process: call the oracle directly (faster, no HTTP).",
    )
    concurrency: int = Field(64, ge=1, description="Judge calls in flight (http).")


# The RL recipe without model.path / data.path / run.output_dir (the demo fills those in).
DEFAULT_RECIPE: dict[str, Any] = {
    "name": "demo",
    "description": "balcaprl demo: c-GDPO on the synthetic world with the oracle judge, 2 CPU cores.",
    "rewards": {
        "weights": {"precision": 0.3, "recall": 0.3, "linguistic": 0.3},  # Table 3's "Full"
        "pointability": True,
        "length": {"mode": "mask", "tau_low": 0.5, "tau_high": 2.0},
    },
    "advantage": {"estimator": "c_gdpo"},
    "rollout": {"rollouts_per_prompt": 8, "max_caption_tokens": 96, "temperature": 0.7},
    "train": {
        "prompts_per_batch": 8,
        "per_device_batch_size": 32,
        "learning_rate": 5e-5,
        "lr_scheduler": "cosine",
        "warmup": 10,
        "max_steps": 350,
        "precision": "fp32",
        "use_cpu": True,
        "seed": 0,
    },
    "run": {"save_steps": 100, "save_total_limit": 2, "log_rollouts_every": 50},
}


class DemoConfig(_Section):
    output_dir: str = Field("runs/demo", min_length=1, description="The run folder (resumable).")
    threads: int = Field(
        1,
        ge=1,
        description="torch intra-op threads. 1 is the fastest for this tiny model: its matrix products are "
        "too small to split, and with 2 threads every op waits on the second core, which cost up to 40x "
        "whenever another process was busy on it (measured on a 2-core machine).",
    )
    dataset: DatasetSettings = Field(default_factory=DatasetSettings)
    policy: PolicySettings = Field(default_factory=PolicySettings)
    sft: SFTSettings = Field(default_factory=SFTSettings)
    evaluation: EvaluationSettings = Field(default_factory=EvaluationSettings)
    judge: JudgeSettings = Field(default_factory=JudgeSettings)
    recipe: dict[str, Any] = Field(default_factory=lambda: copy.deepcopy(DEFAULT_RECIPE))

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
        for key in ("model", "data"):
            if key in self.recipe:
                raise ValueError(
                    f"recipe.{key} is set by the demo (the SFT policy and the dataset); remove it"
                )
        if "output_dir" in (self.recipe.get("run") or {}):
            raise ValueError("recipe.run.output_dir is set by the demo (OUTPUT/rl/VARIANT); remove it")
        self.training_recipe("policy", "data", "out")  # validate the recipe now, not after SFT
        return self

    def evaluation_temperature(self) -> float:
        """The held-out captions' sampling temperature: the evaluation's own, else the rollouts'."""
        if self.evaluation.temperature is not None:
            return self.evaluation.temperature
        return float(self.recipe.get("rollout", {}).get("temperature", 1.0))

    def training_recipe(
        self, policy: str | Path, data: str | Path, output_dir: str | Path, overrides: Iterable[str] = ()
    ) -> Recipe:
        """The ``balcaprl train`` recipe of one RL run (a variant's overrides applied last)."""
        data_dict = copy.deepcopy(self.recipe)
        data_dict["model"] = {"path": str(policy)}
        data_dict["data"] = {"path": str(data)}
        data_dict.setdefault("run", {})["output_dir"] = str(output_dir)
        try:
            return recipe_from_dict(data_dict, overrides, source="the demo's RL recipe")
        except RecipeError as error:  # name keys as they are written in the demo config
            lines = str(error).splitlines()
            raise RecipeError(
                "\n".join(
                    [lines[0]]
                    + [f"  recipe.{line.strip()}" if line.startswith("  ") else line for line in lines[1:]]
                )
            ) from None

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


def load_demo_config(path: Path | str | None = None, overrides: Iterable[str] = ()) -> DemoConfig:
    """The built-in defaults, changed by a YAML file (which may hold only what it changes) and then by
    ``key.sub=value`` overrides."""
    data: dict[str, Any] = {}
    source = "built-in demo defaults"
    if path is not None:
        source = str(path)
        try:
            loaded = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise DemoConfigError(f"demo config not found: {path}") from None
        except yaml.YAMLError as error:
            raise DemoConfigError(f"{path} is not valid YAML: {error}") from None
        if not isinstance(loaded, dict):
            raise DemoConfigError(f"{path} must hold a mapping at the top level")
        data = loaded
    try:
        data = apply_overrides(deep_merge(DemoConfig().model_dump(mode="json"), data), overrides)
        return DemoConfig.model_validate(data)
    except RecipeError as error:
        raise DemoConfigError(f"{source}: {error}") from None
    except ValidationError as error:
        problems = []
        for item in error.errors():
            where = ".".join(str(p) for p in item["loc"])
            message = item["msg"].removeprefix("Value error, ")
            if item["type"] == "extra_forbidden":
                message = "unknown key"
            problems.append(f"  {where}: {message}" if where else f"  {message}")
        raise DemoConfigError(f"invalid demo config ({source}):\n" + "\n".join(problems)) from None
