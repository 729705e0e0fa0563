"""Judging rollouts: one plain function both training backends call (TRL's reward functions through
``train/rewards.py``, verl's ``compute_score`` through ``verl_backend/reward.py``).

For every rollout :func:`judge_rollouts`
1. sends one ``JudgeRequest(image, caption, reference, rubric)``: the training rubric, or for the
   "w/o pointability" ablation (``RewardConfig.pointability = False``) the training rubric with the
   pointability test removed from the judge's prompt, as the paper's ablation removes it
   (:func:`~balcaprl.judge.rubrics.training_rubric_name`);
2. makes the rollout's record under the recipe's :class:`~balcaprl.rewards.RewardConfig`
   (:func:`~balcaprl.rewards.score_rollout`: eq. 2.3 with its pointability rule, the length mask on
   the linguistic reward, Sec. 2.3, and the linear length penalty of eq. A.5 when chosen).

A failed judge (``JudgeFailure``, or an exception from the judge) gives a failed record, NaN in all
three rewards, never 0: the advantage step leaves the rollout out. So does a rollout whose caption,
reference or image name is not valid Unicode (a lone surrogate that a JSON escape put into a dataset
row): it fails as ``bad_input`` naming the text and the row, and is never sent to the judge.

One failure is the run's, not the rollout's: an endpoint that rejects the judge's key (401/403) or
model (404) raises a :class:`~balcaprl.errors.UserError`; its rollouts are marked ``judge_rejected``
and the batch step stops the run on them at once
(:meth:`~balcaprl.train.step.BatchStep.check_failures`). The caption's length is counted with the
policy's tokenizer by the caller (:func:`count_caption_tokens` on generated ids).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from balcaprl.errors import UserError
from balcaprl.judge.protocol import (
    Judge,
    JudgeFailure,
    Judgement,
    JudgeOutcome,
    JudgeRequest,
    sendable_requests,
)
from balcaprl.judge.rubrics import training_rubric_name
from balcaprl.rewards import RewardConfig, RolloutRecord, failed_rollout, score_rollout

logger = logging.getLogger(__name__)

# Failure reason recorded when the judge raised instead of returning a JudgeFailure.
JUDGE_EXCEPTION = "judge_exception"
# Failure reason of every rollout of a batch whose judge raised a UserError: the endpoint rejected the
# key, the permissions or the model; no later batch can do better, so the run stops on it.
JUDGE_REJECTED = "judge_rejected"


@dataclass(frozen=True)
class RolloutToJudge:
    """One generated caption with what judging it needs."""

    id: str  # the prompt's dataset row id
    caption: str
    caption_tokens: int  # policy tokenizer, special tokens excluded
    image: str
    reference: str
    reference_tokens: int  # policy tokenizer (see train/data.py)


@dataclass(frozen=True)
class JudgedRollouts:
    """What judging a batch of rollouts gives back: their records, in order, and the judge usage it
    spent (counters such as ``prompt_tokens``, ``calls``, ``estimated_cost_usd``; see
    :func:`counted_judge_batch`)."""

    records: list[RolloutRecord]
    usage: dict[str, float]


def judge_requests(rollouts: Sequence[RolloutToJudge], rewards: RewardConfig) -> list[JudgeRequest]:
    """The judge request of each rollout: its image, caption and reference under the rubric the reward
    config asks for (the one place requests are made: judging now or early, ``train/early_judge.py``)."""
    rubric = training_rubric_name(rewards.pointability)  # what the judge is asked to apply
    return [JudgeRequest(image=r.image, caption=r.caption, reference=r.reference, rubric=rubric)
            for r in rollouts]  # fmt: skip


async def judge_rollouts(
    judge: Judge, rollouts: Sequence[RolloutToJudge], rewards: RewardConfig
) -> JudgedRollouts:
    """One judge call for ``rollouts``; their records, in order, and the usage spent."""
    requests = judge_requests(rollouts, rewards)
    # a text that is not valid Unicode (a lone surrogate in a dataset's reference) fails its rollout
    # as bad_input, never sent: the judge would score it with the surrogate replaced
    batch = sendable_requests(requests, [f"row {r.id!r}" for r in rollouts])
    outcomes, usage = await _outcomes(judge, batch.sent) if batch.sent else ([], {})
    records = [_record(rollout, outcome, rewards)
               for rollout, outcome in zip(rollouts, batch.outcomes(outcomes), strict=True)]  # fmt: skip
    return JudgedRollouts(records, usage)


async def _outcomes(
    judge: Judge, requests: list[JudgeRequest]
) -> tuple[list[JudgeOutcome], dict[str, float]]:
    try:
        outcomes, usage = await counted_judge_batch(judge, requests)
    except UserError as err:  # not this batch's failure but the configuration's: the step stops the run
        return [JudgeFailure(JUDGE_REJECTED, str(err))] * len(requests), {}  # type: ignore[arg-type]
    except Exception as err:  # a judge should return failures, but a crash must not become a reward
        logger.exception("the judge raised on a batch of %d rollouts; they count as failed", len(requests))
        return [JudgeFailure(JUDGE_EXCEPTION, f"{type(err).__name__}: {err}")] * len(requests), {}
    if len(outcomes) != len(requests):
        raise RuntimeError(
            f"{type(judge).__name__}.judge_batch returned {len(outcomes)} outcomes for {len(requests)} "
            "requests; the Judge protocol requires exactly one outcome per request, in order"
        )
    return outcomes, usage


# ------------------------------------------------------------------------------ judge usage, counted


class UsageMeter:
    """A judge's cumulative counters (:func:`judge_usage`), read as differences: :meth:`since_last` is
    what was spent since the meter last read them, so batches in flight together are counted once."""

    def __init__(self, judge: Judge):
        self.judge = judge
        self._seen = judge_usage(judge)

    def since_last(self) -> dict[str, float]:
        now, seen = judge_usage(self.judge), self._seen
        self._seen = now
        return {key: value - seen.get(key, 0.0) for key, value in now.items()}


async def counted_judge_batch(
    judge: Judge, requests: Sequence[JudgeRequest], meter: UsageMeter | None = None
) -> tuple[list[JudgeOutcome], dict[str, float]]:
    """``judge.judge_batch(requests)`` and the usage it spent, one dict of counters whatever the judge:
    its own count (``judge_batch_counted``, e.g. an :class:`~balcaprl.train.early_judge.EarlyJudge`),
    else its per-batch stats (``judge_batch_with_stats``, priced by ``judge.config``), else the change
    of its cumulative counters (``meter``: one shared by batches that run together)."""
    counted = getattr(judge, "judge_batch_counted", None)
    if counted is not None:
        outcomes, usage = await counted(requests)
        return list(outcomes), dict(usage)
    with_stats = getattr(judge, "judge_batch_with_stats", None)
    if with_stats is not None:
        result = await with_stats(requests)
        prices = getattr(getattr(judge, "config", None), "price_per_million_tokens", None)
        return list(result.outcomes), _numbers(result.stats.as_dict(prices))
    meter = meter if meter is not None else UsageMeter(judge)
    outcomes = list(await judge.judge_batch(requests))
    return outcomes, meter.since_last()


def _record(rollout: RolloutToJudge, outcome: JudgeOutcome, rewards: RewardConfig) -> RolloutRecord:
    identity = {"id": rollout.id, "caption": rollout.caption}
    counts = (rollout.caption_tokens, rollout.reference_tokens)
    if isinstance(outcome, JudgeFailure):
        return failed_rollout(outcome.reason, outcome.detail, rewards, *counts, **identity)
    if not isinstance(outcome, Judgement):
        raise TypeError(f"judge outcome must be a Judgement or a JudgeFailure, got {type(outcome).__name__}")
    return score_rollout(
        outcome.verdict, rewards, *counts, **identity, truncated_input=outcome.truncated_input
    )


def count_caption_tokens(token_ids: Sequence[int], special_token_ids: frozenset[int]) -> int:
    """Caption length in the policy's tokens: generated ids minus special ones (EOS, padding)."""
    return sum(1 for t in token_ids if int(t) not in special_token_ids)


def caption_text(completion: Any) -> str:
    """The caption of a completion: a string, or a conversational ``[{"role": "assistant", ...}]``."""
    if isinstance(completion, str):
        return completion.strip()
    if isinstance(completion, list) and completion:
        content = completion[-1].get("content", "")
        if isinstance(content, list):  # structured content blocks
            content = "".join(part.get("text", "") for part in content if part.get("type") == "text")
        return str(content).strip()
    raise TypeError(f"unexpected completion format: {type(completion).__name__}")


def judge_usage(judge: Judge) -> dict[str, float]:
    """Cumulative accounting a judge offers (tokens, cost, cache hits, ...), else ``{}``.

    Duck-typed so any judge can take part: a ``usage()`` method or ``usage`` mapping of cumulative
    numeric counters, or (``balcaprl.judge.OpenAICompatibleJudge``) a ``stats`` object with
    ``as_dict(prices)``, priced with ``judge.config.price_per_million_tokens`` when set. The TRL trainer
    logs per-step differences under ``judge/usage/<name>``.
    """
    usage = getattr(judge, "usage", None)
    if callable(usage):
        usage = usage()
    if usage is None and hasattr(getattr(judge, "stats", None), "as_dict"):
        prices = getattr(getattr(judge, "config", None), "price_per_million_tokens", None)
        usage = judge.stats.as_dict(prices)
    return _numbers(usage) if isinstance(usage, Mapping) else {}


def _numbers(counters: Mapping[str, Any]) -> dict[str, float]:
    return {
        str(k): float(v)
        for k, v in counters.items()
        if isinstance(v, int | float) and not isinstance(v, bool)
    }
