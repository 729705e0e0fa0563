"""b-CapScore: the harmonic mean of precision, recall and linguistic quality (Appendix A, eq. A.1)."""

from __future__ import annotations


def b_capscore(precision: float, recall: float, linguistic: float) -> float:
    """3 / (1/p + 1/r + 1/l), in [0, 1]; 0 when any component is 0 (the harmonic mean's limit).

    Subnormal inputs overflow 1/x to inf and give 0, as they should. Dataset-level b-CapScore (as the
    paper reports it) is 100 x the mean of the per-caption values.
    """
    if precision == 0 or recall == 0 or linguistic == 0:
        return 0.0
    return 3 / (1 / precision + 1 / recall + 1 / linguistic)
