"""b-CapScore: the harmonic mean of precision, recall and linguistic quality (Appendix A, eq. A.1)."""

from __future__ import annotations

from typing import Any

from balcaprl.rewards._elementwise import where

__all__ = ["b_capscore"]


def b_capscore(precision: Any, recall: Any, linguistic: Any) -> Any:
    """3 / (1/p + 1/r + 1/l), in [0, 1]; 0 when any component is 0. Numbers, arrays or tensors.

    Written as 3prl / (rl + pl + pr) so a zero component gives 0 without dividing by zero.
    Dataset-level b-CapScore (as the paper reports it) is 100 x the mean of the per-caption values.
    """
    p, r, l = precision, recall, linguistic
    numerator = 3 * p * r * l
    denominator = r * l + p * l + p * r
    any_zero = (p == 0) | (r == 0) | (l == 0)
    safe_denominator = where(any_zero, 1.0, denominator)
    return where(any_zero, 0.0, numerator / safe_denominator)
