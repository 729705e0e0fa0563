"""Dataset-level figures for `balcaprl score`: means with 95% percentile-bootstrap intervals.

Means are over the captions the judge scored; failures are left out (and counted), never scored 0.
Empty captions are scored 0 without a call (a caption that says nothing asserts nothing and covers
nothing) and are in the means; ``n_empty_captions`` says how many there were, so a mean pulled down
by a captioner that returned nothing is visible as such.
b-CapScore is reported x100, as the paper does; the per-caption values stay in [0, 1].
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

METRICS = ("precision", "recall", "linguistic", "b_capscore")
_BLOCK = 1 << 20  # resampled values drawn at once: the bootstrap's memory does not grow with resamples x n


def bootstrap_mean_ci(
    values: Sequence[float], resamples: int = 1000, seed: int = 0, level: float = 0.95
) -> tuple[float, float, float] | None:
    """``(mean, low, high)``: the sample mean and its percentile-bootstrap interval; None if empty."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        return None
    rng = np.random.default_rng(seed)
    rows = max(1, _BLOCK // x.size)  # resamples per block; the same draws, in order, as all at once
    means = np.concatenate([
        x[rng.integers(0, x.size, size=(min(rows, resamples - start), x.size))].mean(axis=1)
        for start in range(0, resamples, rows)
    ])  # fmt: skip
    alpha = (1 - level) / 2
    low, high = np.quantile(means, [alpha, 1 - alpha])
    return float(x.mean()), float(low), float(high)


def summarise_scores(
    rows: Iterable[dict[str, Any]], resamples: int = 1000, seed: int = 0, n_empty: int = 0
) -> dict[str, Any]:
    """Summary of score rows (``precision``, ``recall``, ``linguistic``, ``b_capscore``, ``failure``),
    read once (a stream of rows is never held: only their four numbers are);
    ``n_empty``: how many of the captions were empty (scored 0, included in the means)."""
    values = {name: array("d") for name in METRICS}
    n_rows = 0
    failures: dict[str, int] = {}
    for r in rows:
        n_rows += 1
        if r["failure"] is not None:
            failures[r["failure"]] = failures.get(r["failure"], 0) + 1
        else:
            for name in METRICS:
                values[name].append(r[name])
    n_scored = len(values["b_capscore"])
    metrics: dict[str, Any] = {}
    for name in METRICS:
        scale = 100.0 if name == "b_capscore" else 1.0
        ci = bootstrap_mean_ci(values[name], resamples=resamples, seed=seed)
        metrics[name] = (
            None
            if ci is None
            else {"mean": ci[0] * scale, "ci95_low": ci[1] * scale, "ci95_high": ci[2] * scale}
        )
    return {
        "n_captions": n_rows,
        "n_scored": n_scored,
        "n_failed": n_rows - n_scored,
        "n_empty_captions": n_empty,
        "failures": dict(sorted(failures.items())),
        "metrics": metrics,
        "b_capscore_scale": "x100 (per-caption values in scores.jsonl are in [0, 1])",
        "bootstrap": {"resamples": resamples, "seed": seed, "interval": "percentile, 95%"},
    }
