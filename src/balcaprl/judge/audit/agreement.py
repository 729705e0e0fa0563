"""Agreement statistics between two raters (judges): Cohen's kappa for flags, correlations and
rank agreement for rewards. Plain numpy, small inputs (a few thousand items); every function returns
None where its statistic is undefined (too few items, or a rater that never varies) rather than a
number that looks meaningful."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def cohen_kappa(a: Sequence[bool], b: Sequence[bool]) -> float | None:
    """Cohen's kappa of two binary ratings: (p_o - p_e) / (1 - p_e), p_o the observed agreement and
    p_e = p_a p_b + (1 - p_a)(1 - p_b) the agreement expected by chance from each rater's positive rate.
    None for no items or p_e = 1 (both raters constant and equal: chance explains everything)."""
    x, y = np.asarray(a, dtype=bool), np.asarray(b, dtype=bool)
    if x.shape != y.shape:
        raise ValueError(f"ratings must be paired, got {x.size} and {y.size}")
    if x.size == 0:
        return None
    observed = float(np.mean(x == y))
    pa, pb = float(x.mean()), float(y.mean())
    expected = pa * pb + (1 - pa) * (1 - pb)
    if expected >= 1:
        return None
    return (observed - expected) / (1 - expected)


def _pair(x: Sequence[float], y: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    u, v = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if u.shape != v.shape or u.ndim != 1:
        raise ValueError(f"values must be paired 1-D sequences, got shapes {u.shape} and {v.shape}")
    return u, v


def pearson(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Pearson's r; None for fewer than 2 items or a constant sequence."""
    u, v = _pair(x, y)
    if u.size < 2:
        return None
    du, dv = u - u.mean(), v - v.mean()
    denominator = float(np.sqrt((du * du).sum() * (dv * dv).sum()))
    return float((du * dv).sum() / denominator) if denominator > 0 else None


def ranks(values: Sequence[float]) -> np.ndarray:
    """1-based ranks, ties sharing their average rank."""
    v = np.asarray(values, dtype=np.float64)
    order = np.argsort(v, kind="mergesort")
    result = np.empty(v.size)
    sorted_values = v[order]
    start = 0
    while start < v.size:
        end = start
        while end + 1 < v.size and sorted_values[end + 1] == sorted_values[start]:
            end += 1
        result[order[start : end + 1]] = (start + end) / 2 + 1
        start = end + 1
    return result


def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman's rho: Pearson's r of the (average-tie) ranks."""
    u, v = _pair(x, y)
    return pearson(ranks(u), ranks(v)) if u.size >= 2 else None


def _concordance(x: Sequence[float], y: Sequence[float]) -> tuple[int, int, int, int]:
    """(concordant - discordant, pairs untied in x, pairs untied in y, concordant + discordant) over all
    pairs i < j, in blocks so memory stays small."""
    u, v = _pair(x, y)
    s = untied_x = untied_y = both = 0
    block = max(1, 2_000_000 // max(u.size, 1))
    for start in range(0, u.size, block):
        stop = min(start + block, u.size)
        sx = np.sign(u[start:stop, None] - u[None, :])
        sy = np.sign(v[start:stop, None] - v[None, :])
        upper = np.arange(start, stop)[:, None] < np.arange(u.size)[None, :]  # each pair once
        product = (sx * sy)[upper]
        s += int(product.sum())
        untied_x += int(np.count_nonzero(sx[upper]))
        untied_y += int(np.count_nonzero(sy[upper]))
        both += int(np.count_nonzero(product))
    return s, untied_x, untied_y, both


def kendall_tau_b(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Kendall's tau-b: (C - D) / sqrt((n0 - n1)(n0 - n2)), ties in either sequence accounted for."""
    s, untied_x, untied_y, _ = _concordance(x, y)
    if untied_x == 0 or untied_y == 0:
        return None
    return s / float(np.sqrt(untied_x * untied_y))


def pairwise_order_agreement(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Among pairs of items that both raters order (no tie in either), the share ordered the same way:
    C / (C + D). "Would the two judges prefer the same caption of a pair?" """
    s, _, _, both = _concordance(x, y)
    return (both + s) / (2 * both) if both else None


def mean_abs_diff(x: Sequence[float], y: Sequence[float]) -> float | None:
    u, v = _pair(x, y)
    return float(np.abs(u - v).mean()) if u.size else None
