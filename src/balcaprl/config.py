"""The training recipe: a typed schema (pydantic) with defaults that reproduce the paper.

YAML in, validated objects out. A recipe file is plain YAML a user can diff; it may name one parent
with ``base: other.yaml`` (a path relative to the file) and then holds only what it changes, which is
how ``configs/ablations/`` states each ablation as a few lines. Command-line overrides are
``key.sub=value`` pairs, values parsed as YAML (``rewards.weights.precision=0``,
``run.report_to=[tensorboard]``, ``model.lora=null``).

Unknown keys and impossible values are errors that name the key (``rewards.length.tau_low``) and say
what is allowed. Defaults are the paper's (Appendix "Implementation Details"): 8 rollouts, lr 5e-6,
256 prompts per batch, cosine schedule, 1 epoch, no KL (no reference model loaded), PPO clip 0.2 with
dual-clip c = 3, token-sum-sequence-mean loss, weights 0.1 / 0.3 / 0.3, length mask tau 0.5 / 2.0.
Settings the paper does not give (caption token cap, sampling temperature, warm-up, ...) are marked
"not given by the paper" where they are declared.

The ``judge`` section is kept as given (a mapping, or the path of a judge YAML): the judge client
(``balcaprl.judge``) owns its schema (DESIGN.md, "A judge config").
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from balcaprl.errors import ConfigError

__all__ = [
    "AdvantageConfig",
    "DataConfig",
    "ImageConfig",
    "LengthControlConfig",
    "LoraSettings",
    "ModelConfig",
    "Recipe",
    "RecipeError",
    "RewardConfig",
    "RewardWeights",
    "RolloutConfig",
    "RunConfig",
    "TrainConfig",
    "VLLMConfig",
    "apply_overrides",
    "deep_merge",
    "load_recipe",
    "load_recipe_dict",
    "recipe_from_dict",
]


class RecipeError(ConfigError):
    """A recipe that cannot be used; the message names the key and says what is allowed."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)


# --------------------------------------------------------------------------------------------- model


class LoraSettings(_Section):
    """LoRA through peft. Absent (``lora: null``, the default) means full fine-tuning, as in the paper."""

    r: int = Field(16, ge=1, description="LoRA rank.")
    alpha: float = Field(32.0, gt=0, description="LoRA scaling numerator (lora_alpha).")
    dropout: float = Field(0.05, ge=0, lt=1, description="Dropout on the LoRA branch.")
    target_modules: str | list[str] = Field(
        "all-linear",
        description="peft target modules: 'all-linear' or a list of module names (never lm_head).",
    )
    modules_to_save: list[str] | None = Field(None, description="Modules trained fully next to the adapters.")

    @model_validator(mode="after")
    def _no_lm_head(self) -> LoraSettings:
        targets = [self.target_modules] if isinstance(self.target_modules, str) else self.target_modules
        if "lm_head" in targets:
            raise ValueError(
                "lm_head cannot carry a LoRA adapter: TRL computes log-probabilities from lm_head.weight directly, "
                "so the adapter would never train; remove it from target_modules"
            )
        return self


class ImageConfig(_Section):
    """Image resolution limits. Not given by the paper (it uses each model's default processing)."""

    max_side: int | None = Field(
        None,
        ge=28,
        description="Downscale images so the longest side is at most this many pixels (any model).",
    )
    min_pixels: int | None = Field(
        None, ge=1, description="Qwen2/2.5-VL processors: minimum pixels per image after resizing."
    )
    max_pixels: int | None = Field(
        None, ge=1, description="Qwen2/2.5-VL processors: maximum pixels per image (bounds image tokens)."
    )

    @model_validator(mode="after")
    def _ordered(self) -> ImageConfig:
        if self.min_pixels is not None and self.max_pixels is not None and self.min_pixels > self.max_pixels:
            raise ValueError(f"min_pixels ({self.min_pixels}) must not exceed max_pixels ({self.max_pixels})")
        return self


class ModelConfig(_Section):
    """The policy: a local folder or hub id of a multimodal chat model (Qwen2.5-VL, LLaVA-1.5, ...)."""

    path: str = Field(..., min_length=1, description="Folder or hub id of the policy checkpoint.")
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = Field(
        "float32",
        description="Dtype the weights are loaded in. float32 master weights with bf16 autocast (train.precision) "
        "is the usual full fine-tuning set-up.",
    )
    attn_implementation: str | None = Field(
        None, description="'sdpa', 'flash_attention_2', 'eager'; null lets transformers choose."
    )
    trust_remote_code: bool = Field(False, description="Allow model code shipped with the checkpoint.")
    gradient_checkpointing: bool = Field(
        False,
        description="Recompute activations in the backward pass (saves memory, ~20% slower). TRL turns it on by "
        "default; here it is a recipe choice, off for tiny models, on in the 3B/7B recipes.",
    )
    lora: LoraSettings | None = Field(None, description="LoRA adapters; null = full fine-tuning (the paper).")
    image: ImageConfig = Field(default_factory=ImageConfig)
    processor_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Extra keyword arguments for AutoProcessor.from_pretrained."
    )


# ---------------------------------------------------------------------------------------------- data


class DataConfig(_Section):
    """A dataset folder in the pinned on-disk format (DESIGN.md): train.parquet, images/, dataset.json."""

    path: str = Field(..., min_length=1, description="Dataset folder (balcaprl synthetic build / prepare).")
    reference: Literal["reference", "reference_original"] = Field(
        "reference",
        description="Which reference caption the judge compares against: the re-captioned one (the paper's main "
        "results) or the original ShareGPT4V caption (Table 3, 'w/o recap with gpt-5-mini').",
    )
    reference_tokens: Literal["auto", "dataset", "recount"] = Field(
        "auto",
        description="Reference token lengths for the length mask, always in the policy's tokenizer. auto: use the "
        "dataset's column when its card names the policy's tokenizer and it has no nulls, else recount; dataset: "
        "trust the column (error on nulls); recount: always recount with the policy tokenizer.",
    )
    max_samples: int | None = Field(
        None, ge=1, description="Use only the first N training rows (smoke runs)."
    )
    shuffle: bool = Field(True, description="Shuffle prompts (seeded by train.seed; resumable).")


# ------------------------------------------------------------------------------------------- rewards


class RewardWeights(_Section):
    """w_prec, w_rec, w_ling of eq. 2.5. Paper main results: 0.1 / 0.3 / 0.3."""

    precision: float = Field(0.1, ge=0)
    recall: float = Field(0.3, ge=0)
    linguistic: float = Field(0.3, ge=0)

    @model_validator(mode="after")
    def _some_weight(self) -> RewardWeights:
        if self.precision == self.recall == self.linguistic == 0:
            raise ValueError("at least one reward weight must be > 0")
        return self

    def as_list(self) -> list[float]:
        """In the order of ``balcaprl.rewards.REWARD_NAMES`` (precision, recall, linguistic)."""
        return [self.precision, self.recall, self.linguistic]


class LengthControlConfig(_Section):
    """Length control on rho = l_pred / l_ref, token lengths in the policy's tokenizer.

    ``mask`` (the paper, Sec. 2.3): the linguistic reward is set to 0 outside [tau_low, tau_high].
    ``linear`` (Appendix A, eqs. A.2-A.5): lambda_len * d(rho) is subtracted from the normalised advantage.
    ``none``: no length control (Table 4, 'w/o length penalty').
    """

    mode: Literal["mask", "linear", "none"] = Field("mask")
    tau_low: float = Field(0.5, ge=0, description="tau_l (inclusive).")
    tau_high: float = Field(2.0, gt=0, description="tau_u (inclusive).")
    linear_strength: float = Field(
        1.0, ge=0, description="lambda_len of eq. A.4, used by mode=linear (value not given by the paper)."
    )

    @model_validator(mode="after")
    def _ordered(self) -> LengthControlConfig:
        if self.tau_low > self.tau_high:
            raise ValueError(f"tau_low ({self.tau_low}) must not exceed tau_high ({self.tau_high})")
        return self


class RewardConfig(_Section):
    weights: RewardWeights = Field(default_factory=RewardWeights)
    pointability: bool = Field(
        True,
        description="Precision counts only assertions that are pointable and visible (eq. 2.3); false is the "
        "'w/o pointability' ablation (visible assertions count whatever their pointability).",
    )
    length: LengthControlConfig = Field(default_factory=LengthControlConfig)
    max_failed_batches_in_a_row: int = Field(
        3,
        ge=1,
        description="Stop the run when the judge failed on every rollout of this many consecutive batches "
        "(a dead endpoint should not burn GPU hours on zero-advantage steps).",
    )


class AdvantageConfig(_Section):
    estimator: Literal["c_gdpo", "grpo"] = Field(
        "c_gdpo",
        description="c_gdpo: balcaprl.c_gdpo_advantages (the paper); grpo: balcaprl.grpo_advantages, the "
        "sum-then-normalise baseline of Table 3 ('w/o c-GDPO').",
    )
    eps: float = Field(1e-6, gt=0, description="Added to every std (the pinned contract uses 1e-6).")


# ------------------------------------------------------------------------------------------- rollout


class VLLMConfig(_Section):
    """Rollouts with vLLM through TRL (``pip install balcaprl[vllm]``); off = transformers generate."""

    mode: Literal["off", "colocate", "server"] = Field("off")
    gpu_memory_utilization: float = Field(0.3, gt=0, le=1, description="colocate: GPU share vLLM may take.")
    tensor_parallel_size: int = Field(1, ge=1, description="colocate: tensor parallel size.")
    enable_sleep_mode: bool = Field(False, description="colocate: offload vLLM weights during the update.")
    max_model_length: int | None = Field(None, ge=1, description="vLLM context length (prompt + caption).")
    server_base_url: str | None = Field(
        None, description="server: e.g. http://10.0.0.5:8000 (trl vllm-serve)."
    )
    server_host: str = Field("0.0.0.0", description="server: host when no base URL is given.")
    server_port: int = Field(8000, ge=1, le=65535)
    server_timeout: float = Field(240.0, gt=0, description="server: seconds to wait for the server at start.")
    importance_sampling_correction: bool = Field(
        True, description="Correct the vLLM/trainer logprob mismatch with TRL's importance-sampling ratio."
    )

    @field_validator("mode", mode="before")
    @classmethod
    def _yaml_off(cls, value: Any) -> Any:
        return "off" if value is False else value  # YAML reads a bare `off` as false


class RolloutConfig(_Section):
    rollouts_per_prompt: int = Field(8, ge=2, description="G, captions sampled per image (paper: 8).")
    max_caption_tokens: int = Field(
        1024, ge=1, description="Cap on generated caption tokens (not given by the paper)."
    )
    temperature: float = Field(1.0, gt=0, description="Sampling temperature (not given by the paper).")
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0, description="0 disables top-k filtering.")
    repetition_penalty: float = Field(1.0, gt=0)
    vllm: VLLMConfig = Field(default_factory=VLLMConfig)


# --------------------------------------------------------------------------------------------- train


class TrainConfig(_Section):
    """Optimisation. The batch is counted in prompts, as the paper does."""

    prompts_per_batch: int = Field(
        256,
        ge=1,
        description="Prompts (images) per RL batch; x rollouts_per_prompt captions are judged per batch.",
    )
    updates_per_batch: int = Field(
        1,
        ge=1,
        description="Optimizer steps each RL batch is split into (1 = one on-policy update per batch).",
    )
    ppo_epochs: int = Field(1, ge=1, description="Passes over each RL batch (TRL num_iterations, mu).")
    per_device_batch_size: int = Field(
        8, ge=1, description="Captions per device per forward/backward micro-batch (memory knob only)."
    )
    learning_rate: float = Field(5e-6, gt=0)
    lr_scheduler: Literal["cosine", "linear", "constant", "constant_with_warmup", "cosine_with_min_lr"] = (
        "cosine"
    )
    warmup: float = Field(
        0.0, ge=0, description="Warm-up steps (>= 1) or ratio of all steps (< 1); not given by the paper."
    )
    epochs: float = Field(1.0, gt=0)
    max_steps: int | None = Field(None, ge=1, description="Cap on optimizer steps (overrides epochs).")
    clip_epsilon: float = Field(
        0.2, gt=0, lt=1, description="PPO clip epsilon (low side, and high side by default)."
    )
    clip_epsilon_high: float | None = Field(
        None, gt=0, description="Upper clip epsilon; null = clip_epsilon."
    )
    dual_clip_c: float | None = Field(
        3.0, description="Dual-clip constant c for negative advantages (Ye et al. 2020); null disables it."
    )
    kl_beta: float = Field(0.0, ge=0, description="KL coefficient; 0 loads no reference model (the paper).")
    loss_aggregation: Literal["token_sum_sequence_mean", "token_mean", "sequence_mean_token_mean"] = Field(
        "token_sum_sequence_mean",
        description="token_sum_sequence_mean: the paper (and verl's seq-mean-token-sum); token_mean: DAPO; "
        "sequence_mean_token_mean: original GRPO.",
    )
    mask_truncated_completions: bool = Field(
        False, description="Leave captions that hit the token cap out of the loss."
    )
    optimizer: str = Field("adamw_torch", description="transformers optimizer name.")
    weight_decay: float = Field(0.0, ge=0)
    max_grad_norm: float = Field(1.0, gt=0)
    precision: Literal["bf16", "fp16", "fp32"] = Field("bf16", description="Mixed precision of the update.")
    use_cpu: bool = Field(False, description="Train on CPU even if a GPU is visible (tests, the demo).")
    seed: int = Field(42, description="Seeds initialisation, sampling and the prompt order.")
    dataloader_num_workers: int = Field(0, ge=0)
    stop_after_step: int | None = Field(
        None,
        ge=1,
        description="Save a checkpoint and stop after this global step without changing the schedule (time-sliced "
        "jobs; resume later with --resume).",
    )

    @model_validator(mode="after")
    def _dual_clip_above_clip(self) -> TrainConfig:
        high = self.clip_epsilon_high if self.clip_epsilon_high is not None else self.clip_epsilon
        if self.dual_clip_c is not None and self.dual_clip_c <= 1 + high:
            raise ValueError(
                f"dual_clip_c ({self.dual_clip_c}) must exceed 1 + clip epsilon ({1 + high}); "
                "dual-clip bounds the ratio of negative-advantage tokens from above (paper: 3)"
            )
        return self


# ----------------------------------------------------------------------------------------------- run


class RunConfig(_Section):
    output_dir: str = Field(
        ..., min_length=1, description="Run folder: checkpoints, metrics.jsonl, recipe.yaml."
    )
    save_steps: int = Field(50, ge=1, description="Checkpoint every N optimizer steps.")
    save_total_limit: int | None = Field(None, ge=1, description="Keep only the newest N checkpoints.")
    save_final_model: bool = Field(True, description="Save the final policy (and processor) to OUTPUT/final.")
    report_to: list[Literal["tensorboard", "wandb", "trackio"]] = Field(
        default_factory=list, description="Extra metric sinks; metrics.jsonl is always written."
    )
    run_name: str | None = Field(None, description="Name shown in TensorBoard / W&B.")
    progress: bool = Field(True, description="Rich progress bar and a one-line summary per step.")
    log_rollouts_every: int = Field(
        0,
        ge=0,
        description="Write every rollout (caption, rewards, advantage) of every Nth step to rollouts.jsonl.",
    )


# -------------------------------------------------------------------------------------------- recipe


class Recipe(_Section):
    """A whole training run. ``judge`` is passed to the judge client as given."""

    name: str | None = Field(None, description="Short label (ablation row, model).")
    description: str | None = None
    model: ModelConfig
    data: DataConfig
    rewards: RewardConfig = Field(default_factory=RewardConfig)
    advantage: AdvantageConfig = Field(default_factory=AdvantageConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    run: RunConfig
    judge: dict[str, Any] | str | None = Field(
        None,
        description="Judge config (DESIGN.md keys) or the path of a judge YAML; null = pass a Judge in code.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> Recipe:
        if self.run.save_steps % (self.train.updates_per_batch * self.train.ppo_epochs):
            raise ValueError(
                f"run.save_steps ({self.run.save_steps}) must be a multiple of train.updates_per_batch x "
                f"train.ppo_epochs ({self.train.updates_per_batch * self.train.ppo_epochs}) so every checkpoint "
                "falls between two RL batches and --resume continues exactly"
            )
        if self.rollout.vllm.mode != "off" and self.train.use_cpu:
            raise ValueError("rollout.vllm.mode needs a GPU; it cannot be combined with train.use_cpu=true")
        return self

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False, allow_unicode=True)


# ------------------------------------------------------------------------------------------- loading


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RecipeError(f"recipe file not found: {path}") from None
    except yaml.YAMLError as err:
        raise RecipeError(f"{path} is not valid YAML: {err}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise RecipeError(f"{path} must hold a mapping at the top level, got {type(data).__name__}")
    return data


def deep_merge(parent: Mapping[str, Any], child: Mapping[str, Any]) -> dict[str, Any]:
    """Child wins; mappings merge key by key; anything else (lists included) is replaced whole."""
    merged = copy.deepcopy(dict(parent))
    for key, value in child.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def load_recipe_dict(path: str | Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """Read a recipe file into a plain dict, resolving its ``base:`` chain (no validation yet)."""
    path = Path(path).expanduser().resolve()
    if path in _seen:
        chain = " -> ".join(str(p) for p in (*_seen, path))
        raise RecipeError(f"recipe base chain loops: {chain}")
    data = _read_yaml(path)
    base = data.pop("base", None)
    if base is None:
        return data
    if not isinstance(base, str):
        raise RecipeError(f"{path}: base must be a path (relative to this file), got {base!r}")
    parent = load_recipe_dict(path.parent / base, (*_seen, path))
    return deep_merge(parent, data)


def _parse_override(item: str) -> tuple[list[str], Any]:
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise RecipeError(
            f"override {item!r} must look like key.sub=value (e.g. rewards.weights.precision=0)"
        )
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as err:
        raise RecipeError(f"override {item!r}: the value is not valid YAML ({err})") from None
    return key.split("."), value


def apply_overrides(data: Mapping[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Apply ``key.sub=value`` overrides to a recipe dict; unknown keys are caught by validation."""
    result = copy.deepcopy(dict(data))
    for item in overrides:
        parts, value = _parse_override(item)
        node = result
        for depth, part in enumerate(parts[:-1]):
            child = node.get(part)
            if not isinstance(child, dict):
                if child is not None and part in node:
                    where = ".".join(parts[: depth + 1])
                    raise RecipeError(f"override {item!r}: {where} is a value ({child!r}), not a section")
                child = {}
                node[part] = child
            node = child
        node[parts[-1]] = value
    return result


def _allowed_keys(loc: Sequence[Any]) -> list[str]:
    model: Any = Recipe
    for part in loc:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        if field is None:
            return []
        annotation = field.annotation
        candidates = [annotation, *getattr(annotation, "__args__", ())]
        model = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if model is None:
            return []
    return sorted(model.model_fields)


def _format_validation_error(err: ValidationError, source: str) -> str:
    lines = [f"invalid recipe ({source}):"]
    for problem in err.errors():
        loc = [p for p in problem["loc"] if not (isinstance(p, str) and p.startswith("function-"))]
        key = ".".join(str(p) for p in loc) or "(top level)"
        if problem["type"] == "extra_forbidden":
            allowed = _allowed_keys(loc[:-1])
            hint = f"; allowed here: {', '.join(allowed)}" if allowed else ""
            lines.append(f"  {key}: unknown key{hint}")
        elif problem["type"] == "missing":
            lines.append(f"  {key}: required, but missing")
        else:
            message = problem["msg"].removeprefix("Value error, ")
            lines.append(f"  {key}: {message} (got {problem.get('input')!r})")
    return "\n".join(lines)


def recipe_from_dict(
    data: Mapping[str, Any], overrides: Iterable[str] = (), source: str = "<dict>"
) -> Recipe:
    """Validate a recipe dict (after ``key.sub=value`` overrides); raises :class:`RecipeError`."""
    if "base" in data:
        raise RecipeError(f"{source}: 'base' is only understood in recipe files (use load_recipe)")
    merged = apply_overrides(data, overrides)
    try:
        return Recipe.model_validate(merged)
    except ValidationError as err:
        raise RecipeError(_format_validation_error(err, source)) from None


def load_recipe(path: str | Path, overrides: Iterable[str] = ()) -> Recipe:
    """Read, merge (``base:``), override and validate a recipe file."""
    return recipe_from_dict(load_recipe_dict(path), overrides, source=str(path))
