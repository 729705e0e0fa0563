"""The training recipe: a typed schema (pydantic), its defaults, and where every default comes from.

YAML in, validated objects out, through the common config machinery (:mod:`balcaprl.config`): a
recipe file may name one parent with ``base: other.yaml`` and then hold only what it changes (how
``configs/ablations/`` states each ablation in a few lines); command-line overrides are
``key.sub=value`` pairs with YAML values (``rewards.weights.precision=0``, ``model.lora=null``).

Unknown keys and impossible values are errors that name the key (``rewards.length.tau_low``) and say
what is allowed. The paper recipe is ``configs/qwen2_5_vl_3b.yaml`` over these defaults. Where each of
its values comes from is declared once, in :data:`PROVENANCE`: the paper (with its section), an
inference (with the reason), a library's default (which one), or balcaprl's own choice (why).
``docs/recipes.md`` is generated from it (``python scripts/render_recipe_docs.py``; a test keeps it
current). In short: 8 rollouts, lr 5e-6, 256 prompts per batch, cosine schedule, 1 epoch, no KL,
dual-clip, token-sum-sequence-mean loss, weights 0.1 / 0.3 / 0.3 and length mask tau 0.5 / 2.0 are the
paper's (Appendix A.1); PPO clip eps = 0.2 and dual-clip c = 3 are verl's defaults (the paper names
dual-clip but gives no values); 4 optimizer updates per generation batch are an inference.

The ``judge`` section is a :class:`balcaprl.judge.JudgeConfig`, written inline or as the path of a judge
YAML (relative to the recipe file that names it); either way it is validated when the recipe loads, so
a typo there fails before a model is loaded. Every input a recipe file names is relative to that file:
``judge:``, ``data.path`` and a local ``model.path`` (:func:`_resolve_paths`); command-line overrides
and ``run.output_dir`` are relative to the current folder.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, field_validator, model_validator

from balcaprl.config import Override, Section, load_config, read_config_file
from balcaprl.judge.config import JudgeSection
from balcaprl.rewards.config import RewardConfig
from balcaprl.train.advantages import Estimator

# --------------------------------------------------------------------------------------------- model


class LoraSettings(Section):
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


class ImageConfig(Section):
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


class ModelConfig(Section):
    """The policy: a local folder or hub id of a multimodal chat model (Qwen2.5-VL, LLaVA-1.5, ...)."""

    path: str = Field(
        ...,
        min_length=1,
        description="Folder (relative to the recipe file) or hub id of the policy checkpoint.",
    )
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
    # Selective activation checkpointing (transformers' per-layer GradientCheckpointingLayer flag).
    layers_without_recompute: int = Field(
        0,
        ge=0,
        description="With gradient_checkpointing: the last N decoder layers of the language model keep their "
        "activations instead of recomputing them in the backward pass (less recompute, more memory); the vision "
        "tower stays checkpointed. `balcaprl train RECIPE --plan --launcher ...` names the largest N that fits.",
    )
    # Vision attention in one call per layer (balcaprl.train.vision_attention).
    vision_attention: Literal["default", "varlen_sdpa"] = Field(
        "default",
        description="Qwen2/2.5-VL vision tower: default follows attn_implementation (with sdpa transformers calls "
        "attention once per window); varlen_sdpa runs each layer's windows in one padded SDPA call (no extra "
        "package). Other models, and flash-attention implementations, keep their own.",
    )


# ---------------------------------------------------------------------------------------------- data


class DataConfig(Section):
    """A dataset folder in the pinned on-disk format: train.parquet, images/, dataset.json."""

    path: str = Field(
        ...,
        min_length=1,
        description="Dataset folder, relative to the recipe file (balcaprl synthetic build / prepare).",
    )
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


class RecipeRewards(RewardConfig):
    """The reward configuration (:class:`balcaprl.rewards.RewardConfig`) and the run's judge-failure guard."""

    max_failed_batches_in_a_row: int = Field(
        3,
        ge=1,
        description="Stop the run when the judge failed on every rollout of this many consecutive batches "
        "(a dead endpoint should not burn GPU hours on zero-advantage steps).",
    )

    def reward_config(self) -> RewardConfig:
        """The scoring settings alone (what the reward functions receive)."""
        return RewardConfig.model_validate(self.model_dump(include=set(RewardConfig.model_fields)))


class AdvantageConfig(Section):
    estimator: Estimator = Field(
        "c_gdpo",
        description="c_gdpo: balcaprl.c_gdpo_advantages (the paper); grpo: balcaprl.grpo_advantages, the "
        "sum-then-normalise baseline of Table 3 ('w/o c-GDPO').",
    )
    eps: float = Field(1e-6, gt=0, description="Added to every std (the pinned contract uses 1e-6).")


# ------------------------------------------------------------------------------------------- rollout


# The GPU share the rollout engine takes when the recipe leaves rollout.vllm.gpu_memory_utilization null.
# An engine that stays resident next to the training state: TRL's default, 0.3. An engine that sleeps
# during the update (verl always: free_cache_engine; TRL with enable_sleep_mode): 0.6, verl's Qwen2.5-VL
# GRPO example's value; the KV cache can then take what the update needs at another time
# (balcaprl train --plan shows both phases).
RESIDENT_ENGINE_SHARE = 0.3
SLEEPING_ENGINE_SHARE = 0.6


class VLLMConfig(Section):
    """Rollouts with vLLM (``pip install balcaprl[vllm]``): TRL's colocated engine or server, and verl's
    engines; off = transformers generate (TRL only)."""

    mode: Literal["off", "colocate", "server"] = Field(
        "off",
        description="off: transformers generate; colocate: vLLM on the training GPUs; server: trl vllm-serve.",
    )
    gpu_memory_utilization: float | None = Field(
        None,
        gt=0,
        le=1,
        description="Share of each GPU's memory the vLLM engine takes (weights + KV cache). null: 0.6 when the "
        "engine sleeps during the update (verl; TRL with enable_sleep_mode), else TRL's 0.3.",
    )
    tensor_parallel_size: int = Field(1, ge=1, description="colocate: tensor parallel size.")
    enable_sleep_mode: bool = Field(
        False,
        description="colocate: free the engine's weights and KV cache during the update (as verl does).",
    )
    max_model_length: int | None = Field(None, ge=1, description="vLLM context length (prompt + caption).")
    server_base_url: str | None = Field(
        None, description="server: e.g. http://10.0.0.5:8000 (trl vllm-serve)."
    )
    server_host: str = Field("0.0.0.0", description="server: host when no base URL is given.")
    server_port: int = Field(8000, ge=1, le=65535)
    server_timeout: float = Field(240.0, gt=0, description="server: seconds to wait for the server at start.")
    importance_sampling_correction: bool = Field(
        False,
        description="Weight each caption's loss by TRL's importance-sampling ratio of trainer to vLLM "
        "probabilities (a term eq. 2.7 does not have; TRL's default is on).",
    )

    @field_validator("mode", mode="before")
    @classmethod
    def _yaml_off(cls, value: Any) -> Any:
        return "off" if value is False else value  # YAML reads a bare `off` as false

    def sleeps(self, backend: Literal["trl", "verl"]) -> bool:
        """Whether the engine frees its memory during the update (verl always; TRL with sleep mode)."""
        return backend == "verl" or self.enable_sleep_mode

    def memory_share(self, backend: Literal["trl", "verl"]) -> float:
        """The engine's GPU memory share on ``backend``: the recipe's, else 0.6 for an engine that sleeps
        during the update and 0.3 for one that stays resident."""
        if self.gpu_memory_utilization is not None:
            return self.gpu_memory_utilization
        return SLEEPING_ENGINE_SHARE if self.sleeps(backend) else RESIDENT_ENGINE_SHARE


class RolloutConfig(Section):
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


class TrainConfig(Section):
    """Optimisation. The batch is counted in prompts, as the paper does."""

    prompts_per_batch: int = Field(
        256,
        ge=1,
        description="Prompts (images) per RL batch; x rollouts_per_prompt captions are judged per batch.",
    )
    updates_per_batch: int = Field(
        1,
        ge=1,
        description="Optimizer steps each RL batch is split into (mini-batches). 1 = one on-policy update, where "
        "the importance ratio is 1 and neither clip binds; the GPU recipes use 4 (docs/recipes.md).",
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
        0.0,
        ge=0,
        description="Warm-up optimizer steps (>= 1) or ratio of all steps (< 1); not given by the paper.",
    )
    epochs: float = Field(1.0, gt=0)
    max_steps: int | None = Field(
        None,
        ge=1,
        description="Cap on optimizer steps (overrides epochs); verl counts batches, the renderer divides by "
        "updates_per_batch x ppo_epochs.",
    )
    clip_epsilon: float = Field(
        0.2, gt=0, lt=1, description="PPO clip epsilon (low side, and high side by default); verl's default."
    )
    clip_epsilon_high: float | None = Field(
        None, gt=0, description="Upper clip epsilon; null = clip_epsilon."
    )
    dual_clip_c: float | None = Field(
        3.0,
        description="Dual-clip constant c for negative advantages (Ye et al. 2020; verl's default); null disables it.",
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
    # TRL pass-through (issue 27): GRPOConfig settings the recipe does not name
    trl_overrides: dict[str, Any] = Field(
        default_factory=dict,
        description="GRPOConfig fields the recipe does not name, passed to TRL as given (e.g. "
        "{logging_first_step: true}); an unknown field, or one the recipe sets itself, is refused.",
    )

    # Padding-free micro-batches (balcaprl.train.packing).
    padding_free: bool = Field(
        False,
        description="TRL: run the policy's log-prob passes on packed rows (each micro-batch's real tokens in one "
        "row, per-sample positions) instead of the padded width; Qwen2/2.5-VL only, same results. The language "
        "model's sdpa attention becomes a variable-length one for packed rows (no dense mask).",
    )

    @property
    def steps_per_batch(self) -> int:
        """Optimizer steps one RL batch feeds: the unit conversion between the recipe's step counts
        (``max_steps``, ``warmup``, ``run.save_steps``: optimizer steps, TRL's global step) and verl's
        (batches)."""
        return self.updates_per_batch * self.ppo_epochs

    # -- judging overlapped with generation (issue 24, judge-speed) --
    judge_overlap: Literal["per_rollout", "batch", "off"] = Field(
        "per_rollout",
        description="TRL: per_rollout judges each rollout as colocated vLLM finishes it (elsewhere as batch); "
        "batch starts the batch's judge calls as soon as its captions exist, before the old-log-prob forward; "
        "off judges after it, as TRL does. Same calls, same rewards (docs/judge.md).",
    )

    @field_validator("judge_overlap", mode="before")
    @classmethod
    def _overlap_from_bool(cls, value: Any) -> Any:
        """The former boolean: true was overlap on (now the best schedule the engine allows), false off."""
        return {True: "per_rollout", False: "off"}.get(value, value) if isinstance(value, bool) else value

    @model_validator(mode="after")
    def _dual_clip_above_clip(self) -> TrainConfig:
        high = self.clip_epsilon_high if self.clip_epsilon_high is not None else self.clip_epsilon
        if self.dual_clip_c is not None and self.dual_clip_c <= 1 + high:
            raise ValueError(
                f"dual_clip_c ({self.dual_clip_c}) must exceed 1 + clip epsilon ({1 + high}); "
                "dual-clip bounds the ratio of negative-advantage tokens from above (verl's default: 3)"
            )
        return self


# ----------------------------------------------------------------------------------------------- run


class RunConfig(Section):
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
        100,
        ge=0,
        description="Write every rollout (caption, rewards, advantage) of the first and every Nth step to "
        "rollouts.jsonl (0: none).",
    )


# -------------------------------------------------------------------------------------------- recipe


class Recipe(Section):
    """A whole training run."""

    name: str | None = Field(None, description="Short label (ablation row, model).")
    description: str | None = Field(None, description="One line on what the run is for.")
    model: ModelConfig = Field(description="The policy.")
    data: DataConfig = Field(description="The training dataset.")
    rewards: RecipeRewards = Field(default_factory=RecipeRewards, description="Rewards (Sec. 2).")
    advantage: AdvantageConfig = Field(default_factory=AdvantageConfig, description="Advantages (Sec. 2.3).")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="Caption sampling.")
    train: TrainConfig = Field(default_factory=TrainConfig, description="Optimisation.")
    run: RunConfig = Field(description="The run folder, checkpoints and logs.")
    judge: JudgeSection | None = Field(
        None,
        description="The judge client's config, inline or the path of a judge YAML (relative to the recipe "
        "file); null = pass a Judge in code.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> Recipe:
        per_batch = self.train.steps_per_batch
        if self.run.save_steps % per_batch:
            raise ValueError(
                f"run.save_steps ({self.run.save_steps}) must be a multiple of train.updates_per_batch x "
                f"train.ppo_epochs ({per_batch}) so every checkpoint "
                "falls between two RL batches and --resume continues exactly"
            )
        if self.train.stop_after_step is not None and self.train.stop_after_step % per_batch:
            raise ValueError(
                f"train.stop_after_step ({self.train.stop_after_step}) must be a multiple of train.updates_per_batch "
                f"x train.ppo_epochs ({per_batch}): its checkpoint must fall between two RL batches"
            )
        if self.rollout.vllm.mode != "off" and self.train.use_cpu:
            raise ValueError("rollout.vllm.mode needs a GPU; it cannot be combined with train.use_cpu=true")
        return self

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False, allow_unicode=True)


# ------------------------------------------------------------------------------------------- loading


def _resolve_paths(data: dict[str, Any], folder: Path) -> dict[str, Any]:
    """The inputs a recipe file names are relative to that file (the rule of every config file):
    ``judge:`` (a judge YAML), ``data.path``, and ``model.path`` when it names a local folder (it
    starts with ``.``, ``/`` or ``~``, has more than one ``/``, or exists next to the recipe; anything
    else is a hub id). ``key=value`` overrides on the command line stay relative to the current
    folder, as every command-line argument is; ``run.output_dir`` too (where the command is run)."""
    data = dict(data)
    if isinstance(data.get("judge"), str):
        data["judge"] = str(folder / Path(data["judge"]).expanduser())
    section = data.get("data")
    if isinstance(section, Mapping) and isinstance(section.get("path"), str):
        data["data"] = {**section, "path": str(folder / Path(section["path"]).expanduser())}
    model = data.get("model")
    if isinstance(model, Mapping) and isinstance(model.get("path"), str):
        value = model["path"]
        candidate = folder / Path(value).expanduser()
        if value.startswith((".", "/", "~")) or value.count("/") > 1 or candidate.exists():
            data["model"] = {**model, "path": str(candidate)}
    return data


def load_recipe_dict(path: str | Path) -> dict[str, Any]:
    """A recipe file as a plain dict, its ``base:`` chain merged in (no validation yet)."""
    return read_config_file(path, "recipe", _resolve_paths)


def recipe_from_dict(
    data: Mapping[str, Any], overrides: Iterable[Override] = (), source: str = "<dict>"
) -> Recipe:
    """Validate a recipe dict (after ``key.sub=value`` overrides); raises :class:`ConfigError`."""
    return load_config(Recipe, data=data, overrides=overrides, source=source, what="recipe")


def load_recipe(path: str | Path, overrides: Iterable[Override] = ()) -> Recipe:
    """Read, merge (``base:``), override and validate a recipe file."""
    return load_config(Recipe, path, overrides, what="recipe", resolve_paths=_resolve_paths)


# ---------------------------------------------------------------------------------------- provenance

# Sections of the paper (BalCapRL: A Balanced Framework for RL-Based MLLM Image Captioning) cited below.
_A1 = "Appendix A.1 (Implementation Details)"
_REWARDS = "Sec. 2.1 (Reward design)"
_DATA = "Sec. 2.2 (Data)"
_OPTIMIZATION = "Sec. 2.3 (Policy Optimization)"


@dataclass(frozen=True)
class Provenance:
    """Where a recipe value comes from.

    ``source``: ``paper`` (``why`` names the section), ``inference`` (the paper implies it but does not
    state it; ``why`` gives the reasoning), ``library`` (a library's default; ``why`` names which), or
    ``choice`` (balcaprl's own setting where nothing points at a value; ``why`` says why this one).
    """

    source: Literal["paper", "inference", "library", "choice"]
    why: str


def _paper(why: str) -> Provenance:
    return Provenance("paper", why)


def _inference(why: str) -> Provenance:
    return Provenance("inference", why)


def _library(why: str) -> Provenance:
    return Provenance("library", why)


def _choice(why: str) -> Provenance:
    return Provenance("choice", why)


# Every recipe setting with a default, by key; its value in the paper recipe (configs/qwen2_5_vl_3b.yaml
# over the schema's defaults) is what the entry explains. A test keeps this table and the schema in step.
PROVENANCE: dict[str, Provenance] = {
    # model
    "model.dtype": _library(
        "verl's FSDP default (actor.fsdp_config.model_dtype fp32, bf16 mixed precision), the framework the paper used"
    ),
    "model.attn_implementation": _choice(
        "sdpa needs no extra package (flash-attn is a source build); verl itself uses flash-attention 2"
    ),
    "model.trust_remote_code": _choice("off: no code from a checkpoint runs unless asked"),
    "model.gradient_checkpointing": _choice(
        "memory only, not the method: 3B and 7B updates fit 80 GB with it (balcaprl train --plan); "
        "off in the schema for tiny CPU models"
    ),
    "model.lora": _inference(f"full fine-tuning: the paper mentions no adapters ({_A1})"),
    "model.lora.r": _choice("LoRA runs only: a common rank (peft's default is 8)"),
    "model.lora.alpha": _choice("LoRA runs only: alpha = 2r, a common scaling"),
    "model.lora.dropout": _choice("LoRA runs only: a common value (peft's default is 0)"),
    "model.lora.target_modules": _choice("LoRA runs only: every linear layer but the LM head"),
    "model.lora.modules_to_save": _library("peft's default (none)"),
    "model.image.max_side": _choice("no downscaling beyond the processor's own limits"),
    "model.image.min_pixels": _library("the checkpoint's processor (Qwen2.5-VL: 3,136 pixels)"),
    "model.image.max_pixels": _library(
        "transformers' Qwen2VLImageProcessor default (28 x 28 x 1280: at most 1,280 image tokens); the "
        "Qwen2.5-VL checkpoints allow 12,845,056 pixels (16,384 tokens); the paper gives no limit"
    ),
    "model.processor_kwargs": _choice("none"),
    "model.vision_attention": _choice(
        "varlen_sdpa: one SDPA call per vision layer instead of one per window (same outputs, tests); torch only. "
        "default in the schema (transformers' own)"
    ),
    "model.layers_without_recompute": _choice(
        "what fits: the largest N the memory plan gives for fsdp.yaml on 80 GiB GPUs with 6 GiB left free at the recipe's micro-batch "
        "(balcaprl train --plan); 0 in the schema (every layer recomputed, as plain gradient checkpointing)"
    ),
    # data
    "data.reference": _paper(f"references re-captioned with GPT-5-mini for the main results ({_DATA})"),
    "data.reference_tokens": _choice(
        "the length mask needs lengths in the policy's tokenizer; recount when unsure"
    ),
    "data.max_samples": _paper(f"all of ShareGPT4V, about 90K images ({_DATA})"),
    "data.shuffle": _library("verl's data.shuffle default (true)"),
    # rewards
    "rewards.weights.precision": _paper(f"w_pre = 0.1 for the main results ({_A1})"),
    "rewards.weights.recall": _paper(f"w_rec = 0.3 ({_A1})"),
    "rewards.weights.linguistic": _paper(f"w_ling = 0.3 ({_A1})"),
    "rewards.pointability": _paper(f"pointability-aware precision ({_REWARDS})"),
    "rewards.length.mode": _paper(f"length-conditional reward masking ({_OPTIMIZATION})"),
    "rewards.length.tau_low": _paper(f"tau_l = 0.5 ({_A1})"),
    "rewards.length.tau_high": _paper(f"tau_u = 2 ({_A1})"),
    "rewards.length.linear_strength": _choice(
        "lambda_len of the linear-penalty ablation (Appendix, Linear length penalty): the paper gives no value"
    ),
    "rewards.max_failed_batches_in_a_row": _choice(
        "a dead judge endpoint stops the run after 3 wasted batches"
    ),
    # advantage
    "advantage.estimator": _paper(f"c-GDPO ({_OPTIMIZATION})"),
    "advantage.eps": _choice("numerical guard on every std; the paper's equations divide by sigma alone"),
    # rollout
    "rollout.rollouts_per_prompt": _paper(f"8 rollouts ({_A1})"),
    "rollout.max_caption_tokens": _choice(
        "room for captions about 5x the lengths of ~200 the paper reports (Tables 3 and 4; unit not stated); "
        "the paper gives no cap"
    ),
    "rollout.temperature": _library("verl's and TRL's sampling default (1.0)"),
    "rollout.top_p": _library("verl's and TRL's default (1.0)"),
    "rollout.top_k": _library("TRL's default (0, off; verl's -1)"),
    "rollout.repetition_penalty": _library("TRL's default (1.0, off)"),
    "rollout.vllm.mode": _inference(
        "colocate: the paper trained with verl, whose rollouts come from vLLM; transformers' generate of a "
        "GPU's 256 captions at once does not fit 80 GB (balcaprl train --plan); off in the schema for CPU runs"
    ),
    "rollout.vllm.gpu_memory_utilization": _inference(
        "null: 0.6, verl's Qwen2.5-VL GRPO example's value, for an engine that sleeps during the update (verl "
        "always, TRL with sleep mode); TRL's own default 0.3 for a resident one"
    ),
    "rollout.vllm.tensor_parallel_size": _library(
        "TRL's default (1): a 3B or 7B model and its KV cache fit one GPU; the LLaVA-1.5-7B recipe uses 2 "
        "(full multi-head attention: 512 KiB of KV cache per token, 9x Qwen2.5-VL-7B's)"
    ),
    "rollout.vllm.enable_sleep_mode": _inference(
        "on: verl frees its engine during the update (free_cache_engine), so the paper's runs did; the engine "
        "can then take 0.6 of the GPU (balcaprl train --plan); off in the schema, TRL's default"
    ),
    "rollout.vllm.max_model_length": _library("vLLM's (the model's context length)"),
    "rollout.vllm.server_base_url": _library("TRL's default (none: host and port)"),
    "rollout.vllm.server_host": _library("TRL's default"),
    "rollout.vllm.server_port": _library("TRL's default"),
    "rollout.vllm.server_timeout": _library("TRL's default"),
    "rollout.vllm.importance_sampling_correction": _inference(
        "off: eq. 2.7 has no such term, and verl, on which the paper trained, applies none by default "
        "(algorithm.rollout_correction.rollout_is: null); TRL's default (on) weights each caption by "
        "exp(sum over its tokens of the log-ratio), which depends on its length"
    ),
    # train
    "train.prompts_per_batch": _paper(
        f"batch size 256 ({_A1}), read as 256 prompts x 8 rollouts (verl's data.train_batch_size counts prompts)"
    ),
    "train.updates_per_batch": _inference(
        "4: the paper credits dual-clip with stability, which binds only when the ratio moves from 1, i.e. "
        "from the second update of a batch on; 4 is verl's default ratio (train_batch_size 1024 / "
        "ppo_mini_batch_size 256) and its Qwen2.5-VL GRPO example's (512 / 128). The schema's 1 keeps tiny CPU "
        "runs on-policy"
    ),
    "train.ppo_epochs": _library("verl's ppo_epochs and TRL's num_iterations default (1)"),
    "train.per_device_batch_size": _choice(
        "memory only, not the method: what fits 80 GB (balcaprl train --plan)"
    ),
    "train.learning_rate": _paper(f"5e-6 ({_A1})"),
    "train.lr_scheduler": _paper(f"cosine ({_A1})"),
    "train.warmup": _library("verl's lr_warmup_steps_ratio default (0)"),
    "train.epochs": _paper(f"1 epoch ({_A1})"),
    "train.max_steps": _paper(f"none: the epoch decides ({_A1})"),
    "train.clip_epsilon": _library(
        f"verl's actor.clip_ratio default (0.2; TRL's epsilon too): the paper applies PPO clipping ({_OPTIMIZATION}) "
        "without a value"
    ),
    "train.clip_epsilon_high": _library("verl's clip_ratio_high default (= clip_ratio)"),
    "train.dual_clip_c": _library(
        f"verl's actor.clip_ratio_c default (3): the paper applies dual-clip ({_A1}) without a value"
    ),
    "train.kl_beta": _paper(f"no KL loss ({_A1})"),
    "train.loss_aggregation": _paper(f"token-sum-sequence-mean ({_A1})"),
    "train.mask_truncated_completions": _library("TRL's default (off)"),
    "train.optimizer": _library("AdamW: verl's FSDP optimizer; adamw_torch is transformers' implementation"),
    "train.weight_decay": _library("transformers' default (0; verl's AdamW uses 0.01): the paper gives none"),
    "train.max_grad_norm": _library("verl's clip_grad and transformers' max_grad_norm default (1.0)"),
    "train.precision": _library("verl's FSDP mixed precision (bf16)"),
    "train.use_cpu": _choice("GPU training; true only for tests and the offline demo"),
    "train.seed": _choice("any fixed seed (verl's examples use 42)"),
    "train.dataloader_num_workers": _choice("images are opened lazily on the main process"),
    "train.stop_after_step": _choice("none: run to the end"),
    "train.trl_overrides": _choice("none: every GRPOConfig value comes from the recipe"),
    "train.padding_free": _choice(
        "on in the Qwen2.5-VL recipes (LLaVA: padded rows): equal results either way (tests); packed rows take "
        "a variable-length attention, no dense mask, and the update computes real tokens only"
    ),
    "train.judge_overlap": _choice(
        "each rollout's judge call starts when its caption exists: same calls, less waiting"
    ),
    # run
    "run.save_steps": _choice(
        "a checkpoint every 25 generation batches (100 optimizer steps of 4 per batch)"
    ),
    "run.save_total_limit": _choice(
        "the newest 2 checkpoints (one to resume from, one in case it is damaged): a 3B checkpoint is 42 GiB "
        "(balcaprl train --plan); the schema keeps every one"
    ),
    "run.save_final_model": _choice("the trained policy is the run's product"),
    "run.report_to": _choice("TensorBoard next to metrics.jsonl in the paper recipe; none in the schema"),
    "run.run_name": _choice("the recipe's name"),
    "run.progress": _choice("a progress bar and one line per step"),
    "run.log_rollouts_every": _choice(
        "every rollout of the first step and of one step in 100: about 1% of a run's captions, enough for "
        "`balcaprl inspect` to show each stage of a run (0: none)"
    ),
    # judge
    "judge": _paper(f"GPT-4o-mini judges the main results ({_A1}); null in the schema: pass a Judge in code"),
}

# Keys without a setting to explain: labels.
_LABELS = {"name", "description"}


def _section_of(annotation: Any) -> type[Section] | None:
    """The Section class a field holds (also inside ``X | None``), else None."""
    import typing

    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, Section):
            return candidate
    return None


def _walk(model: type[Section], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        if key in _LABELS:
            continue
        section = _section_of(field.annotation) if key != "judge" else None
        if not field.is_required() and (section is None or field.default is None):
            yield key, field.get_default(call_default_factory=True)  # a leaf, or an optional section (lora)
        if section is not None:
            yield from _walk(section, f"{key}.")


def recipe_defaults() -> dict[str, Any]:
    """Every recipe setting that has a default, by key, with the schema's default."""
    return dict(_walk(Recipe))


_UNSET = object()  # a key under an optional section that is off (model.lora.r without LoRA)


def _lookup(values: Any, key: str) -> Any:
    for part in key.split("."):
        if not isinstance(values, Mapping):
            return _UNSET
        values = values.get(part)
    return values


def _shown(value: Any, key: str = "") -> str:
    if value is _UNSET:
        return "-"
    if key == "judge" and isinstance(value, Mapping):  # a judge config: its model names it
        return f"{value.get('model', '...')} (judge config)"
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, list):
        return "[" + ", ".join(_shown(v) for v in value) + "]"
    return "{}" if value == {} else str(value)


def provenance_table(paper_recipe: Recipe, source_name: str) -> str:
    """The Markdown table of every default: its value in ``paper_recipe``, the schema's when it differs,
    and its provenance (what ``docs/recipes.md`` holds)."""
    values = paper_recipe.model_dump(mode="json")
    lines = [
        f"| key | {source_name} | schema default | source | why |",
        "| --- | --- | --- | --- | --- |",
    ]
    for key, default in recipe_defaults().items():
        entry = PROVENANCE[key]
        value = _lookup(values, key)
        default_json = yaml.safe_load(yaml.safe_dump(_jsonable(default)))
        different = "" if default_json == value else _shown(default_json)
        lines.append(f"| `{key}` | {_shown(value, key)} | {different} | {entry.source} | {entry.why} |")
    return "\n".join(lines) + "\n"


def _jsonable(value: Any) -> Any:
    return value.model_dump(mode="json") if isinstance(value, Section) else value
