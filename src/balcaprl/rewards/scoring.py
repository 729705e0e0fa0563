"""Verdict -> rewards: the paper's precision, recall and linguistic rewards (Sec. 2.1, eq. 2.3).

:func:`score_verdict` is the pinned public arithmetic; :func:`balcaprl.rewards.record.score_rollout`
adds a recipe's length control and makes the rollout's record, which every consumer reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from balcaprl.rewards.verdict import Verdict, parse_verdict

# Order of the K = 3 reward columns everywhere (reward tensors, weights, configs, metrics).
REWARD_NAMES = ("precision", "recall", "linguistic")


@dataclass(frozen=True)
class RewardVector:
    """The three rewards of one verdict, each in [0, 1], plus counts the training logs report."""

    precision: float
    recall: float
    linguistic: float
    n_caption_assertions: int
    n_reference_assertions: int
    non_pointable_share: float  # meta-commentary: share of caption assertions nobody could point at
    non_visible_share: float  # hallucination: share of pointable caption assertions that are false

    def as_tuple(self) -> tuple[float, float, float]:
        return (self.precision, self.recall, self.linguistic)


def score_verdict(verdict: Verdict | dict[str, Any], pointability: bool = True) -> RewardVector:
    """Turn a verdict into the rewards of eq. 2.3 and the recall/linguistic definitions of Sec. 2.1.

    ``pointability=False`` is the paper's "w/o pointability" ablation: a caption assertion counts as
    correct when it is visible, whatever its pointability.
    Raises :class:`~balcaprl.rewards.verdict.VerdictError` if the verdict breaks the schema.
    """
    v = parse_verdict(verdict)
    caption = v.caption_assertions
    n_caption = len(caption)
    n_pointable = sum(a.pointable for a in caption)

    # A+ = A_G ∩ A_P (eq. 2.3); R_prec = |A+| / |A|, and 0 for a caption with no assertion at all.
    if pointability:
        n_true = sum(a.pointable and a.visible for a in caption)
    else:
        n_true = sum(a.visible for a in caption)
    precision = n_true / n_caption if n_caption else 0.0

    # R_rec = |Q| / |O|: Q the reference assertions the caption covers. O is never empty (schema).
    recall = sum(a.covered for a in v.reference_assertions) / len(v.reference_assertions)

    # Each of clarity, fluency, coherency mapped from 1..10 onto [0, 1], then averaged.
    linguistic = sum((s - 1) / 9 for s in (v.clarity, v.fluency, v.coherency)) / 3

    return RewardVector(
        precision=precision,
        recall=recall,
        linguistic=linguistic,
        n_caption_assertions=n_caption,
        n_reference_assertions=len(v.reference_assertions),
        non_pointable_share=(n_caption - n_pointable) / n_caption if n_caption else 0.0,
        non_visible_share=(
            sum(a.pointable and not a.visible for a in caption) / n_pointable if n_pointable else 0.0
        ),
    )
