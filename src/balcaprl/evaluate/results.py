"""What every protocol returns and writes: per-item rows (JSONL) and a summary, written atomically.

A protocol's headline ``score`` is on the scale the paper reports (DCScore, CaptionQA and b-CapScore
x100; CapArena in -100..100). Items the judge could not score are counted in ``failures`` (reason ->
count) and left out of every mean, never scored 0; items of the benchmark that had no caption are
listed in ``missing``; rows of the benchmark file that could not be used, in ``refused`` (where and
why). ``complete`` is true only when every item was scored.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from balcaprl.files import atomic_write_text

__all__ = ["ProtocolResult", "mean", "write_items", "write_json"]


def mean(values: Sequence[float]) -> float:
    """The arithmetic mean; ``ValueError`` for no values (a mean of nothing is not 0)."""
    if not values:
        raise ValueError("the mean of no values is undefined")
    return sum(values) / len(values)


def write_items(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    atomic_write_text(Path(path), "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def write_json(path: Path, value: Any) -> None:
    atomic_write_text(Path(path), json.dumps(value, indent=2, ensure_ascii=False) + "\n")


@dataclass
class ProtocolResult:
    protocol: str
    score: float | None  # the headline number, on the paper's scale; None when nothing was scored
    metrics: dict[str, Any]
    n_items: int  # items in the benchmark data
    n_scored: int
    failures: dict[str, int] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)  # benchmark items without a caption
    settings: dict[str, Any] = field(default_factory=dict)
    judge: str | None = None
    stats: dict[str, Any] = field(default_factory=dict)
    notes: str = ""
    refused: list[dict[str, str]] = field(default_factory=list)  # benchmark rows left out: where, reason

    @property
    def complete(self) -> bool:
        return not self.failures and not self.missing and not self.refused and self.n_scored > 0

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["complete"] = self.complete
        data["n_failed"] = sum(self.failures.values())
        data["n_missing"] = len(self.missing)
        data["n_refused"] = len(self.refused)
        return data
