"""One training batch on either backend: rollout records in, advantages and metrics out.

The TRL trainer (``trl_backend.py``, after TRL generated and rewarded a batch) and verl's advantage
step (``verl_backend/trainer.py``, after verl's reward loop) each make the batch's
:class:`~balcaprl.rewards.RolloutRecord` list and call :class:`BatchStep` with it, so the stop rule,
the advantages and the metric names are the same code on both:

1. guard: the judge failed on every rollout of ``max_failed_batches_in_a_row`` batches in a row -> stop;
   the endpoint rejected the judge's key or model (``judge_rejected``) -> stop at once, one line;
2. the (N, 3) rewards (NaN = failed judge), each rollout's p_len and prompt group;
3. the recipe's estimator (eqs. 2.4-2.6, or the 'w/o c-GDPO' ablation), then eq. A.5 (``advantages.py``);
4. the batch's metrics, one vocabulary for both backends (``metrics.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from balcaprl.errors import ConfigError
from balcaprl.rewards import LengthMode, RolloutRecord
from balcaprl.train.advantages import AdvantageStep, group_index_from_ids
from balcaprl.train.judging import JUDGE_REJECTED
from balcaprl.train.metrics import batch_metrics

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepResult:
    advantages: torch.Tensor  # (N,) float64, 0 for a failed rollout
    group_index: torch.Tensor  # (N,) the prompt group of each rollout
    metrics: dict[str, float]


def reward_table(rollouts: Sequence[RolloutRecord]) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, 3) float64 rewards in REWARD_NAMES order (NaN = failed judge) and (N,) p_len."""
    rewards = torch.tensor([r.as_tuple() for r in rollouts], dtype=torch.float64).reshape(-1, 3)
    penalty = torch.tensor([r.length_penalty for r in rollouts], dtype=torch.float64)
    return rewards, penalty


@dataclass
class BatchStep:
    """The recipe's batch step, and the count of consecutive fully failed batches it stops on.

    Args:
        advantage: the recipe's estimator, weights and eps.
        length_mode: the recipe's length control (the masked share is 0 outside mode "mask").
        max_failed_batches_in_a_row: raise after this many consecutive batches whose every rollout failed.
    """

    advantage: AdvantageStep
    length_mode: LengthMode = "mask"
    max_failed_batches_in_a_row: int = 3
    failed_in_a_row: int = field(default=0, init=False)

    def __call__(
        self,
        rollouts: Sequence[RolloutRecord],
        group_ids: Sequence[str],
        *,
        judge_calls: int | None = None,
        usage: Mapping[str, float] | None = None,
    ) -> StepResult:
        """One batch, all processes gathered. ``judge_calls`` and ``usage``: where the backend counts them."""
        self.check_failures(rollouts)  # 1
        rewards, penalty = reward_table(rollouts)  # 2
        group_index = group_index_from_ids(group_ids)
        advantages = self.advantage(rewards, group_index, penalty)  # 3
        metrics = batch_metrics(  # 4
            rollouts,
            group_ids,
            advantages,
            length_mode=self.length_mode,
            judge_calls=judge_calls,
            usage=usage,
            weights=self.advantage.weights,
        )
        return StepResult(advantages, group_index, metrics)

    def check_failures(self, rollouts: Sequence[RolloutRecord]) -> None:
        """Count a batch whose every rollout failed; raise after ``max_failed_batches_in_a_row`` in a row.

        Judged on the whole batch (every process's share gathered), so that all processes stop together
        and one process's share of a batch is not a batch. A rollout the endpoint refused
        (``judge_rejected``) stops the run at once, before this batch's update, with the judge's one
        line (:class:`~balcaprl.errors.ConfigError`: exit status 2)."""
        rejected = next((r.failure_detail for r in rollouts if r.failure == JUDGE_REJECTED), None)
        if rejected is not None:
            raise ConfigError(
                f"{rejected}; training stopped before this batch's update: fix the judge, then run again "
                "(--resume continues from the newest checkpoint, if one was written; none is removed)"
            )
        if not rollouts or any(r.judged for r in rollouts):
            self.failed_in_a_row = 0
            return
        self.failed_in_a_row += 1
        reasons = sorted({str(r.failure) for r in rollouts})
        logger.warning("the judge failed on all %d rollouts of this batch (%s)", len(rollouts), reasons)
        if self.failed_in_a_row >= self.max_failed_batches_in_a_row:
            detail = next((r.failure_detail for r in rollouts if r.failure_detail), "")
            raise RuntimeError(
                f"the judge failed on every rollout of {self.failed_in_a_row} batches in a row (reasons: "
                f"{', '.join(reasons)}; e.g. {detail!r}). Check the judge endpoint, then resume: --resume "
                "(TRL), or restart (verl resumes from the newest checkpoint, trainer.resume_mode=auto)."
            )
