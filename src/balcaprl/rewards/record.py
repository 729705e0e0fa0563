"""One judged rollout, as every consumer keeps it: :class:`RolloutRecord` and its row form.

A verdict (or a failed judge) becomes a record here, in :func:`score_rollout` (or
:func:`failed_rollout`), under a :class:`~balcaprl.rewards.config.RewardConfig`: eq. 2.3 with its
pointability rule (:func:`~balcaprl.rewards.scoring.score_verdict`), then the length control of Sec. 2.3
/ Appendix A on rho = caption tokens / reference tokens (policy tokens). Both training backends, the
advantage step, the logs, ``balcaprl score``, the evaluations, inspect and the demo read the same
record; its row form (:meth:`RolloutRecord.row`, a plain dict with the field names as keys) is what
``rollouts.jsonl`` holds and what verl's reward function returns. A new per-rollout quantity is one
field here and the line that fills it.

A failed judge is NaN in all three rewards, never 0: the advantage step leaves the rollout out.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from balcaprl.rewards.bcapscore import b_capscore
from balcaprl.rewards.config import LengthControlConfig, RewardConfig
from balcaprl.rewards.length import length_ratio, linear_length_penalty, mask_linguistic_by_length
from balcaprl.rewards.scoring import score_verdict
from balcaprl.rewards.verdict import Verdict

NAN = math.nan
# Failure details are cut to this length: a reason to read in a log, not a dump of the response.
DETAIL_CHARS = 300


@dataclass(frozen=True)
class RolloutRecord:
    """One rollout's caption, lengths, rewards and what the logs report about them."""

    id: str = ""  # the prompt's dataset row id (rollouts of one prompt share it: the advantage group)
    caption: str = ""
    caption_tokens: int | None = None  # policy tokenizer, special tokens excluded; None: not counted
    reference_tokens: int | None = None
    length_ratio: float | None = None  # rho (eq. A.2); None without token counts
    in_band: bool | None = None  # tau_l <= rho <= tau_u (Sec. 2.3, inclusive); None without token counts
    length_penalty: float = 0.0  # p_len (eq. A.4) in length mode "linear", else 0; eq. A.5 subtracts it
    failure: str | None = None  # the JudgeFailure reason; None when judged
    failure_detail: str = ""
    precision: float = NAN  # eq. 2.3 (NaN: not judged)
    recall: float = NAN  # |Q| / |O|
    linguistic_raw: float = NAN  # the judge's linguistic score (Sec. 2.1), before length control
    linguistic: float = NAN  # after the length mask (Sec. 2.3): what the optimiser sees
    masked: bool = False  # the mask set linguistic to 0 (never for a rollout without a verdict)
    non_pointable_share: float = NAN  # meta-commentary (NaN: not asked, the pointability ablation)
    non_visible_share: float = NAN  # hallucination: pointable caption assertions that are false
    n_caption_assertions: int | None = None
    n_reference_assertions: int | None = None
    truncated_input: bool = False  # the judge saw a shortened caption or reference

    @property
    def judged(self) -> bool:
        return self.failure is None

    def as_tuple(self) -> tuple[float, float, float]:
        """(precision, recall, linguistic), NaN for a failed judge: one row of the (N, 3) reward tensor."""
        return (self.precision, self.recall, self.linguistic)

    @property
    def b_capscore(self) -> float:
        """The metric of eq. A.1 on this verdict: the judge's linguistic score, no length control."""
        return b_capscore(self.precision, self.recall, self.linguistic_raw)

    def row(self) -> dict[str, Any]:
        """The row form: every field by name (NaN where unknown; JSON writers turn it into null)."""
        return asdict(self)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> RolloutRecord:
        """A record from its row form; keys that are not fields (step, advantage, ...) are ignored,
        a null float reads as NaN (a JSON line wrote it so)."""
        values = {}
        for f in fields(cls):
            if f.name in row:
                value = row[f.name]
                values[f.name] = NAN if value is None and isinstance(f.default, float) else value
        return cls(**values)


def _length_terms(
    length: LengthControlConfig, caption_tokens: int | None, reference_tokens: int | None
) -> dict[str, Any]:
    """rho, the band and p_len of one rollout; empty without token counts (allowed in mode "none")."""
    if caption_tokens is None or reference_tokens is None:
        if length.mode != "none":
            raise ValueError(f"length mode {length.mode!r} needs caption_tokens and reference_tokens")
        return {}
    ratio = length_ratio(caption_tokens, reference_tokens)  # raises for a reference without tokens
    penalty = 0.0
    if length.mode == "linear":
        penalty = linear_length_penalty(
            caption_tokens, reference_tokens, length.tau_low, length.tau_high, length.linear_strength
        )
    return {
        "caption_tokens": caption_tokens,
        "reference_tokens": reference_tokens,
        "length_ratio": ratio,
        "in_band": length.in_band(ratio),
        "length_penalty": penalty,
    }


def score_rollout(
    verdict: Verdict | dict[str, Any],
    config: RewardConfig,
    caption_tokens: int | None = None,
    reference_tokens: int | None = None,
    *,
    id: str = "",  # noqa: A002  (the record's field)
    caption: str = "",
    truncated_input: bool = False,
) -> RolloutRecord:
    """A judged rollout's record: eq. 2.3 with the config's pointability rule, recall and linguistic
    (Sec. 2.1), then the config's length control on rho = caption_tokens / reference_tokens: ``mask``
    zeroes linguistic outside [tau_l, tau_u] (Sec. 2.3), ``linear`` reports p_len for the advantage
    step (eq. A.5), ``none`` leaves the rewards alone.

    Token counts are required by ``mask`` and ``linear``, optional for ``none`` (then the length fields
    report them when given, else None).
    """
    length = _length_terms(config.length, caption_tokens, reference_tokens)
    scores = score_verdict(verdict, pointability=config.pointability)
    linguistic = scores.linguistic
    if config.length.mode == "mask":
        # Sec. 2.3: R~_ling = R_ling if tau_l <= rho <= tau_u else 0.
        linguistic = mask_linguistic_by_length(
            scores.linguistic, caption_tokens, reference_tokens, config.length.tau_low, config.length.tau_high
        )
    return RolloutRecord(
        id=id,
        caption=caption,
        **length,
        precision=scores.precision,
        recall=scores.recall,
        linguistic_raw=scores.linguistic,
        linguistic=linguistic,
        masked=config.length.mode == "mask" and length["in_band"] is False,
        # Without pointability the judge is not asked about it (every claim comes back pointable):
        # the share of meta-commentary is unknown, not 0.
        non_pointable_share=scores.non_pointable_share if config.pointability else NAN,
        non_visible_share=scores.non_visible_share,
        n_caption_assertions=scores.n_caption_assertions,
        n_reference_assertions=scores.n_reference_assertions,
        truncated_input=truncated_input,
    )


def failed_rollout(
    reason: str,
    detail: str,
    config: RewardConfig,
    caption_tokens: int | None = None,
    reference_tokens: int | None = None,
    *,
    id: str = "",  # noqa: A002  (the record's field)
    caption: str = "",
) -> RolloutRecord:
    """The record of a rollout the judge could not score: NaN rewards, and its length terms when the
    token counts are known (logged; the length control acts on judged rollouts only, so p_len is 0)."""
    counted = caption_tokens is not None and reference_tokens is not None
    length = _length_terms(config.length, caption_tokens, reference_tokens) if counted else {}
    length["length_penalty"] = 0.0
    return RolloutRecord(
        id=id, caption=caption, **length, failure=reason, failure_detail=detail[:DETAIL_CHARS]
    )
