"""What every protocol returns and writes: per-item rows (JSONL, streamed to disk in spans as the
judge finishes them, renamed into place at the end) and a summary.

A protocol's headline ``score`` is on the scale the paper reports (DCScore, CaptionQA and b-CapScore
x100; CapArena in -100..100). Items the judge could not score are counted in ``failures`` (reason ->
count) and left out of every mean, never scored 0; items of the benchmark that had no caption are
listed in ``missing``; rows of the benchmark file that could not be used, in ``refused`` (where and
why). ``complete`` is true only when every item was scored.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")


def mean(values: Sequence[float]) -> float:
    """The arithmetic mean; ``ValueError`` for no values (a mean of nothing is not 0)."""
    if not values:
        raise ValueError("the mean of no values is undefined")
    return sum(values) / len(values)


def read_items(path: Path) -> Iterator[dict[str, Any]]:
    """The rows of a JSONL file, one at a time (a run's rows are never all in memory)."""
    with Path(path).open("rb") as handle:
        for line in handle:
            yield json.loads(line)


async def in_spans(
    n: int, span: int, judge: Callable[[range], Awaitable[R]], write: Callable[[range, R], None]
) -> None:
    """Run ``judge`` on ``range(n)`` in consecutive spans, at most two at a time, and hand each span's
    result to ``write`` in order as soon as it and the spans before it are done.

    Memory holds two spans, never the run; with spans of at least the judge's concurrency the second
    span's calls queue behind the first's, so the judge does not idle between spans. Returns nothing:
    ``asyncio.run`` of a coroutine with a large result builds that result's repr (Python 3.11/3.12).
    """
    spans: deque[tuple[range, asyncio.Task]] = deque()
    try:
        for start in range(0, n, span):
            part = range(start, min(n, start + span))
            spans.append((part, asyncio.create_task(judge(part))))  # type: ignore[arg-type]
            if len(spans) == 2:
                part, task = spans.popleft()
                write(part, await task)
        while spans:
            part, task = spans.popleft()
            write(part, await task)
    finally:
        for _, task in spans:
            task.cancel()
        await asyncio.gather(*(task for _, task in spans), return_exceptions=True)


class RowsFile:
    """A JSONL file written a row at a time as ``NAME.part`` (in ``part_dir``, else beside it), renamed
    onto ``NAME`` by :meth:`commit`; left unfinished, the part is removed."""

    def __init__(self, path: Path, part_dir: Path | None = None) -> None:
        self.path = Path(path)
        self._part = (part_dir or self.path.parent) / f"{self.path.name}.part"
        self._part.parent.mkdir(parents=True, exist_ok=True)
        # backslashreplace: a lone surrogate (no valid Unicode, e.g. in a caption) is written as its JSON
        # escape, which reads back as the same text
        self._handle = self._part.open("w", encoding="utf-8", errors="backslashreplace")

    def write(self, row: dict[str, Any] | str) -> None:
        """Write ``row``: an object, or its JSON text already made (one line, no newline)."""
        self._handle.write((row if isinstance(row, str) else json.dumps(row, ensure_ascii=False)) + "\n")

    def commit(self) -> None:
        self._handle.flush()
        os.fsync(self._handle.fileno())
        self._handle.close()
        os.replace(self._part, self.path)

    def __enter__(self) -> RowsFile:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._handle.closed:
            self._handle.close()
            self._part.unlink(missing_ok=True)


def judge_in_spans(
    path: Path,
    todo: Sequence[T],
    one: Callable[[T], Awaitable[dict[str, Any]]],
    *,
    span: int,
    close: Callable[[], Awaitable[None]],
) -> None:
    """The row of each item of ``todo`` (``one(item)``), written to ``path`` (JSONL, in order) as
    spans finish (:func:`in_spans`); the file takes its name when every row is written."""

    async def run(rows: RowsFile) -> None:
        async def judge(items: range) -> list[dict[str, Any]]:
            return await asyncio.gather(*(one(todo[i]) for i in items))

        def write(_: range, done: list[dict[str, Any]]) -> None:
            for row in done:
                rows.write(row)

        try:
            await in_spans(len(todo), max(1, span), judge, write)
        finally:
            await close()

    with RowsFile(path) as rows:
        asyncio.run(run(rows))
        rows.commit()


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
