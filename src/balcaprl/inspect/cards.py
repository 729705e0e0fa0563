"""One caption card: the JSON object the page shows for a caption, built from a verdict and scores.

A card holds plain JSON values only (the page's script reads them; it never interprets them as
markup). Keys:

    id, source, image        the row's key, its source (index into the page's sources), its image
                             (index into the page's images, or null)
    caption, reference       the texts
    ca                       caption assertions: [[text, status], ...], status one of
                             "verified" (pointable and visible), "hallucinated" (pointable, not
                             visible), "meta" (not pointable: meta-commentary); null without a verdict
    ra                       reference assertions: [[text, covered (bool)], ...]; null without a verdict
    precision, recall        the rewards (eq. 2.3 and Sec. 2.1)
    linguistic               what the optimiser / the metric saw (after the length mask, for rollouts)
    linguistic_raw           the judge's linguistic score before the mask
    clarity, fluency, coherency   the judge's 1..10 scores
    b_capscore               the metric's harmonic mean (Appendix A, eq. A.1), in [0, 1]
    ratio, ratio_unit        length ratio rho and what it counts ("tokens": the policy's, as the
                             length mask does; "words": where no token counts were logged)
    in_band, masked          tau_l <= rho <= tau_u, and whether the mask zeroed linguistic (null: no mask)
    meta, halluc             share of caption assertions not pointable / of pointable ones not visible
    failure, detail          the judge's failure reason and its detail (null when judged)
    explanation              the judge's reason for the linguistic scores
    step, group, advantage   training rollouts only: the step, the prompt group, the c-GDPO advantage
    verdict_from             where the assertions come from: "judge" (recorded verdict), "oracle"
                             (re-derived by the synthetic oracle), or null
    note                     a warning about this card, or ""
"""

from __future__ import annotations

from typing import Any

from balcaprl.rewards import (
    BCAPSCORE_REWARDS,
    Verdict,
    parse_verdict,
    score_rollout,
    score_verdict,
)
from balcaprl.rewards.verdict import CaptionAssertion

# The three marks a caption assertion can get, in the order the page's legend lists them.
ASSERTION_STATUSES = ("verified", "hallucinated", "meta")


def assertion_status(assertion: CaptionAssertion) -> str:
    """verified (A+ of eq. 2.3), hallucinated (pointable but not visible) or meta (not pointable)."""
    if not assertion.pointable:
        return "meta"  # nobody could point at it, whatever the judge said about its truth
    return "verified" if assertion.visible else "hallucinated"


def verdict_fields(verdict: Verdict | dict[str, Any]) -> dict[str, Any]:
    """The card fields a verdict gives: both marked assertion lists and the linguistic sub-scores."""
    v = parse_verdict(verdict)
    statuses = [assertion_status(a) for a in v.caption_assertions]
    shares = score_verdict(v)
    return {
        "ca": [[a.text, s] for a, s in zip(v.caption_assertions, statuses, strict=True)],
        "ra": [[a.text, a.covered] for a in v.reference_assertions],
        "clarity": v.clarity,
        "fluency": v.fluency,
        "coherency": v.coherency,
        "explanation": v.explanation,
        "meta": shares.non_pointable_share,
        "halluc": shares.non_visible_share,
    }


def metric_scores(verdict: Verdict | dict[str, Any]) -> dict[str, float]:
    """precision, recall, linguistic and b-CapScore as the metric scores them (BCAPSCORE_REWARDS)."""
    r = score_rollout(verdict, BCAPSCORE_REWARDS)
    return {
        "precision": r.precision,
        "recall": r.recall,
        "linguistic": r.linguistic,
        "linguistic_raw": r.linguistic_raw,
        "b_capscore": r.b_capscore,
    }


def word_ratio(caption: str, reference: str | None) -> float | None:
    """rho in words (caption words / reference words): the length ratio where no token counts exist."""
    if not reference or not reference.split():
        return None
    return len(caption.split()) / len(reference.split())
