"""Per-step metrics: what is computed from a batch of rollout records, and where it is written.

Both backends log one vocabulary, computed here by :func:`batch_metrics` from the batch step
(``train/step.py``). TRL also logs each reward's mean and std itself under the same names (the TRL
trainer leaves those to it), and the loss, clip ratios and completion lengths. The names:

    rewards/{precision,recall,linguistic}/{mean,std}   over judged rollouts; linguistic after the mask
    rewards/linguistic_unmasked/mean   the judge's linguistic score before the length mask
    rewards/total/mean                 sum_k w_k r_k over judged rollouts (eq. 2.5's weights), when given
    length/caption_tokens_mean         caption length in the policy's tokens
    length/reference_tokens_mean
    length/ratio_mean                  rho = caption / reference tokens
    length/out_of_band_share           share of rollouts with rho outside [tau_low, tau_high]
    length/masked_share                share of judged rollouts whose linguistic reward the mask zeroed
    length/penalty_mean                linear length penalty (mode "linear")
    assertions/non_pointable_share     meta-commentary (mean over judged rollouts)
    assertions/non_visible_share       hallucination (pointable but not visible)
    assertions/per_caption_mean
    judge/requests                     rollouts judged this step
    judge/failures, judge/failure_share, judge/failures/<reason>
    judge/truncated_input_share
    advantages/mean, advantages/std, advantages/zero_share
    groups/{precision,recall,linguistic,all}_flat_share
    judge/calls, judge/usage/<counter> TRL only: judge_batch calls and the judge's accounting (tokens,
                                       cost, ...) this step; verl's reward workers call the judge apart

Every step's metrics go to ``OUTPUT/metrics.jsonl`` on TRL (one JSON object a line, appended and
fsynced, so a crash loses at most the line being written), and to TensorBoard / W&B when the recipe
names them (through TRL's ``report_to``); verl hands them to its own loggers.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, get_args

import torch
from transformers import TrainerCallback

from balcaprl.files import jsonl_lines, naming
from balcaprl.judge.protocol import FailureReason
from balcaprl.progress import Progress
from balcaprl.rewards import REWARD_NAMES, LengthMode, RolloutRecord

KNOWN_FAILURE_REASONS = (*get_args(FailureReason), "judge_exception")


def _known(values: Sequence[float | None]) -> list[float]:
    return [float(v) for v in values if v is not None and not math.isnan(v)]


def _mean(values: Sequence[float | None]) -> float:
    kept = _known(values)
    return statistics.fmean(kept) if kept else math.nan


def _std(values: Sequence[float]) -> float:
    kept = _known(values)
    return statistics.stdev(kept) if len(kept) >= 2 else math.nan  # unbiased, as TRL's nanstd


def batch_metrics(
    rollouts: Sequence[RolloutRecord],
    group_ids: Sequence[str],
    advantages: torch.Tensor,
    *,
    length_mode: LengthMode,
    judge_calls: int | None = None,
    usage: Mapping[str, float] | None = None,
    weights: Sequence[float] | None = None,
) -> dict[str, float]:
    """Metrics of one batch (all processes gathered). NaN where undefined (the loggers drop NaN).
    ``weights``: (w_prec, w_rec, w_ling), for the total reward the advantages weigh."""
    judged = [r for r in rollouts if r.judged]
    n = len(rollouts)
    metrics: dict[str, float] = {}
    for name in REWARD_NAMES:
        values = [getattr(r, name) for r in judged]
        metrics[f"rewards/{name}/mean"] = _mean(values)
        metrics[f"rewards/{name}/std"] = _std(values)
    if weights is not None:  # eq. 2.5: sum_k w_k r_k, per judged rollout
        totals = [
            sum(w * getattr(r, name) for w, name in zip(weights, REWARD_NAMES, strict=True)) for r in judged
        ]
        metrics["rewards/total/mean"] = _mean(totals)
    metrics |= {
        "rewards/linguistic_unmasked/mean": _mean([r.linguistic_raw for r in judged]),
        "length/caption_tokens_mean": _mean([r.caption_tokens for r in rollouts]),
        "length/reference_tokens_mean": _mean([r.reference_tokens for r in rollouts]),
        "length/ratio_mean": _mean([r.length_ratio for r in rollouts]),
        "length/out_of_band_share": _mean(
            [None if r.in_band is None else float(not r.in_band) for r in rollouts]
        ),
        "length/masked_share": _mean([float(r.masked) for r in judged]) if length_mode == "mask" else 0.0,
        "length/penalty_mean": _mean([r.length_penalty for r in rollouts]),
        "assertions/non_pointable_share": _mean([r.non_pointable_share for r in judged]),
        "assertions/non_visible_share": _mean([r.non_visible_share for r in judged]),
        "assertions/per_caption_mean": _mean([r.n_caption_assertions for r in judged]),
        "judge/requests": float(n),
        "judge/failures": float(n - len(judged)),
        "judge/failure_share": (n - len(judged)) / n if n else math.nan,
        "judge/truncated_input_share": _mean([float(r.truncated_input) for r in judged]),
        "advantages/mean": float(advantages.double().mean()) if n else math.nan,
        "advantages/std": float(advantages.double().std()) if n > 1 else math.nan,
        "advantages/zero_share": float((advantages == 0).double().mean()) if n else math.nan,
    }
    metrics.update(flat_group_shares([(g, r) for g, r in zip(group_ids, rollouts, strict=True) if r.judged]))
    reasons = {r.failure for r in rollouts if not r.judged}
    for reason in sorted(set(KNOWN_FAILURE_REASONS) | reasons):
        metrics[f"judge/failures/{reason}"] = float(sum(r.failure == reason for r in rollouts))
    if judge_calls is not None:
        metrics["judge/calls"] = float(judge_calls)
    for key, value in (usage or {}).items():
        metrics[f"judge/usage/{key}"] = float(value)
    return metrics


def flat_group_shares(judged: Sequence[tuple[str, RolloutRecord]]) -> dict[str, float]:
    """Among prompts with at least two judged rollouts ((group id, record) pairs): the share whose
    reward is the same for all of them (no relative signal from that reward, eq. 2.4 gives 0), per
    reward, and the share where all three are. TRL's own ``frac_reward_zero_std`` looks at the
    batch-normalised sum and misses these."""
    by_prompt: dict[str, list[RolloutRecord]] = {}
    for group, record in judged:
        by_prompt.setdefault(str(group), []).append(record)
    groups = [rollouts for rollouts in by_prompt.values() if len(rollouts) >= 2]
    if not groups:
        return {
            **{f"groups/{name}_flat_share": math.nan for name in REWARD_NAMES},
            "groups/all_flat_share": math.nan,
        }

    def flat(rollouts: list[RolloutRecord], name: str) -> bool:
        return len({getattr(r, name) for r in rollouts}) == 1

    shares = {
        f"groups/{name}_flat_share": _mean([float(flat(g, name)) for g in groups]) for name in REWARD_NAMES
    }
    shares["groups/all_flat_share"] = _mean(
        [float(all(flat(g, name) for name in REWARD_NAMES)) for g in groups]
    )
    return shares


# -- files -------------------------------------------------------------------------------------------


def append_jsonl(path: Path, record: Mapping[str, Any]) -> None:
    """Append one JSON line and fsync it: a crash never leaves a half-written earlier line."""
    line = json.dumps(record, allow_nan=False, default=str) + "\n"
    with naming(path), open(path, "a", encoding="utf-8") as handle:  # a full disk names the file
        handle.write(line)
        handle.flush()
        os.fsync(handle.fileno())


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every complete line of a JSONL file (a torn last line, from a crash, is skipped)."""
    if not Path(path).exists():
        return []
    records = []
    for line in jsonl_lines(Path(path).read_text(encoding="utf-8")):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class MetricsJsonlCallback(TrainerCallback):
    """Writes each TRL log (one per optimizer step with logging_steps=1) to ``metrics.jsonl``."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        kind = "summary" if "train_runtime" in logs else "step"
        record = {"step": state.global_step, "kind": kind, "epoch": state.epoch, "time": time.time()}
        record.update({k: _finite(v) for k, v in logs.items()})
        self.path.parent.mkdir(parents=True, exist_ok=True)
        append_jsonl(self.path, record)


class RolloutLog:
    """``rollouts.jsonl``: every rollout of every Nth step (caption, rewards, failure, advantage).

    One generation batch feeds ``span`` optimizer steps (updates per batch x PPO epochs); it is
    logged, under the first step it feeds, when one of those steps is a multiple of N, and so is a
    run's first batch (the captions before RL, and something to inspect in a run shorter than N).
    """

    def __init__(self, path: Path, every: int):
        self.path = Path(path)
        self.every = every

    def wants(self, first_step: int, span: int = 1) -> bool:
        """Whether the batch feeding steps ``first_step .. first_step + span - 1`` is logged."""
        if self.every <= 0:
            return False
        return first_step == 1 or (first_step + span - 1) // self.every > (first_step - 1) // self.every

    def write(
        self, step: int, rollouts: Sequence[RolloutRecord], advantages: torch.Tensor, groups: torch.Tensor
    ):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lines = []
        for rollout, advantage, group in zip(rollouts, advantages.tolist(), groups.tolist(), strict=True):
            row = {"step": step, "group": int(group), "advantage": float(advantage)}
            row.update({k: _finite(v) for k, v in rollout.row().items()})
            lines.append(json.dumps(row, default=str))
        with naming(self.path), open(self.path, "a", encoding="utf-8") as handle:
            handle.write("\n".join(lines) + "\n")
            handle.flush()
            os.fsync(handle.fileno())


# -- progress ------------------------------------------------------------------------------------------


def _fmt(logs: Mapping[str, Any], key: str, spec: str = ".3f") -> str:
    value = logs.get(key)
    return "-" if value is None else format(value, spec)


# Printed once when training starts: what the step lines' figures are, and why the loss may be large
# and negative (a new user took -6.37 for divergence).
STEP_LINE_LEGEND = (
    "step lines: P R L = mean precision, recall, linguistic reward (L after the length mask);",
    "  len = mean caption tokens, (x0.97) = caption / reference length (the length band's rho);",
    "  masked = share of judged captions whose L the length mask zeroed; fail = judge failures;",
    "  loss = the policy loss summed over each caption's tokens (token-sum-sequence-mean): it grows",
    "  with caption length and is negative when longer captions get the positive advantages, so",
    "  values like -6 are expected, not a divergence;",
    "  'same batch as step N': a later update on the batch judged at step N (train.updates_per_batch",
    "  updates a batch; only its first judges captions, so the later ones log no rewards).",
)


class RichProgressCallback(TrainerCallback):
    """Progress over optimizer steps (``balcaprl.progress``: a bar on a terminal, plain lines in a log),
    the legend once, and one summary line per logged step with elapsed time and ETA."""

    def __init__(self, **progress_options: Any):
        self.progress_options = {"stream": sys.stdout, "interval_s": 60, **progress_options}  # a test's clock
        self.progress = None
        self.judged_step: int | None = None  # the last step that judged a batch

    def on_train_begin(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        self.progress = Progress(
            "balcaprl train", total=state.max_steps, unit="steps", **self.progress_options
        )
        self.progress.completed = state.global_step  # a resumed run's ETA counts this run's steps only
        self.progress.start()
        for line in STEP_LINE_LEGEND:
            self.progress.log(line)

    def on_step_end(self, args, state, control, **kwargs):
        if self.progress is not None:
            self.progress.completed = state.global_step

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.progress is None or not logs or "train_runtime" in logs:
            return
        if "rewards/precision/mean" not in logs and self.judged_step is not None:
            update = state.global_step - self.judged_step + 1
            self.progress.log(
                f"step {state.global_step:>5}  same batch as step {self.judged_step} (update {update}, no new "
                f"rewards)  loss {_fmt(logs, 'loss', '.4f')}  {self.progress.timing()}"
            )
            return
        if "rewards/precision/mean" in logs:
            self.judged_step = state.global_step
        line = (
            f"step {state.global_step:>5}  "
            f"P {_fmt(logs, 'rewards/precision/mean')}  R {_fmt(logs, 'rewards/recall/mean')}  "
            f"L {_fmt(logs, 'rewards/linguistic/mean')}  "
            f"len {_fmt(logs, 'length/caption_tokens_mean', '.0f')} tok (x{_fmt(logs, 'length/ratio_mean', '.2f')})  "
            f"masked {_fmt(logs, 'length/masked_share', '.0%')}  "
            f"fail {_fmt(logs, 'judge/failures', '.0f')}  loss {_fmt(logs, 'loss', '.4f')}  "
            f"{self.progress.timing()}"
        )
        self.progress.log(line)

    def on_train_end(self, args, state, control, **kwargs):
        if self.progress is not None:
            self.progress.close()
            self.progress = None
