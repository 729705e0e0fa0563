"""Outcomes -> numbers: the (N, 3) reward tensor, with NaN for a failed judge (never 0).

NaN, not 0, because a failure says nothing about the caption: c-GDPO leaves a NaN reward out of its
group statistics and gives it advantage 0, whereas a 0 would punish the rollout for the judge's
timeout. An *empty* caption is different: it is a real, maximally bad caption, so it scores 0 on all
three rewards, without a judge call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from balcaprl.judge.protocol import JudgeFailure, Judgement, JudgeOutcome
from balcaprl.rewards import (
    BCAPSCORE_REWARDS,
    REWARD_NAMES,
    ReferenceAssertion,
    RewardConfig,
    Verdict,
    score_rollout,
)

EMPTY_CAPTION_EXPLANATION = "empty caption: scored 0 on every reward without a judge call"


def judgement_from_verdict(verdict: Verdict, truncated_input: bool = False) -> Judgement:
    return Judgement(verdict=verdict, truncated_input=truncated_input)


def empty_caption_judgement(reference: str) -> Judgement:
    """precision 0 (no assertion), recall 0, linguistic 0 (all three scores at the scale's floor, 1).

    The reference is not decomposed (that would need a call); it stands as one uncovered assertion,
    so ``rewards.n_reference_assertions`` is 1 here and means "not decomposed".
    """
    verdict = Verdict(
        caption_assertions=[],
        reference_assertions=[
            ReferenceAssertion(text=reference.strip() or "(empty reference)", covered=False)
        ],
        clarity=1,
        fluency=1,
        coherency=1,
        explanation=EMPTY_CAPTION_EXPLANATION,
    )
    return judgement_from_verdict(verdict)


if TYPE_CHECKING:  # torch only where rewards become a tensor: the judge's path (score) never needs it
    import torch


def rewards_tensor(
    outcomes: Sequence[JudgeOutcome],
    dtype: torch.dtype | None = None,
    rewards: RewardConfig = BCAPSCORE_REWARDS,
    caption_tokens: Sequence[int] | None = None,
    reference_tokens: Sequence[int] | None = None,
) -> torch.Tensor:
    """``(N, 3)`` rewards in the column order of ``REWARD_NAMES`` (precision, recall, linguistic), each
    verdict scored with ``score_rollout`` under ``rewards`` (by default the metric's rule: pointability
    on, no length control); a :class:`JudgeFailure` row is all NaN. A length-controlled config needs
    the token counts (policy tokens) of every caption and reference. ``dtype``: float32 by default."""
    import torch

    dtype = torch.float32 if dtype is None else dtype
    lengths: list[tuple[int | None, int | None]] = [(None, None)] * len(outcomes)
    if caption_tokens is not None or reference_tokens is not None:
        if caption_tokens is None or reference_tokens is None:
            raise ValueError("give caption_tokens and reference_tokens together")
        lengths = list(zip(caption_tokens, reference_tokens, strict=True))
        if len(lengths) != len(outcomes):
            raise ValueError(f"{len(lengths)} token counts for {len(outcomes)} outcomes")
    rows = torch.full((len(outcomes), len(REWARD_NAMES)), float("nan"), dtype=dtype)
    for i, (outcome, (n_caption, n_reference)) in enumerate(zip(outcomes, lengths, strict=True)):
        if isinstance(outcome, Judgement):
            scores = score_rollout(outcome.verdict, rewards, n_caption, n_reference)
            rows[i] = torch.tensor(scores.as_tuple(), dtype=dtype)
        elif not isinstance(outcome, JudgeFailure):
            raise TypeError(f"outcome {i} is a {type(outcome).__name__}, expected Judgement or JudgeFailure")
    return rows
