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
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

METRICS = ("precision", "recall", "linguistic", "b_capscore")
_BLOCK = 1 << 20  # resampled values drawn at once: the bootstrap's memory does not grow with resamples x n


def bootstrap_mean_ci(
    values: Sequence[float], resamples: int = 1000, seed: int = 0, level: float = 0.95
) -> tuple[float, float, float] | None:
    """``(mean, low, high)``: the sample mean and its percentile-bootstrap interval; None if empty."""
    import numpy as np  # here, not at the top: `score` reaches its first judge call without numpy

    x = np.asarray(values, dtype=np.float64)
    return None if x.size == 0 else bootstrap_means_ci(x[:, None], resamples, seed, level)[0]


def bootstrap_means_ci(
    columns: np.ndarray, resamples: int = 1000, seed: int = 0, level: float = 0.95
) -> list[tuple[float, float, float]]:
    """:func:`bootstrap_mean_ci` of each column of the ``(n, k)`` array ``columns`` (n >= 1), all
    from one set of resampled rows: the draws each column would get alone (one seed, one stream), made
    once instead of k times (per caption, the bootstrap was the largest cost of a warm-cache score)."""
    import numpy as np

    n = columns.shape[0]
    each = [np.ascontiguousarray(column) for column in columns.T]  # one column's sums, as alone
    rng = np.random.default_rng(seed)
    rows = max(1, _BLOCK // n)  # resamples per block; the same draws, in order, as all at once
    blocks = []
    for start in range(0, resamples, rows):
        index = rng.integers(0, n, size=(min(rows, resamples - start), n))
        blocks.append(np.stack([column[index].mean(axis=1) for column in each], axis=1))
    means = np.concatenate(blocks)  # (resamples, k)
    alpha = (1 - level) / 2
    low, high = np.quantile(means, [alpha, 1 - alpha], axis=0)
    return [
        (float(m), float(lo), float(hi))
        for m, lo, hi in zip([c.mean() for c in each], low, high, strict=True)
    ]


class ScoreTally:
    """What a summary needs of score rows, taken a row at a time: four numbers per scored row and a
    count per failure reason (a stream of rows is never held)."""

    def __init__(self) -> None:
        self.values = {name: array("d") for name in METRICS}
        self.n_rows = 0
        self.failures: dict[str, int] = {}

    def add(self, row: dict[str, Any]) -> None:
        self.n_rows += 1
        if row["failure"] is not None:
            self.failures[row["failure"]] = self.failures.get(row["failure"], 0) + 1
        else:
            for name in METRICS:
                self.values[name].append(row[name])

    def summary(self, resamples: int = 1000, seed: int = 0, n_empty: int = 0) -> dict[str, Any]:
        """:func:`summarise_scores` of the rows added so far."""
        n_scored = len(self.values["b_capscore"])
        metrics: dict[str, Any] = dict.fromkeys(METRICS)
        if n_scored:
            import numpy as np

            columns = np.stack(
                [np.frombuffer(self.values[name], dtype=np.float64) for name in METRICS], axis=1
            )
            for name, (mean, low, high) in zip(
                METRICS, bootstrap_means_ci(columns, resamples, seed), strict=True
            ):
                scale = 100.0 if name == "b_capscore" else 1.0
                metrics[name] = {"mean": mean * scale, "ci95_low": low * scale, "ci95_high": high * scale}
        return {
            "n_captions": self.n_rows,
            "n_scored": n_scored,
            "n_failed": self.n_rows - n_scored,
            "n_empty_captions": n_empty,
            "failures": dict(sorted(self.failures.items())),
            "metrics": metrics,
            "b_capscore_scale": "x100 (per-caption values in scores.jsonl are in [0, 1])",
            "bootstrap": {"resamples": resamples, "seed": seed, "interval": "percentile, 95%"},
        }


def summarise_scores(
    rows: Iterable[dict[str, Any]], resamples: int = 1000, seed: int = 0, n_empty: int = 0
) -> dict[str, Any]:
    """Summary of score rows (``precision``, ``recall``, ``linguistic``, ``b_capscore``, ``failure``),
    read once (:class:`ScoreTally`); ``n_empty``: how many of the captions were empty (scored 0,
    included in the means)."""
    tally = ScoreTally()
    for row in rows:
        tally.add(row)
    return tally.summary(resamples, seed, n_empty)
