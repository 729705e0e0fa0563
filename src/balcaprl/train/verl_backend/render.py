"""A balcaprl recipe -> verl 0.9.1 Hydra overrides (one recipe drives both backends).

``render_verl(recipe, nnodes=..., gpus_per_node=...)`` returns the overrides for
``python -m balcaprl.train.verl_backend.main`` (verl's ``main_ppo`` with balcaprl registered), grouped
by what they set. The paper's settings come from the recipe, never from verl's defaults:

    recipe                                  verl
    rollout.rollouts_per_prompt 8           actor_rollout_ref.rollout.n=8
    train.prompts_per_batch 256             data.train_batch_size=256 (prompts; x n captions)
    train.updates_per_batch 4               actor_rollout_ref.actor.ppo_mini_batch_size=64 (prompts)
    train.learning_rate 5e-6                actor_rollout_ref.actor.optim.lr=5e-06
    train.lr_scheduler cosine               actor_rollout_ref.actor.optim.lr_scheduler_type=cosine
    train.epochs 1                          trainer.total_epochs=1
    train.max_steps, run.save_steps,        trainer.total_training_steps, trainer.save_freq,
      train.warmup (optimizer steps)          optim.lr_warmup_steps (batches: divided by
                                              updates_per_batch x ppo_epochs, verl_step_counts)
    train.clip_epsilon 0.2                  actor_rollout_ref.actor.clip_ratio(_low,_high)=0.2
    train.dual_clip_c 3                     actor_rollout_ref.actor.clip_ratio_c=3.0
                                            actor_rollout_ref.actor.policy_loss.loss_mode=balcaprl_dual_clip
                                            (verl's dual-clip loss + ratio metrics, policy_loss.py)
    train.kl_beta 0                         actor_rollout_ref.actor.use_kl_loss=false (no reference model)
    train.loss_aggregation token_sum_...    actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum
    rewards (weights, pointability, length) reward_kwargs.rewards='<RewardConfig JSON>' (the one copy;
                                            algorithm.balcaprl.rewards interpolates it for the estimator)
    advantage.estimator c_gdpo              algorithm.adv_estimator=balcaprl_c_gdpo
    rollout.vllm.gpu_memory_utilization     actor_rollout_ref.rollout.gpu_memory_utilization=0.6 when
      (null)                                null, with free_cache_engine=true: verl's engine sleeps during
                                            the update, so its share is verl's own, not TRL's resident 0.3
    rollout.vllm.tensor_parallel_size       actor_rollout_ref.rollout.tensor_model_parallel_size

Settings verl cannot honour are rejected with a :class:`ConfigError` naming the key (never silently
dropped): CPU training, TRL's vLLM server mode, fp16, an optimizer other than AdamW, lr schedules other
than cosine/constant, no dual-clip (verl always applies it), repetition penalty, masking truncated
captions, ``stop_after_step``, fractional epochs without ``max_steps``, LoRA dropout or
``modules_to_save``, and batch shapes the GPUs cannot split evenly. Recipe knobs that only tune TRL's
memory use map to their verl counterparts (``per_device_batch_size`` -> micro-batch sizes per GPU, which
verl reads only without ``use_dynamic_bsz``); the attention implementation is left to verl
(flash-attention 2), and so are TRL-only speed knobs (``model.vision_attention``,
``model.layers_without_recompute``, ``train.padding_free``: verl packs by itself).

Speed. The actor trains under FSDP2 (``strategy=fsdp2``), on token-balanced micro-batches
(``use_dynamic_bsz``) of at most the memory plan's per-GPU token budget (``ppo_max_token_len_per_gpu``,
``plan/memory.py``; ``gpu_memory_gib`` sets the GPU size), with verl's fused LM head and log-probs
(``use_fused_kernels``) for the packed Qwen2/2.5-VL.

Models. Qwen2/2.5-VL run packed (``use_remove_padding=true``): verl 0.9.1 patches their forward for it.
LLaVA-1.5 (``configs/llava_1_5_7b.yaml``) renders too: verl 0.9.1 has no LLaVA-specific code, example or
test, but its generic vision-language path covers it (``AutoModelForImageTextToText``; 1-D positions,
since LLaVA's processor has no ``get_rope_index``; FSDP wrapping from the CLIP and Llama layers). It runs
unpacked (``use_remove_padding=false``: the plain transformers forward, which verl does not patch for
LLaVA), with no pixel limits (a fixed 336 x 336 image, 576 tokens) and a rollout engine over 2 GPUs (512
KiB of KV cache per token). Not verified here, for want of GPUs: the weight sync from transformers 5's
LLaVA parameter names into vLLM's LLaVA loader.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from balcaprl.errors import ConfigError
from balcaprl.recipe import Recipe
from balcaprl.rewards import REWARD_NAMES

PLUGIN_MODULE = "balcaprl.train.verl_backend.plugin"
POLICY_LOSS = "balcaprl_dual_clip"  # registered by policy_loss.py (imported by the plugin)
REWARD_FUNCTION = "pkg://balcaprl.train.verl_backend.reward"
REWARD_MANAGER = "pkg://balcaprl.train.verl_backend.reward_manager"
REWARD_KWARGS = "reward.custom_reward_function.reward_kwargs"
ESTIMATOR_NAMES = {"c_gdpo": "balcaprl_c_gdpo", "grpo": "balcaprl_grpo"}
LOSS_AGG_MODES = {
    "token_sum_sequence_mean": "seq-mean-token-sum",
    "token_mean": "token-mean",
    "sequence_mean_token_mean": "seq-mean-token-mean",
}
SCHEDULERS = {"cosine": "cosine", "constant": "constant", "constant_with_warmup": "constant"}
ADAMW = {"adamw_torch", "adamw_torch_fused", "adamw_hf", "adamw"}
REPORT_TO = {"tensorboard": "tensorboard", "wandb": "wandb", "trackio": "trackio"}
VERL_TOKEN_BUDGET = 16384  # verl 0.9.1's ppo_max_token_len_per_gpu default
DEFAULT_MAX_PROMPT_LENGTH = 2048  # image tokens + prompt; Qwen2.5-VL at max_pixels 1003520 is <= 1280 + text


@dataclass(frozen=True)
class ClusterShape:
    """Where the job runs: ``nnodes`` machines with ``gpus_per_node`` GPUs each."""

    nnodes: int = 1
    gpus_per_node: int = 8

    def __post_init__(self) -> None:
        if self.nnodes < 1 or self.gpus_per_node < 1:
            raise ConfigError(
                f"nnodes and gpus_per_node must be >= 1, got {self.nnodes}, {self.gpus_per_node}"
            )

    @property
    def gpus(self) -> int:
        return self.nnodes * self.gpus_per_node


@dataclass
class VerlLaunch:
    """The rendered launch: Hydra overrides by section, the run's environment, files to write first."""

    sections: list[tuple[str, list[str]]]
    env: dict[str, str]
    files: dict[Path, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def overrides(self) -> list[str]:
        return [item for _, items in self.sections for item in items]

    def as_dict(self) -> dict[str, str]:
        """``{key: value}`` of every override (``++`` prefixes dropped), for lookups and tests."""
        result = {}
        for item in self.overrides:
            key, _, value = item.partition("=")
            result[key.lstrip("+")] = value
        return result

    def command(self, python: str = "python3") -> list[str]:
        return [python, "-m", "balcaprl.train.verl_backend.main", *self.overrides]

    def to_text(self, header: Sequence[str] = ()) -> str:
        """One override per line, ``#`` comments between sections (``parse_overrides_text`` reads it)."""
        lines = [f"# {h}" if h else "#" for h in header]
        for title, items in self.sections:
            lines.append(f"# --- {title}")
            lines.extend(items)
        return "\n".join(lines) + "\n"


def parse_overrides_text(text: str) -> list[str]:
    """The overrides of a file written by :meth:`VerlLaunch.to_text` (comments and blanks skipped)."""
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


_PLAIN = re.compile(r"^[A-Za-z0-9_./:+\-@]+$")


def format_value(value: Any) -> str:
    """A Hydra override value: YAML-like scalars and flow lists; other strings single-quoted."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ",".join(format_value(v) for v in value) + "]"
    text = str(value)
    reserved = text.lower() in {"null", "true", "false", "none", "nan", "inf", "-inf"}
    looks_numeric = re.fullmatch(r"[-+]?(\d[\d_]*\.?\d*|\.\d+)([eE][-+]?\d+)?", text) is not None
    if _PLAIN.match(text) and not reserved and not looks_numeric:
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _set(key: str, value: Any) -> str:
    return f"{key}={format_value(value)}"


def _add(key: str, value: Any) -> str:
    """A key verl's YAML config does not declare: Hydra's ``++`` adds it (or overrides it if a later verl
    declares it)."""
    return f"++{key}={format_value(value)}"


def _path(value: str | Path, absolute: bool) -> str:
    path = Path(value).expanduser()
    return str(path.resolve()) if absolute else str(path)


def _check(recipe: Recipe, cluster: ClusterShape, problems: list[str]) -> None:
    t, r, m = recipe.train, recipe.rollout, recipe.model
    if t.use_cpu:
        problems.append("train.use_cpu: verl trains on GPUs only; use the TRL backend on CPU")
    if r.vllm.mode == "server":
        problems.append(
            "rollout.vllm.mode: 'server' is TRL's external vLLM server; verl starts its own vLLM engines on "
            "the training GPUs (use 'off' or 'colocate')"
        )
    if t.precision == "fp16":
        problems.append("train.precision: fp16 is not supported by verl's FSDP engine; use bf16 or fp32")
    if t.optimizer not in ADAMW:
        problems.append(f"train.optimizer: verl's FSDP engine uses AdamW; {t.optimizer!r} is not available")
    if t.lr_scheduler not in SCHEDULERS:
        problems.append(
            f"train.lr_scheduler: verl's FSDP optimizer offers cosine and constant, not {t.lr_scheduler!r}"
        )
    if t.dual_clip_c is None:
        problems.append(
            "train.dual_clip_c: verl always applies dual-clip (clip_ratio_c > 1); set a value (verl's default: 3)"
        )
    if r.repetition_penalty != 1.0:
        problems.append(
            "rollout.repetition_penalty: verl's rollout config has no repetition penalty; use 1.0"
        )
    if t.mask_truncated_completions:
        problems.append("train.mask_truncated_completions: not available in verl; set false")
    if t.stop_after_step is not None:
        problems.append(
            "train.stop_after_step: not available in verl (it resumes from its newest checkpoint by itself); "
            "remove it"
        )
    if t.trl_overrides:
        problems.append("train.trl_overrides: TRL settings; for verl pass --verl-override KEY=VALUE instead")
    # Step counts: the recipe's are optimizer steps, verl's are batches (see verl_step_counts).
    per_batch = t.steps_per_batch
    if t.max_steps is not None and t.max_steps % per_batch:
        problems.append(
            f"train.max_steps: {t.max_steps} optimizer steps are not whole batches of {per_batch} "
            "(updates_per_batch x ppo_epochs); verl counts batches"
        )
    if t.warmup >= 1 and t.warmup % per_batch:
        problems.append(
            f"train.warmup: {t.warmup:g} optimizer steps are not whole batches of {per_batch} "
            "(updates_per_batch x ppo_epochs); verl steps its schedule once a batch (or give a ratio < 1)"
        )
    if t.max_steps is None and float(t.epochs) != int(t.epochs):
        problems.append(f"train.epochs: verl counts whole epochs; {t.epochs} needs train.max_steps instead")
    if m.lora is not None:
        if m.lora.dropout != 0:
            problems.append("model.lora.dropout: verl's FSDP LoRA has no dropout; set 0")
        if m.lora.modules_to_save:
            problems.append("model.lora.modules_to_save: not available in verl; remove it")
    # Batch shape: verl splits prompts_per_batch x n captions over all GPUs, mini-batches of prompts.
    captions = t.prompts_per_batch * r.rollouts_per_prompt
    if t.prompts_per_batch % t.updates_per_batch:
        problems.append(
            f"train.updates_per_batch: {t.prompts_per_batch} prompts do not split into {t.updates_per_batch} "
            "equal mini-batches"
        )
    elif captions % cluster.gpus:
        problems.append(
            f"train.prompts_per_batch: {captions} captions per batch do not split over {cluster.gpus} GPUs"
        )
    else:
        per_gpu = captions // t.updates_per_batch // cluster.gpus
        if per_gpu == 0 or per_gpu % t.per_device_batch_size:
            problems.append(
                f"train.per_device_batch_size: each GPU gets {per_gpu} captions per update, which "
                f"micro-batches of {t.per_device_batch_size} do not split"
            )
    if (
        r.vllm.tensor_parallel_size > cluster.gpus_per_node
        or cluster.gpus_per_node % r.vllm.tensor_parallel_size
    ):
        problems.append(
            f"rollout.vllm.tensor_parallel_size: {r.vllm.tensor_parallel_size} must divide the "
            f"{cluster.gpus_per_node} GPUs of a node"
        )


def verl_step_counts(recipe: Recipe) -> dict[str, int | float | None]:
    """The recipe's step counts in verl's unit.

    The recipe counts optimizer steps (TRL's ``global_step``): ``train.max_steps``, ``train.warmup``
    (>= 1) and ``run.save_steps``. verl counts batches: ``trainer.total_training_steps``,
    ``trainer.save_freq`` and ``optim.lr_warmup_steps`` (its actor steps the lr schedule once per
    ``update_actor``, i.e. once a batch, however many mini-batches that batch holds). One batch feeds
    ``updates_per_batch x ppo_epochs`` optimizer steps on both backends, so dividing by it gives the same
    samples, the same checkpoints and the same warm-up. A warm-up ratio is unit-free and passes as is.
    ``_check`` has refused counts that are not whole batches.
    """
    t, per_batch = recipe.train, recipe.train.steps_per_batch
    return {
        "total_training_steps": t.max_steps // per_batch if t.max_steps is not None else None,
        "save_freq": recipe.run.save_steps // per_batch,
        "lr_warmup_steps": int(t.warmup) // per_batch if t.warmup >= 1 else None,
        "lr_warmup_steps_ratio": float(t.warmup) if t.warmup < 1 else None,
    }


def _packs_sequences(model_path: str) -> tuple[bool, str | None]:
    """Whether verl runs the model packed (remove-padding), and a note when it does not or cannot tell."""
    from balcaprl.errors import UserError
    from balcaprl.plan.memory import model_shape

    try:
        kind = model_shape(model_path).kind
    except UserError:
        return True, f"model.path {model_path}: not a known architecture; verl's packed forward is assumed"
    if kind == "qwen2_vl":
        return True, None
    return False, (
        f"{model_path}: verl 0.9.1 has no code of its own for this architecture (LLaVA); it runs through verl's "
        "generic vision-language path, unpacked (use_remove_padding=false), untested upstream"
    )


def _token_budget(
    recipe: Recipe, cluster: ClusterShape, gpu_memory_gib: float, longest: int
) -> tuple[int, str | None]:
    """``ppo_max_token_len_per_gpu``: the memory plan's token budget for a token-balanced micro-batch,
    never below one whole sequence (verl refuses a budget shorter than the padded width), with a note
    when the plan cannot say or says it does not fit."""
    from balcaprl.errors import UserError
    from balcaprl.plan.memory import launcher_from_verl_layout, plan_memory

    layout = launcher_from_verl_layout(f"{cluster.nnodes}x{cluster.gpus_per_node}")
    try:
        budget = plan_memory(recipe, layout, gpu_memory_gib).token_budget or 0
    except UserError:
        return max(VERL_TOKEN_BUDGET, longest), (
            f"model.path {recipe.model.path}: no memory plan for it; verl's default token budget "
            f"({VERL_TOKEN_BUDGET}) is used"
        )
    if budget < longest:
        return longest, (
            f"the memory plan leaves room for {budget} tokens per GPU micro-batch, less than one "
            f"{longest}-token sequence: expect out-of-memory errors (balcaprl train --plan --verl-layout)"
        )
    return budget, None


def _judge_config_path(
    recipe: Recipe, recipe_dir: Path | None, judge: str | Path | None, out_dir: Path, absolute: bool
) -> tuple[str, dict[Path, str]]:
    """Where the reward workers read the judge config, and a file to write for the recipe's own."""
    from balcaprl.judge import load_judge_config

    if judge is not None:  # a judge YAML given on the command line replaces the recipe's judge
        path = Path(judge).expanduser()
        if not path.is_absolute() and recipe_dir is not None and (recipe_dir / path).exists():
            path = recipe_dir / path
        load_judge_config(path)  # fail here, not on a worker 20 minutes into the job
        return _path(path, absolute), {}
    if recipe.judge is None:
        raise ConfigError(
            "no judge: verl's reward workers build the judge from a config file; give the recipe a judge: "
            "section or --judge JUDGE.yaml"
        )
    # The recipe's judge was validated when it loaded; the workers read the keys it sets.
    path = out_dir / "verl" / "judge.yaml"
    text = yaml.safe_dump(recipe.judge.model_dump(mode="json", exclude_unset=True), sort_keys=False)
    return _path(path, absolute), {path: text}


def render_verl(
    recipe: Recipe,
    *,
    nnodes: int = 1,
    gpus_per_node: int = 8,
    verl_data: str | Path | None = None,
    judge: str | Path | None = None,
    recipe_dir: str | Path | None = None,
    reward_workers: int = 8,
    max_prompt_length: int = DEFAULT_MAX_PROMPT_LENGTH,
    absolute_paths: bool = True,
    extra: Iterable[str] = (),
    gpu_memory_gib: float = 80.0,
    flash_attn: bool = True,
) -> VerlLaunch:
    """verl overrides that realise ``recipe`` on ``nnodes`` x ``gpus_per_node`` GPUs.

    ``verl_data``: the ``balcaprl verl export`` folder (default ``<data.path>/verl``). ``judge``: a judge
    YAML replacing the recipe's ``judge:``. ``extra``: raw Hydra overrides appended last (they win).
    ``absolute_paths=False`` keeps paths as written (reference renderings checked into configs/verl).
    ``gpu_memory_gib``: each GPU's memory, for the memory plan's per-GPU token budget.
    ``flash_attn=False``: for nodes without flash-attn (a source build for torch 2.11 / CUDA 13): verl
    0.9.1's packed Qwen2/2.5-VL forward calls ``flash_attn_varlen_func`` and its actor loads with
    ``override_config.attn_implementation`` (default ``flash_attention_2``), so the actor runs unpacked
    on sdpa (slower: padded rows, no fused LM head).
    """
    cluster = ClusterShape(nnodes, gpus_per_node)
    if reward_workers < 1:
        raise ConfigError(f"reward_workers must be >= 1, got {reward_workers}")
    if max_prompt_length < 64:
        raise ConfigError(f"max_prompt_length must be >= 64, got {max_prompt_length}")
    problems: list[str] = []
    _check(recipe, cluster, problems)
    if problems:
        raise ConfigError("this recipe cannot run on verl:\n  " + "\n  ".join(problems))

    t, r, m, rw, run = recipe.train, recipe.rollout, recipe.model, recipe.rewards, recipe.run
    out_dir = Path(run.output_dir)
    data_dir = Path(verl_data) if verl_data is not None else Path(recipe.data.path) / "verl"
    judge_path, files = _judge_config_path(
        recipe, Path(recipe_dir) if recipe_dir is not None else None, judge, out_dir, absolute_paths
    )
    high = t.clip_epsilon_high if t.clip_epsilon_high is not None else t.clip_epsilon

    data = [
        _set("data.train_files", _path(data_dir / "train.parquet", absolute_paths)),
        _set("data.val_files", _path(data_dir / "eval.parquet", absolute_paths)),
        _set("data.prompt_key", "prompt"),
        _set("data.image_key", "images"),
        _set("data.return_raw_chat", True),
        _set("data.train_batch_size", t.prompts_per_batch),
        _set("data.max_prompt_length", max_prompt_length),
        _set("data.max_response_length", r.max_caption_tokens),
        _set("data.filter_overlong_prompts", False),
        _set("data.truncation", "error"),
        _set("data.shuffle", recipe.data.shuffle),
        _set("data.seed", t.seed),
        _set("data.train_max_samples", recipe.data.max_samples if recipe.data.max_samples else -1),
        _set("data.dataloader_num_workers", t.dataloader_num_workers),
    ]
    if m.image.min_pixels is not None:
        data.append(_add("data.mm_processor_kwargs.min_pixels", m.image.min_pixels))
    if m.image.max_pixels is not None:
        data.append(_add("data.mm_processor_kwargs.max_pixels", m.image.max_pixels))

    packed, model_note = _packs_sequences(m.path)
    packed = packed and flash_attn
    budget, budget_note = _token_budget(
        recipe, cluster, gpu_memory_gib, max_prompt_length + r.max_caption_tokens
    )
    model = [
        _set("actor_rollout_ref.model.path", m.path),
        _set("actor_rollout_ref.model.trust_remote_code", m.trust_remote_code),
        _set("actor_rollout_ref.model.enable_gradient_checkpointing", m.gradient_checkpointing),
        _set("actor_rollout_ref.model.use_remove_padding", packed),
        # The LM head and log-probs in 512-token chunks instead of every token's logits at once (16 x
        # 2,368 tokens x 151,936 entries would be ~11.5 GB); verl patches Qwen2/2.5-VL's forward for it,
        # packed only, so LLaVA keeps the plain head.
        _set("actor_rollout_ref.model.use_fused_kernels", packed),
        _set("actor_rollout_ref.model.lora_rank", m.lora.r if m.lora is not None else 0),
    ]
    if not flash_attn:
        model.append(_add("actor_rollout_ref.model.override_config.attn_implementation", "sdpa"))
    if m.lora is not None:
        model.append(_set("actor_rollout_ref.model.lora_alpha", m.lora.alpha))
        model.append(_set("actor_rollout_ref.model.target_modules", m.lora.target_modules))

    steps = verl_step_counts(recipe)  # optimizer steps -> batches
    warmup = (
        _set("actor_rollout_ref.actor.optim.lr_warmup_steps", steps["lr_warmup_steps"])
        if steps["lr_warmup_steps"] is not None
        else _set("actor_rollout_ref.actor.optim.lr_warmup_steps_ratio", steps["lr_warmup_steps_ratio"])
    )
    actor = [
        _set("actor_rollout_ref.actor.strategy", "fsdp2"),  # per-parameter sharding (FSDP1: "fsdp")
        _set("actor_rollout_ref.actor.optim.lr", t.learning_rate),
        _set("actor_rollout_ref.actor.optim.lr_scheduler_type", SCHEDULERS[t.lr_scheduler]),
        warmup,
        _set("actor_rollout_ref.actor.optim.weight_decay", t.weight_decay),
        _set("actor_rollout_ref.actor.optim.clip_grad", t.max_grad_norm),
        _set("actor_rollout_ref.actor.ppo_mini_batch_size", t.prompts_per_batch // t.updates_per_batch),
        _set("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", t.per_device_batch_size),
        # Token-balanced micro-batches: packed to the memory plan's per-GPU token budget, not a fixed
        # count of captions (log-prob passes of the rollout and reference follow these two).
        _set("actor_rollout_ref.actor.use_dynamic_bsz", True),
        _set("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", budget),
        _set("actor_rollout_ref.actor.ppo_epochs", t.ppo_epochs),
        _set("actor_rollout_ref.actor.policy_loss.loss_mode", POLICY_LOSS),
        _set("actor_rollout_ref.actor.clip_ratio", t.clip_epsilon),
        _set("actor_rollout_ref.actor.clip_ratio_low", t.clip_epsilon),
        _set("actor_rollout_ref.actor.clip_ratio_high", high),
        _set("actor_rollout_ref.actor.clip_ratio_c", float(t.dual_clip_c)),  # type: ignore[arg-type]
        _set("actor_rollout_ref.actor.loss_agg_mode", LOSS_AGG_MODES[t.loss_aggregation]),
        _set("actor_rollout_ref.actor.use_kl_loss", t.kl_beta > 0),
        _set("actor_rollout_ref.actor.kl_loss_coef", t.kl_beta),
        _set("actor_rollout_ref.actor.kl_loss_type", "low_var_kl"),
        _set("actor_rollout_ref.actor.entropy_coeff", 0),
        _set("actor_rollout_ref.actor.data_loader_seed", t.seed),
        _set("actor_rollout_ref.actor.fsdp_config.model_dtype", "fp32" if m.dtype == "float32" else "bf16"),
        _set("actor_rollout_ref.actor.fsdp_config.dtype", "bfloat16" if t.precision == "bf16" else "float32"),
        # Read only when kl_beta > 0 loads a reference model; verl requires it set then.
        _set("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", t.per_device_batch_size),
    ]
    rollout = [
        _set("actor_rollout_ref.rollout.name", "vllm"),
        _set("actor_rollout_ref.rollout.mode", "async"),
        _set("actor_rollout_ref.rollout.n", r.rollouts_per_prompt),
        _set("actor_rollout_ref.rollout.temperature", r.temperature),
        _set("actor_rollout_ref.rollout.top_p", r.top_p),
        _set("actor_rollout_ref.rollout.top_k", r.top_k if r.top_k > 0 else -1),
        _set("actor_rollout_ref.rollout.do_sample", True),
        _set("actor_rollout_ref.rollout.seed", t.seed),
        # verl's engine sleeps during the update (free_cache_engine: weights and KV cache freed), so it may
        # take more of the GPU than TRL's resident one (balcaprl.recipe: SLEEPING_ENGINE_SHARE).
        _set("actor_rollout_ref.rollout.gpu_memory_utilization", r.vllm.memory_share("verl")),
        _set("actor_rollout_ref.rollout.free_cache_engine", True),
        _set("actor_rollout_ref.rollout.tensor_model_parallel_size", r.vllm.tensor_parallel_size),
        _set("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", t.per_device_batch_size),
    ]
    if r.vllm.max_model_length is not None:
        rollout.append(_set("actor_rollout_ref.rollout.max_model_len", r.vllm.max_model_length))

    reward_kwargs = {
        "rewards": rw.reward_config().to_json(),  # validated again by RewardConfig in every reward worker
        "tokenizer": m.path,
        "judge_config": judge_path,
        "image_root": _path(recipe.data.path, absolute_paths),
        "workers": reward_workers,
    }
    reward = [
        # verl's naive manager, handing compute_score the generated ids (caption length as TRL counts it)
        _set("reward.reward_manager.source", "importlib"),
        _set("reward.reward_manager.name", "BalcaprlRewardManager"),
        _set("reward.reward_manager.module.path", REWARD_MANAGER),
        _set("reward.num_workers", reward_workers),
        _set("reward.custom_reward_function.path", REWARD_FUNCTION),
        _set("reward.custom_reward_function.name", "compute_score"),
        *(_add(f"{REWARD_KWARGS}.{k}", v) for k, v in reward_kwargs.items()),
    ]
    algorithm = [
        _set("algorithm.adv_estimator", ESTIMATOR_NAMES[recipe.advantage.estimator]),
        _add("algorithm.gdpo_reward_keys", list(REWARD_NAMES)),
        # The estimator's weights: the reward function's reward config itself (one JSON string).
        _add("algorithm.balcaprl.rewards", f"${{{REWARD_KWARGS}.rewards}}"),
        _set("algorithm.use_kl_in_reward", False),
        _add("algorithm.balcaprl.eps", float(recipe.advantage.eps)),
        _add("algorithm.balcaprl.max_failed_batches_in_a_row", rw.max_failed_batches_in_a_row),
    ]
    loggers = ["console", *(REPORT_TO[s] for s in run.report_to)]
    trainer = [
        _set("trainer.use_v1", True),
        _set("trainer.v1.trainer_mode", "balcaprl_sync"),
        _set("trainer.nnodes", cluster.nnodes),
        _set("trainer.n_gpus_per_node", cluster.gpus_per_node),
        _set("trainer.total_epochs", max(1, int(t.epochs))),
        _set("trainer.total_training_steps", steps["total_training_steps"]),
        _set("trainer.save_freq", steps["save_freq"]),
        _set("trainer.max_actor_ckpt_to_keep", run.save_total_limit),
        _set("trainer.test_freq", -1),
        _set("trainer.val_before_train", False),
        _set("trainer.resume_mode", "auto"),
        _set("trainer.default_local_dir", _path(out_dir / "checkpoints", absolute_paths)),
        _set("trainer.project_name", "balcaprl"),
        _set("trainer.experiment_name", run.run_name or recipe.name or out_dir.name),
        _set("trainer.logger", loggers),
    ]
    notes = [note for note in (model_note, budget_note) if note]
    if not flash_attn:
        notes.append("--no-flash-attn: the actor runs unpacked on sdpa (padded rows, no fused LM head)")
    if m.gradient_checkpointing and m.layers_without_recompute:
        notes.append(
            "model.layers_without_recompute: verl checkpoints every layer; its micro-batches take the memory "
            "instead (ppo_max_token_len_per_gpu)"
        )
    if run.log_rollouts_every:
        trainer.append(_set("trainer.rollout_data_dir", _path(out_dir / "rollouts", absolute_paths)))
        notes.append("run.log_rollouts_every: verl writes every batch's rollouts (it has no 'every N')")
    ray = [_add("ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES", PLUGIN_MODULE)]

    sections = [
        ("data (balcaprl verl export)", data),
        ("policy", model),
        ("actor: PPO-clip, dual-clip, token-sum-sequence-mean, no KL", actor),
        ("rollouts: vLLM, colocated", rollout),
        ("reward: balcaprl judge, length mask", reward),
        ("advantages: balcaprl estimator (per rollout, NaN = failed judge)", algorithm),
        ("trainer", trainer),
        ("ray: every worker imports the balcaprl plugin", ray),
    ]
    extra = list(extra)
    if extra:
        sections.append(("extra (command line)", extra))
    env = {"VERL_USE_EXTERNAL_MODULES": PLUGIN_MODULE}
    return VerlLaunch(sections=sections, env=env, files=files, notes=notes)


# Reference renderings checked into configs/verl/ (a test keeps them equal to render_verl's output).
REFERENCE_RENDERINGS = {
    "qwen2_5_vl_3b.1x8.overrides": ("configs/qwen2_5_vl_3b.yaml", 1, 8),
    "qwen2_5_vl_3b.4x8.overrides": ("configs/qwen2_5_vl_3b.yaml", 4, 8),
    "qwen2_5_vl_7b.1x8.overrides": ("configs/qwen2_5_vl_7b.yaml", 1, 8),
    "qwen2_5_vl_7b.4x8.overrides": ("configs/qwen2_5_vl_7b.yaml", 4, 8),
    "llava_1_5_7b.1x8.overrides": ("configs/llava_1_5_7b.yaml", 1, 8),
}


def reference_rendering(repo_root: str | Path, name: str) -> str:
    """The text of ``configs/verl/<name>``: the recipe's rendering with paths as the recipe writes them."""
    from balcaprl.recipe import load_recipe

    recipe_path, nnodes, gpus = REFERENCE_RENDERINGS[name]
    root = Path(repo_root)
    # The recipe names its data relative to itself; the rendering names it from the repository root,
    # where the command runs, so that the checked-in file is the same on every machine.
    data = os.path.relpath(load_recipe(root / recipe_path).data.path, root)
    recipe = load_recipe(root / recipe_path, [f"data.path={data}"])
    launch = render_verl(
        recipe,
        nnodes=nnodes,
        gpus_per_node=gpus,
        recipe_dir=(root / recipe_path).parent,
        absolute_paths=False,
    )
    header = [
        f"verl overrides for {recipe_path} on {nnodes} node(s) x {gpus} GPUs (verl 0.9.1).",
        "Generated: python scripts/verl/render_reference_configs.py (a test checks this file is current).",
        "Paths are relative, as the recipe writes them; `balcaprl verl launch` renders absolute ones.",
        "Use: VERL_USE_EXTERNAL_MODULES=balcaprl.train.verl_backend.plugin \\",
        "     python -m balcaprl.train.verl_backend.main $(grep -v '^#' THIS_FILE)",
        "",
    ]
    return launch.to_text(header)
