"""The paper's recipe on TRL's GRPOTrainer (one machine, one or many GPUs through ``accelerate``).

One training step, in the order it happens (TRL does everything not listed):

1. TRL samples ``rollout.rollouts_per_prompt`` captions for each of ``train.prompts_per_batch`` images
   (transformers generate, or vLLM in colocate/server mode). The images are already on the policy
   processor's grid, and a colocated vLLM engine gets the same pixel limits, so rollout and trainer
   count the same image tokens; a vLLM server that counts differently is stopped with a clear error
   (``train/modeling.py``).
2. Rewards (``_calculate_rewards``): TRL calls the three reward functions precision, recall and
   linguistic; they share one judge verdict per rollout (``train/rewards.py``, each rollout's record
   made by ``train/judging.py``), the length mask gates the linguistic reward (Sec. 2.3), a failed
   judge is NaN. TRL gathers the (N, 3) tensor over processes.
3. Advantages and metrics (``_generate_and_score_completions``): every process's rollout records are
   gathered and the batch step (``train/step.py``, verl's too) replaces TRL's advantages with
   ``balcaprl.c_gdpo_advantages`` (eqs. 2.4-2.6), grouped by prompt id, or ``grpo_advantages`` for the
   ablation, minus the linear length penalty (eq. A.5) when chosen, stops a run whose judge failed on
   whole batches, and gives the batch's metrics.
4. Loss and update: TRL's ``luspo`` loss with token-level ratios and ``delta = c`` is exactly the
   paper's dual-clip PPO with token-sum-sequence-mean aggregation, no KL (``train/loss.py`` proves it;
   TRL's vLLM importance-sampling weight, a term the paper lacks, is off unless the recipe asks).
   Each generation batch feeds ``train.updates_per_batch`` optimizer steps; every step logs the
   importance ratio's mean and max and the shares of clipped and dual-clipped tokens.

Entry points: :func:`train` (a run folder with checkpoints, ``--resume``, metrics) and
:func:`build_trainer` (the configured ``BalancedGRPOTrainer``, for tests and embedding).
"""

from __future__ import annotations

import functools
import json
import logging
import math
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from accelerate import PartialState
from accelerate.utils import gather_object
from transformers import TrainerCallback
from transformers.trainer_callback import PrinterCallback, ProgressCallback
from trl import GRPOConfig, GRPOTrainer
from trl.generation import vllm_generation
from trl.trainer.utils import RepeatSampler

from balcaprl.errors import ConfigError
from balcaprl.judge.protocol import Judge
from balcaprl.recipe import Recipe
from balcaprl.rewards import REWARD_NAMES, RolloutRecord
from balcaprl.train.advantages import AdvantageStep
from balcaprl.train.checkpointing import (
    AtomicCheckpoints,
    StopAfterStep,
    check_resumable,
    checkpoint_step,
    resolve_resume,
    save_final_model,
    truncate_logs,
    write_recipe_snapshot,
)
from balcaprl.train.data import prepare_train_dataset
from balcaprl.train.driver import check_driver
from balcaprl.train.judge_overlap import OverlapMode, TrlJudgeOverlap
from balcaprl.train.loss import RatioStatistics, ratio_statistics, trl_loss_settings
from balcaprl.train.metrics import MetricsJsonlCallback, RichProgressCallback, RolloutLog
from balcaprl.train.model_card import ModelCardCallback, write_model_card
from balcaprl.train.modeling import (
    ImageGrid,
    image_grid,
    keep_activations_on_enable,
    load_processor,
    model_init_kwargs,
    peft_config,
)
from balcaprl.train.packing import PackedLogProbs
from balcaprl.train.rewards import SharedVerdictScorer
from balcaprl.train.rollout_engine import (
    RENAMED_TOWERS,
    banned_tokens,
    check_completions,
    engine_kwargs,
    sampling_ban,
    server_command,
    stop_token_ids,
    vllm_param_name,
)
from balcaprl.train.step import BatchStep, StepResult
from balcaprl.train.trl_overrides import build_config
from balcaprl.train.vision_attention import use_varlen_vision_attention

logger = logging.getLogger(__name__)

# Batch metrics TRL logs itself, under the same names, from the reward functions' values.
TRL_LOGGED = frozenset(f"rewards/{name}/{stat}" for name in REWARD_NAMES for stat in ("mean", "std"))


class _DropKnownTrlNoise(logging.Filter):
    """TRL warnings that do not apply here, dropped so real ones stand out.

    - "All reward functions returned None ...": a failed judge, which we count by reason in the
      metrics; TRL would print the whole row (reference text, image) at every failure.
    - "When using 'luspo' loss, importance_sampling_level should be 'sequence'": token-level ratios
      are what makes luspo the paper's loss (train/loss.py).
    """

    PREFIXES = ("All reward functions returned None", "When using `'luspo'` loss")

    def filter(self, record: logging.LogRecord) -> bool:
        message = str(record.getMessage())
        return not any(prefix in message for prefix in self.PREFIXES)


logging.getLogger("trl.trainer.grpo_trainer").addFilter(_DropKnownTrlNoise())


# ------------------------------------------------------------------------------------ data order


class EpochSeededRepeatSampler(RepeatSampler):
    """TRL's RepeatSampler with the permutation seeded by (seed + epoch).

    TRL's sampler seeds its generator once, so epoch e's order depends on having iterated epochs
    0..e-1 in the same process; a run resumed in epoch e >= 1 would see epoch 0's order again. Seeding
    per epoch makes the order a function of the epoch alone, and epoch 0 keeps TRL's order.

    The epoch is read from ``epoch_source`` (the trainer's state) when iteration starts: the Trainer's
    own ``set_epoch`` call does not reach the sampler on several processes once a resumed run's data
    loader is wrapped to skip the batches already seen.
    """

    def __init__(self, *args: Any, epoch_source: Callable[[], int] | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.epoch_source = epoch_source

    def set_epoch(self, epoch: int) -> None:
        if self.shuffle and self.seed is not None:
            self.generator.manual_seed(self.seed + epoch)

    def __iter__(self) -> Iterator[int]:
        if self.epoch_source is not None:
            self.set_epoch(self.epoch_source())
        return super().__iter__()


# ------------------------------------------------------------------------------ the rollout engine


@contextmanager
def vllm_engine_kwargs(**kwargs: Any) -> Iterator[None]:
    """While the trainer is built, TRL's colocated vLLM engine also gets ``kwargs``.

    TRL 1.16 builds it as ``LLM(model=..., ...)`` with a fixed argument list and no hook
    (``trl/generation/vllm_generation.py``, ``VLLMGeneration._init_vllm``); it looks ``LLM`` up in its
    module when it builds the engine, so the name is bound to ``LLM`` with these keyword arguments
    for that moment. A no-op without vLLM (TRL then refuses ``use_vllm`` itself) or without kwargs.
    """
    original = getattr(vllm_generation, "LLM", None)
    if original is None or not kwargs:
        yield
        return
    vllm_generation.LLM = functools.partial(original, **kwargs)
    try:
        yield
    finally:
        vllm_generation.LLM = original


def precision_of(args: GRPOConfig) -> str:
    """The recipe's ``train.precision`` as ``grpo_config`` set it."""
    return "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32"


def _tokenizer_of(processor: Any) -> Any:
    return getattr(processor, "tokenizer", processor)


def _checkpoint_model_type(path: str | None) -> str | None:
    """``model_type`` of the checkpoint's config.json (a local folder), else None."""
    config = Path(path).expanduser() / "config.json" if path else None
    if config is None or not config.is_file():
        return None
    return json.loads(config.read_text(encoding="utf-8")).get("model_type")


def _stop_tokens(path: str | None, processor: Any) -> frozenset[int]:
    """The tokens that end a caption, as TRL counts them: the tokenizer's EOS and the checkpoint's
    ``generation_config.eos_token_id``."""
    generation_eos = None
    if path is not None:
        try:
            from transformers import GenerationConfig

            generation_eos = GenerationConfig.from_pretrained(path).eos_token_id
        except OSError:  # no generation_config.json
            pass
    return stop_token_ids(_tokenizer_of(processor), generation_eos)


def image_token_runs(token_ids: Sequence[int], image_token_id: int) -> list[int]:
    """Lengths of the runs of ``image_token_id`` in a prompt: one run per image, its image-token count."""
    runs, length = [], 0
    for token in token_ids:
        if token == image_token_id:
            length += 1
        elif length:
            runs.append(length)
            length = 0
    if length:
        runs.append(length)
    return runs


# ------------------------------------------------------------------------------------- the trainer


class BalancedGRPOTrainer(AtomicCheckpoints, GRPOTrainer):
    """``GRPOTrainer`` with the paper's reward path and advantages (see the module docstring).

    Args:
        scorer: the shared-verdict scorer whose three reward functions are passed to TRL.
        batch_step: the recipe's batch step (advantages, metrics, the judge-failure stop rule).
        rollout_log: optional per-rollout log.
        image_grid: the policy processor's image grid (None for processors without one, e.g. LLaVA);
            a colocated vLLM engine gets its limits, a vLLM server is checked against it.
        judge_overlap: when the judge calls start: ``per_rollout`` as the rollout engine finishes each,
            ``batch`` when the batch's captions exist, ``off`` as TRL does (``train/judge_overlap.py``).
        Everything else: as ``GRPOTrainer`` (``reward_funcs`` comes from ``scorer``).
    """

    def __init__(
        self,
        *args: Any,
        scorer: SharedVerdictScorer,
        batch_step: BatchStep,
        rollout_log: RolloutLog | None = None,
        image_grid: ImageGrid | None = None,
        judge_overlap: OverlapMode = "per_rollout",
        **kwargs: Any,
    ):
        if "reward_funcs" in kwargs:
            raise TypeError(
                "BalancedGRPOTrainer builds its reward functions from `scorer`; do not pass reward_funcs"
            )
        self.scorer = scorer
        self.batch_step = batch_step
        self.rollout_log = rollout_log
        self.image_grid = image_grid
        self._gathered_rewards = torch.zeros(0, len(REWARD_NAMES))
        self.last_advantages: torch.Tensor | None = None  # the gathered advantages of the latest batch
        self._ratio_statistics = RatioStatistics()
        grpo_args: GRPOConfig = kwargs["args"]
        model_path = kwargs["model"] if isinstance(kwargs.get("model"), str) else None
        model_type = _checkpoint_model_type(model_path)
        # Captions are plain text: every special token but the stop tokens is masked at sampling.
        self.banned_tokens = banned_tokens(
            _tokenizer_of(kwargs["processing_class"]), _stop_tokens(model_path, kwargs["processing_class"])
        )
        ban = sampling_ban(self.banned_tokens, "vllm" if grpo_args.use_vllm else "transformers")
        grpo_args.generation_kwargs = {**(grpo_args.generation_kwargs or {}), **ban}
        engine = engine_kwargs(
            precision_of(grpo_args),
            image_grid.processor_kwargs() if image_grid is not None else None,
            model_type=model_type,
        )
        with vllm_engine_kwargs(**engine):
            super().__init__(*args, reward_funcs=scorer.reward_functions(), **kwargs)
        self.judge_overlap = TrlJudgeOverlap(self, judge_overlap)  # judging started as captions exist
        if self.use_vllm and model_type in RENAMED_TOWERS:
            self._sync_under_vllm_names()
        if self.use_vllm and self.vllm_mode == "server":
            self._check_served_image_tokens()

    def _sync_under_vllm_names(self) -> None:
        """TRL's weight sync sends each parameter under the name vLLM's model loads it by (LLaVA's CLIP tower:
        ``rollout_engine.vllm_param_name``); TRL's own prefix fixes first."""
        generation = self.vllm_generation
        fix = generation._fix_param_name_to_vllm

        def fixed(name: str, extra_prefixes: list[str] | None = None) -> str:
            return vllm_param_name(fix(name, extra_prefixes))

        generation._fix_param_name_to_vllm = fixed

    # 1b. Generation: each rollout's judge call started as the engine finishes it (judge_overlap), the
    # completions refused when one holds a masked special token (rollout_engine), the rest started.
    def _generate(self, prompts):
        with self.judge_overlap.watching(prompts):
            output = super()._generate(prompts)  # (prompt_ids, completion_ids, _, completions, ...)
        check_completions(output[1], self.banned_tokens)
        self.judge_overlap.settle(output[3])
        return output

    # 1. Rollouts: TRL samples the captions; a vLLM server must count image tokens as the trainer does.
    def _check_served_image_tokens(self) -> None:
        """Compare each image's token count from the vLLM server with the trainer's prompt, before TRL
        pairs them (TRL re-places the server's image features at the trainer's image-token runs without
        comparing their lengths)."""
        generation = self.vllm_generation
        place = generation._place_features
        image_token_id = self.processing_class.image_token_id
        command = server_command(
            self.model.name_or_path,
            precision_of(self.args),
            self.image_grid.processor_kwargs() if self.image_grid is not None else None,
        )

        def checked(features, prompt_ids):
            if features is not None:
                served = [int(p["length"]) for p in features["mm_placeholders"]["image"]]
                ours = image_token_runs(prompt_ids, image_token_id)
                if served != ours:
                    raise ConfigError(
                        f"the vLLM server made {served} image tokens where the trainer's processor made {ours}: "
                        f"its image processor has other pixel limits. Restart it with the trainer's: {command}"
                    )
            return place(features, prompt_ids)

        generation._place_features = checked

    # 0. Which prompts a batch holds: TRL's sampler, resumable across epochs.
    def _get_train_sampler(self, dataset=None):
        return EpochSeededRepeatSampler(
            data_source=dataset if dataset is not None else self.train_dataset,
            mini_repeat_count=self.num_generations,
            batch_size=self.args.generation_batch_size // self.num_generations,
            repeat_count=self.num_iterations * self.args.steps_per_generation,
            shuffle=self.shuffle_dataset,
            seed=self.args.seed,
            # Epochs completed (the integer part of a resumed run's fractional epoch).
            epoch_source=lambda: math.floor(self.state.epoch or 0),
        )

    @property
    def steps_per_batch(self) -> int:
        """Optimizer steps one generation batch feeds (updates per batch x PPO epochs)."""
        args = self.args
        return max(1, args.steps_per_generation * args.num_iterations // args.gradient_accumulation_steps)

    # 2. Rewards: TRL calls the three shared-verdict reward functions and gathers them over processes.
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        asked = time.perf_counter()
        self.judge_overlap.share_verdicts()  # server mode, several processes: each its rollouts' outcomes
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._gathered_rewards = rewards.detach()  # (N, 3), NaN = failed judge; checked against the records
        metrics = self._metrics["train" if self.model.training else "eval"]
        for key, value in self.judge_overlap.stage_metrics(asked).items():  # judge/wall_s, ...
            metrics[key].append(value)
        return rewards

    # 3. Advantages and metrics: the batch step (train/step.py) on every process's rollout records.
    def _generate_and_score_completions(self, inputs):
        self.scorer.begin_batch()
        self.judge_overlap.begin_batch(inputs)
        try:
            output = super()._generate_and_score_completions(inputs)  # steps 1 and 2, TRL's advantages
        finally:
            self.judge_overlap.begin_batch(None)
        if self.scorer.last_batch is None:
            raise RuntimeError("internal: the reward functions were not called for this batch")
        parts = gather_object([self.scorer.last_batch])  # in the order TRL gathered the rewards
        rollouts = [rollout for part in parts for rollout in part.rollouts]
        if [not r.judged for r in rollouts] != torch.isnan(self._gathered_rewards).all(dim=1).tolist():
            raise RuntimeError(
                "internal: the gathered rewards and the scored rollouts disagree (rows or failures); "
                "the shared verdict memo served another batch"
            )
        usage: dict[str, float] = {}
        for part in parts:
            for key, value in part.usage.items():
                usage[key] = usage.get(key, 0.0) + value
        # The stop rule, the advantages, the metrics: on the whole batch, identically on every process.
        step = self.batch_step(
            rollouts, [r.id for r in rollouts], judge_calls=sum(p.judge_calls for p in parts), usage=usage
        )
        self.last_advantages = step.advantages.to(
            output["advantages"].dtype
        )  # every process's, in TRL's dtype
        start = self.accelerator.process_index * len(inputs)
        output["advantages"] = self.last_advantages[start : start + len(inputs)].to(
            output["advantages"].device
        )
        self._log_batch(step, rollouts)
        return output

    def _log_batch(self, step: StepResult, rollouts: Sequence[RolloutRecord]) -> None:
        """The step's metrics (those TRL does not log itself), and every rollout when the recipe asks."""
        mode = "train" if self.model.training else "eval"
        for key, value in step.metrics.items():
            if key not in TRL_LOGGED:
                self._metrics[mode][key].append(value)
        # TRL's completion log holds its own advantages for this batch; show ours instead.
        logged = self._logs["advantages"]
        for _ in range(min(len(step.advantages), len(logged))):
            logged.pop()
        logged.extend(self.last_advantages.tolist())
        first = self.state.global_step + 1  # the first optimizer step this batch feeds
        log = self.rollout_log
        if log is not None and self.accelerator.is_main_process and log.wants(first, self.steps_per_batch):
            log.write(first, rollouts, step.advantages, step.group_index)

    # 4. Loss and update: TRL's, configured by train/loss.py; the ratio metrics TRL lacks are added.
    def _compute_loss(self, model, inputs):
        """TRL's loss, unchanged. Its PPO-clip share is logged under the shared name too; the current
        policy's log-probs it computes first (through whichever class provides them: TRL's, the packed
        rows', a test's stand-in) give the ratio metrics TRL lacks."""
        if not self.model.training:
            return super()._compute_loss(model, inputs)
        own = self.__dict__.get("_get_per_token_logps_and_entropies")  # an instance's stand-in stays
        compute = self._get_per_token_logps_and_entropies

        def first_call(*args: Any, **kwargs: Any):
            restore()
            result = compute(*args, **kwargs)
            self._record_ratios(result[0], inputs)
            return result

        def restore() -> None:
            self.__dict__.pop("_get_per_token_logps_and_entropies", None)
            if own is not None:
                self._get_per_token_logps_and_entropies = own

        self._get_per_token_logps_and_entropies = first_call
        try:
            loss = super()._compute_loss(model, inputs)
        finally:
            restore()
        if region := self._metrics["train"].get("clip_ratio/region_mean"):  # every recipe loss logs it
            self._metrics["train"]["policy/clipped_share"].append(region[-1])
        return loss

    def _record_ratios(self, logps: torch.Tensor, inputs: dict[str, Any]) -> None:
        mask = inputs["completion_mask"]
        if "tool_mask" in inputs:
            mask = mask * inputs["tool_mask"]
        old = inputs.get("old_per_token_logps")  # None: TRL skipped it, the batch is on-policy (ratio 1)
        sums = ratio_statistics(logps, old, inputs["advantages"], mask, self.args.delta)
        totals = self.accelerator.reduce(sums[[0, 1, 3]], reduction="sum")
        largest = self.accelerator.gather(sums[2:3]).max()
        self._ratio_statistics.add(torch.stack([totals[0], totals[1], largest, totals[2]]))

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "train_runtime" not in logs:  # a step's log, not the run's summary
            logs.update(self._ratio_statistics.pop())
        super().log(logs, start_time)

    # Resuming: load the checkpoint's weights through from_pretrained.
    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        """Restore weights from a checkpoint; fixes a silent no-op in transformers 5.23's Trainer.

        ``save_pretrained`` writes checkpoints with the architecture's *checkpoint* key names (for
        Qwen2.5-VL ``model.layers.*`` and ``visual.*``), but ``Trainer._load_from_checkpoint`` reads
        them back with a plain non-strict ``load_state_dict``, which matches none of them and only
        warns: the run would go on from the initial weights. ``from_pretrained`` applies the key
        conversion, so the weights are loaded through it and copied in strictly. FSDP, DeepSpeed and
        PEFT checkpoints have their own formats and keep the Trainer's path.
        """
        from peft import PeftModel

        model = model if model is not None else self.model
        weights = Path(resume_from_checkpoint) / "model.safetensors"
        sharded = Path(resume_from_checkpoint) / "model.safetensors.index.json"
        plain = not (self.is_fsdp_enabled or self.is_deepspeed_enabled or isinstance(model, PeftModel))
        if not plain or not (weights.is_file() or sharded.is_file()):
            return super()._load_from_checkpoint(resume_from_checkpoint, model)
        dtype = next(model.parameters()).dtype
        loaded = type(model).from_pretrained(resume_from_checkpoint, dtype=dtype, device_map=None)
        model.load_state_dict(loaded.state_dict(), strict=True)
        del loaded


# ---------------------------------------------------------------------------------- configuration


def batch_layout(recipe: Recipe, world_size: int) -> dict[str, int]:
    """Gradient accumulation and steps per generation for the recipe's batch, or a clear error.

    One RL batch = prompts_per_batch x rollouts_per_prompt captions, split into updates_per_batch
    optimizer steps of (per_device_batch_size x world_size x gradient_accumulation_steps) captions.
    """
    t, g = recipe.train, recipe.rollout.rollouts_per_prompt
    captions = t.prompts_per_batch * g
    if captions % t.updates_per_batch:
        raise ConfigError(
            f"train.prompts_per_batch x rollout.rollouts_per_prompt ({captions} captions) must split evenly into "
            f"train.updates_per_batch ({t.updates_per_batch}) optimizer steps"
        )
    per_update = captions // t.updates_per_batch
    if per_update % world_size:
        raise ConfigError(
            f"{per_update} captions per optimizer step do not split over {world_size} training processes; use a "
            f"number of processes dividing {per_update}, or change train.prompts_per_batch or "
            "train.updates_per_batch so that the processes divide it"
        )
    micro = t.per_device_batch_size * world_size
    if per_update % micro:
        raise ConfigError(
            f"{per_update} captions per optimizer step do not split into micro-batches of train.per_device_batch_size "
            f"({t.per_device_batch_size}) x {world_size} process(es); choose a per_device_batch_size dividing "
            f"{per_update // world_size}"
        )
    accumulation = per_update // micro
    return {
        "gradient_accumulation_steps": accumulation,
        "steps_per_generation": accumulation * t.updates_per_batch,
    }


def _check_report_to(report_to: Sequence[str]) -> None:
    import importlib.util

    packages = {"tensorboard": "tensorboard", "wandb": "wandb", "trackio": "trackio"}
    for sink in report_to:
        if importlib.util.find_spec(packages[sink]) is None:
            raise ConfigError(
                f"run.report_to includes {sink!r} but the {packages[sink]} package is not installed"
            )


def grpo_config(recipe: Recipe, world_size: int | None = None) -> GRPOConfig:
    """The ``GRPOConfig`` that realises the recipe (all values explicit; TRL defaults are not relied on)."""
    t, r, run = recipe.train, recipe.rollout, recipe.run
    # cpu= matters: a bare PartialState() on CPU reads torchrun's environment as a single process.
    world_size = world_size if world_size is not None else PartialState(cpu=t.use_cpu).num_processes
    _check_report_to(run.report_to)
    vllm = r.vllm
    kwargs: dict[str, Any] = dict(
        output_dir=str(Path(run.output_dir).expanduser()),
        # Model loading.
        model_init_kwargs=model_init_kwargs(recipe.model, world_size),
        trust_remote_code=recipe.model.trust_remote_code,
        # transformers 5.23 renamed these activation_checkpointing(_kwargs) and keeps the old names as
        # aliases; 5.17 (the one-node GPU set, vLLM < 0.33) knows only the old ones.
        gradient_checkpointing=recipe.model.gradient_checkpointing,
        gradient_checkpointing_kwargs={"use_reentrant": False}
        if recipe.model.gradient_checkpointing
        else None,
        # Batch: prompts_per_batch x G captions per RL batch.
        num_generations=r.rollouts_per_prompt,
        per_device_train_batch_size=t.per_device_batch_size,
        **batch_layout(recipe, world_size),
        num_iterations=t.ppo_epochs,
        shuffle_dataset=recipe.data.shuffle,
        # Sampling.
        max_completion_length=r.max_caption_tokens,
        temperature=r.temperature,
        top_p=r.top_p,
        top_k=r.top_k,
        repetition_penalty=r.repetition_penalty,
        mask_truncated_completions=t.mask_truncated_completions,
        # Rewards: three functions, weights of eq. 2.5 (TRL's own aggregation is replaced, see above).
        reward_weights=recipe.rewards.weights.as_list(),
        multi_objective_aggregation="normalize_then_sum"
        if recipe.advantage.estimator == "c_gdpo"
        else "sum_then_normalize",
        # Loss: dual-clip PPO, token-sum-sequence-mean, no KL.
        **trl_loss_settings(
            t.loss_aggregation, t.clip_epsilon, t.clip_epsilon_high, t.dual_clip_c, t.kl_beta
        ),
        # Optimisation.
        learning_rate=t.learning_rate,
        lr_scheduler_type=t.lr_scheduler,
        warmup_steps=int(t.warmup) if t.warmup >= 1 else t.warmup,
        num_train_epochs=t.epochs,
        max_steps=t.max_steps if t.max_steps is not None else -1,
        optim=t.optimizer,
        weight_decay=t.weight_decay,
        max_grad_norm=t.max_grad_norm,
        bf16=t.precision == "bf16",
        fp16=t.precision == "fp16",
        use_cpu=t.use_cpu,
        seed=t.seed,
        data_seed=t.seed,
        dataloader_num_workers=t.dataloader_num_workers,
        remove_unused_columns=False,
        # Checkpoints and logs: every step is logged (metrics.jsonl), progress is ours (rich).
        save_strategy="steps",
        save_steps=run.save_steps,
        save_total_limit=run.save_total_limit,
        save_only_model=False,
        logging_strategy="steps",
        logging_steps=1,
        report_to=list(run.report_to) or "none",
        run_name=run.run_name or recipe.name or Path(run.output_dir).name,
        disable_tqdm=True,
        log_completions=False,
        # Rollouts with vLLM.
        use_vllm=vllm.mode != "off",
    )
    if vllm.mode != "off":
        kwargs.update(
            vllm_mode=vllm.mode,
            vllm_gpu_memory_utilization=vllm.memory_share("trl"),
            vllm_tensor_parallel_size=vllm.tensor_parallel_size,
            vllm_enable_sleep_mode=vllm.enable_sleep_mode,
            vllm_max_model_length=vllm.max_model_length,
            vllm_server_base_url=vllm.server_base_url,
            vllm_server_host=vllm.server_host,
            vllm_server_port=vllm.server_port,
            vllm_server_timeout=vllm.server_timeout,
            vllm_importance_sampling_correction=vllm.importance_sampling_correction,
        )
    return build_config(GRPOConfig, kwargs, t.trl_overrides)


def build_trainer(
    recipe: Recipe,
    judge: Judge,
    *,
    callbacks: Sequence[TrainerCallback] = (),
    train_dataset: Any = None,
    processor: Any = None,
) -> BalancedGRPOTrainer:
    """A ready ``BalancedGRPOTrainer`` for ``recipe`` with ``judge`` (no files written but the run's own).

    ``train_dataset`` / ``processor`` default to the recipe's dataset folder and the policy's processor.
    """
    if recipe.rollout.vllm.mode != "off" and not vllm_generation.is_vllm_available():
        raise ConfigError(
            f"rollout.vllm.mode={recipe.rollout.vllm.mode} needs vLLM: pip install -e '.[trl,vllm]' -c "
            "constraints/gpu-one-node.txt (see docs/gpu.md), or set rollout.vllm.mode=off"
        )
    processor = processor if processor is not None else load_processor(recipe.model)
    tokenizer = getattr(processor, "tokenizer", processor)
    grid = image_grid(processor)
    if train_dataset is None:
        names = [recipe.model.path, str(getattr(tokenizer, "name_or_path", ""))]
        train_dataset = prepare_train_dataset(recipe.data, recipe.model.image, tokenizer, names, grid)
    if len(train_dataset) < recipe.train.prompts_per_batch:
        raise ConfigError(
            f"the dataset has {len(train_dataset)} training rows, fewer than train.prompts_per_batch "
            f"({recipe.train.prompts_per_batch}): not one batch can be formed"
        )
    args = grpo_config(recipe)
    rewards = recipe.rewards.reward_config()
    scorer = SharedVerdictScorer(judge, rewards, special_token_ids=tokenizer.all_special_ids)
    batch_step = BatchStep(
        AdvantageStep(tuple(rewards.weights.as_list()), recipe.advantage.estimator, recipe.advantage.eps),
        length_mode=rewards.length.mode,
        max_failed_batches_in_a_row=recipe.rewards.max_failed_batches_in_a_row,
    )
    output_dir = Path(args.output_dir)
    rollout_log = RolloutLog(output_dir / "rollouts.jsonl", recipe.run.log_rollouts_every)
    trainer_class = BalancedGRPOTrainer
    if recipe.train.padding_free:  # the log-prob passes on packed rows (train/packing.py)
        trainer_class = type("PackedBalancedGRPOTrainer", (PackedLogProbs, BalancedGRPOTrainer), {})
    trainer = trainer_class(
        model=recipe.model.path,
        args=args,
        train_dataset=train_dataset,
        processing_class=processor,
        peft_config=peft_config(recipe.model),
        scorer=scorer,
        batch_step=batch_step,
        rollout_log=rollout_log if recipe.run.log_rollouts_every else None,
        image_grid=grid,
        judge_overlap=recipe.train.judge_overlap,
    )
    # Logging: metrics.jsonl always; rich progress instead of tqdm and printed dicts.
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    trainer.add_callback(MetricsJsonlCallback(output_dir / "metrics.jsonl"))
    trainer.add_callback(ModelCardCallback(recipe))  # after TRL's generic card: ours replaces it
    if recipe.run.progress:
        trainer.add_callback(RichProgressCallback())
    if recipe.train.stop_after_step is not None:
        trainer.add_callback(StopAfterStep(recipe.train.stop_after_step))
    if recipe.model.vision_attention == "varlen_sdpa" and "flash" not in (
        recipe.model.attn_implementation or ""
    ):
        use_varlen_vision_attention(trainer.model)  # a flash implementation has its own varlen path
    if recipe.model.gradient_checkpointing and recipe.model.layers_without_recompute:
        keep_activations_on_enable(trainer.model, recipe.model.layers_without_recompute)
    for callback in callbacks:
        trainer.add_callback(callback)
    return trainer


# ------------------------------------------------------------------------------------------ a run


def _note(line: str) -> None:
    print(f"note: {line}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class TrainResult:
    output_dir: Path
    global_step: int
    metrics_path: Path
    final_model_dir: Path | None  # None when the run stopped early (train.stop_after_step)
    resumed_from: Path | None


def train(
    recipe: Recipe,
    judge: Judge,
    *,
    resume: bool | str | Path = False,
    allow_recipe_change: bool = False,
    callbacks: Sequence[TrainerCallback] = (),
) -> TrainResult:
    """Run the recipe in ``recipe.run.output_dir``: checkpoints, metrics.jsonl, final model.

    ``resume``: False for a fresh run (refused if the folder already holds checkpoints), True for the
    newest checkpoint in the folder, or a checkpoint path.
    """
    output_dir = Path(recipe.run.output_dir).expanduser()
    if not recipe.train.use_cpu:
        check_driver()  # before torch decides there is no GPU (an old driver) and trains on the CPU
    state = PartialState(cpu=recipe.train.use_cpu)
    grpo_config(
        recipe, state.num_processes
    )  # every value, pass-through ones too, before recipe.yaml is written
    checkpoint = resolve_resume(output_dir, resume, report=_note if state.is_main_process else None)
    if checkpoint is not None:
        check_resumable(output_dir, recipe, allow_recipe_change)
        if state.is_main_process:
            truncate_logs(output_dir, checkpoint_step(checkpoint))
    elif state.is_main_process:
        write_recipe_snapshot(output_dir, recipe)
    state.wait_for_everyone()

    trainer = build_trainer(recipe, judge, callbacks=callbacks)
    trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint is not None else None)

    finished = trainer.state.global_step >= trainer.state.max_steps
    final_dir = None
    if finished and recipe.run.save_final_model:
        final_dir = output_dir / "final"
        save_final_model(trainer, final_dir)  # whole weights even from sharded checkpoints
        if trainer.is_world_process_zero():
            write_model_card(final_dir, recipe, trainer.state.global_step)
    return TrainResult(
        output_dir=output_dir,
        global_step=trainer.state.global_step,
        metrics_path=output_dir / "metrics.jsonl",
        final_model_dir=final_dir,
        resumed_from=checkpoint,
    )
