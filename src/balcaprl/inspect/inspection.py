"""What the page shows, read from disk: the :class:`Inspection` the readers fill, and their shared
helpers (file names, JSON reading, the one error type)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from balcaprl.errors import InputError
from balcaprl.files import jsonl_values
from balcaprl.inspect.images import ImageTable

SCORES_FILE, SUMMARY_FILE, VERDICTS_FILE = "scores.jsonl", "summary.json", "verdicts.jsonl"
ROLLOUTS_FILE, METRICS_FILE, RECIPE_FILE = "rollouts.jsonl", "metrics.jsonl", "recipe.yaml"
EVAL_FILE, DEMO_CONFIG_FILE = "eval.json", "demo_config.yaml"


@dataclass
class RunView:
    """A training run's panel: its reward and length curves and which steps' rollouts the page holds."""

    label: str
    curves_png: bytes | None
    steps_logged: list[int]
    steps_shown: list[int]
    last_metrics: dict[str, Any] = field(default_factory=dict)


@dataclass
class Inspection:
    """Everything the page shows."""

    title: str
    kind: str  # scores | evaluation | training | demo
    sources: list[str] = field(default_factory=list)  # labels; a card's "source" indexes this
    cards: list[dict[str, Any]] = field(default_factory=list)
    images: ImageTable = field(default_factory=ImageTable)
    runs: list[RunView] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def source(self, label: str) -> int:
        self.sources.append(label)
        return len(self.sources) - 1


def read_jsonl_rows(path: Path) -> list[dict[str, Any]]:
    rows = []
    for number, row in jsonl_values(path.read_text(encoding="utf-8"), str(path)):
        if not isinstance(row, dict):
            raise InputError(f"{path}:{number}: expected a JSON object")
        rows.append(row)
    return rows


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise InputError(f"{path}: not JSON ({error.msg})") from None


def finite_number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)
