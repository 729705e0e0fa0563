"""The protocols' span runner: every item once, written in order, never more than two spans held."""

from __future__ import annotations

import asyncio
import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from balcaprl.evaluate.results import RowsFile, in_spans, judge_in_spans, read_items


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 40), span=st.integers(1, 7), seed=st.integers(0, 1000))
def test_in_spans_writes_every_span_in_order_and_holds_at_most_two(n, span, seed):
    rng = random.Random(seed)
    held, most, written = 0, 0, []

    async def judge(part: range) -> list[int]:
        nonlocal held, most
        held += 1
        most = max(most, held)
        for _ in range(rng.randint(0, 3)):  # spans finish in any order
            await asyncio.sleep(0)
        return list(part)

    def write(part: range, done: list[int]) -> None:
        nonlocal held
        held -= 1
        assert done == list(part)
        written.extend(done)

    asyncio.run(in_spans(n, span, judge, write))
    assert written == list(range(n))  # every item once, in input order
    assert most <= 2 and held == 0


def test_judge_in_spans_writes_rows_in_order_and_closes(tmp_path):
    closed = []

    async def one(item: int) -> dict:
        await asyncio.sleep(0.001 * (item % 3))
        return {"item": item}

    async def close() -> None:
        closed.append(True)

    judge_in_spans(tmp_path / "items.jsonl", list(range(10)), one, span=3, close=close)
    assert [r["item"] for r in read_items(tmp_path / "items.jsonl")] == list(range(10))
    assert closed == [True] and not list(tmp_path.glob("*.part"))


def test_a_failed_run_leaves_no_rows_file(tmp_path):
    async def one(item: int) -> dict:
        if item == 4:
            raise RuntimeError("boom")
        return {"item": item}

    async def close() -> None:
        pass

    with pytest.raises(RuntimeError, match="boom"):
        judge_in_spans(tmp_path / "items.jsonl", list(range(10)), one, span=2, close=close)
    assert list(tmp_path.iterdir()) == []  # neither the rows file nor its part
    with RowsFile(tmp_path / "x.jsonl") as rows:
        rows.write({"a": 1})
        rows.commit()
    assert json.loads((tmp_path / "x.jsonl").read_text()) == {"a": 1}
