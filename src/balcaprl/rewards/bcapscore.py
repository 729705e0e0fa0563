"""b-CapScore: the harmonic mean of precision, recall and linguistic quality (Appendix A, eq. A.1)."""

from __future__ import annotations

from typing import Any

from balcaprl.rewards._elementwise import where


def b_capscore(precision: Any, recall: Any, linguistic: Any) -> Any:
    """3 / (1/p + 1/r + 1/l), in [0, 1]; 0 when any component is 0. Numbers, arrays or tensors.

    Zero components are swapped for 1 before taking reciprocals (then the result is set to 0), so
    nothing divides by zero; subnormal inputs overflow 1/x to inf and give 0, as they should.
    Dataset-level b-CapScore (as the paper reports it) is 100 x the mean of the per-caption values.
    """
    any_zero = (precision == 0) | (recall == 0) | (linguistic == 0)
    p, r, g = (where(any_zero, 1.0, x) for x in (precision, recall, linguistic))
    return where(any_zero, 0.0, 3 / (1 / p + 1 / r + 1 / g))
