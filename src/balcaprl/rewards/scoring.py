"""Verdict -> rewards: the paper's precision, recall and linguistic rewards (Sec. 2.1, eq. 2.3) and,
for a rollout, the length control of Sec. 2.3 / Appendix A.

:func:`score_rollout` is the one place a verdict becomes a rollout's rewards; every consumer (the TRL
and verl reward functions, ``balcaprl score``, the evaluations, the demo) calls it with its
:class:`~balcaprl.rewards.config.RewardConfig`. :func:`score_verdict` is its length-free core, the
pinned public arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from balcaprl.rewards.config import LengthControlConfig, RewardConfig
from balcaprl.rewards.length import length_ratio, linear_length_penalty, mask_linguistic_by_length
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


@dataclass(frozen=True)
class LengthGate:
    """Where a caption's length falls: rho = l_pred / l_ref and what the length control makes of it."""

    ratio: float  # rho (eq. A.2)
    in_band: bool  # tau_l <= rho <= tau_u (Sec. 2.3, inclusive)
    penalty: float  # p_len = lambda_len * d(rho) (eqs. A.3-A.4) in mode "linear", else 0


def length_gate(length: LengthControlConfig, caption_tokens: int, reference_tokens: int) -> LengthGate:
    """The length terms of one rollout; raises for a reference without tokens (no ratio exists)."""
    ratio = float(length_ratio(caption_tokens, reference_tokens))
    penalty = 0.0
    if length.mode == "linear":
        penalty = float(
            linear_length_penalty(
                caption_tokens, reference_tokens, length.tau_low, length.tau_high, length.linear_strength
            )
        )
    return LengthGate(ratio=ratio, in_band=length.in_band(ratio), penalty=penalty)


@dataclass(frozen=True)
class RolloutScore:
    """A rollout's rewards under a :class:`RewardConfig`, and what the logs report about them."""

    precision: float  # eq. 2.3 (pointable and visible, or visible alone without pointability)
    recall: float  # |Q| / |O|
    linguistic_raw: float  # the judge's linguistic score (Sec. 2.1), before length control
    linguistic: float  # after the length mask (Sec. 2.3): what the optimiser sees
    masked: bool  # the mask set linguistic to 0
    length_ratio: float | None  # rho; None when scored without token counts (length mode "none")
    in_band: bool | None  # tau_l <= rho <= tau_u; None without token counts
    length_penalty: float  # p_len of eq. A.4 in length mode "linear" (subtracted from the advantage), else 0
    n_caption_assertions: int
    n_reference_assertions: int
    non_pointable_share: float  # meta-commentary
    non_visible_share: float  # hallucination

    def as_tuple(self) -> tuple[float, float, float]:
        """(precision, recall, linguistic): one row of the (N, 3) reward tensor."""
        return (self.precision, self.recall, self.linguistic)


def score_rollout(
    verdict: Verdict | dict[str, Any],
    config: RewardConfig,
    caption_tokens: int | None = None,
    reference_tokens: int | None = None,
) -> RolloutScore:
    """A rollout's rewards: eq. 2.3 with the config's pointability rule, recall and linguistic (Sec.
    2.1), then the config's length control on rho = caption_tokens / reference_tokens (policy tokens):
    ``mask`` zeroes linguistic outside [tau_l, tau_u] (Sec. 2.3), ``linear`` reports p_len for the
    advantage step (eq. A.5), ``none`` leaves the rewards alone.

    Token counts are required by ``mask`` and ``linear``, optional for ``none`` (then the length fields
    report them when given, else None).
    """
    scores = score_verdict(verdict, pointability=config.pointability)
    length = config.length
    if caption_tokens is None or reference_tokens is None:
        if length.mode != "none":
            raise ValueError(f"length mode {length.mode!r} needs caption_tokens and reference_tokens")
        gate = None
    else:
        gate = length_gate(length, caption_tokens, reference_tokens)
    linguistic = scores.linguistic
    if length.mode == "mask":
        # Sec. 2.3: R~_ling = R_ling if tau_l <= rho <= tau_u else 0.
        linguistic = float(
            mask_linguistic_by_length(
                scores.linguistic, caption_tokens, reference_tokens, length.tau_low, length.tau_high
            )
        )
    return RolloutScore(
        precision=scores.precision,
        recall=scores.recall,
        linguistic_raw=scores.linguistic,
        linguistic=linguistic,
        masked=length.mode == "mask" and gate is not None and not gate.in_band,
        length_ratio=None if gate is None else gate.ratio,
        in_band=None if gate is None else gate.in_band,
        length_penalty=0.0 if gate is None else gate.penalty,
        n_caption_assertions=scores.n_caption_assertions,
        n_reference_assertions=scores.n_reference_assertions,
        non_pointable_share=scores.non_pointable_share,
        non_visible_share=scores.non_visible_share,
    )
