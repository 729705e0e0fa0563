"""Hedging against the trainer's deadline (``balcaprl.judge.tail``): the decode-time line, which calls
are on the step's critical path (hand-computed), and that such a call gets its duplicate at the floor
-- or when the deadline is told, if later -- while the same call with no deadline waits for the
quantile. Counts and which attempt won; no assertion on wall time beyond "before the quantile"."""

from __future__ import annotations

import asyncio
import statistics
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from judge_testkit import copies_script, room_for_two_duplicates

from balcaprl.judge.tail import DecodeTimes, Hedging, first_answer


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 5000), st.floats(0.0, 100.0, allow_nan=False)), min_size=1, max_size=60
    ),
    st.integers(2, 20),
    st.integers(0, 5000),
)
def test_the_decode_time_is_the_least_squares_line_of_the_last_window_answers(points, window, size):
    decode = DecodeTimes(window=window, min_seen=2)
    for x, y in points:
        decode.observe(x, y)
    last = points[-window:]
    if len(last) < 2:
        assert decode.predict(size) is None
        return
    xs, ys = [float(x) for x, _ in last], [y for _, y in last]
    if len(set(xs)) == 1:
        want = statistics.fmean(ys)
    else:
        slope, intercept = statistics.linear_regression(xs, ys)
        want = intercept + slope * size
    assert decode.predict(size) == pytest.approx(max(0.0, want), rel=1e-6, abs=1e-6)


def _told(hedging: Hedging) -> None:
    """First bytes 1, 2, 3, 4, 5 s (median 3 s); answers decoding in 0.01 s per character."""
    for seconds in (1.0, 2.0, 3.0, 4.0, 5.0):
        hedging.observe(seconds)
    for size in (100, 200) * 8:
        hedging.decode.observe(size, 0.01 * size)


def test_a_call_is_on_the_critical_path_only_past_the_deadline_and_every_typical_answer():
    hedging = Hedging(quantile=0.98, floor_s=5.0, max_share=0.05, min_seen=4)
    _told(hedging)
    hedging.begin(100)  # a short call (decode 1 s) and a long one (10 s), started now
    hedging.begin(1000)
    t0 = time.perf_counter()
    assert not hedging.misses_deadline(t0 + 100.0, 1000)  # no deadline told
    hedging.wanted_by(t0 + 20.0)
    # the long call: 5 + 3 + 10 = 18 s, before the deadline; 8 + 3 + 10 = 21 s, after it
    assert not hedging.misses_deadline(t0 + 5.0, 1000)
    assert hedging.misses_deadline(t0 + 8.0, 1000)
    assert not hedging.misses_deadline(t0 + 8.0, 100)  # 8 + 3 + 1 = 12 s
    # The trainer waits already (deadline now): the long call, typically answered at 0 + 3 + 10 = 13 s,
    # bounds the step; the short one at 5 s (5 + 3 + 1 = 9 s) is not what the step waits for.
    hedging.wanted_by(t0)
    assert not hedging.misses_deadline(t0 + 5.0, 100)
    assert hedging.misses_deadline(t0 + 5.0, 1000)  # 5 + 3 + 10 = 18 s > 13 s
    # Rewards in: the next step's calls are counted afresh (the long call is gone from the horizon).
    hedging.wanted_by(None)
    assert not hedging.misses_deadline(t0 + 5.0, 100)
    hedging.begin(100)
    hedging.wanted_by(t0)
    assert hedging.misses_deadline(t0 + 5.0, 100)  # 9 s > the one call's typical 4 s
    # Neither the median nor the decode time told: no call is weighed as critical.
    blind = Hedging(quantile=0.98, floor_s=5.0, max_share=0.05, min_seen=4)
    blind.begin(1000)
    blind.wanted_by(t0)
    assert not blind.misses_deadline(t0 + 100.0, 1000)


def _scripted(first_byte_s: float):
    """An attempt function: the first attempt's first byte after ``first_byte_s``, a duplicate's at
    once; returns which attempt answered. ``attempts`` counts those started."""
    attempts: list[str] = []

    async def attempt(on_first_byte):
        attempts.append("first" if not attempts else "duplicate")
        mine = attempts[-1]
        await asyncio.sleep(first_byte_s if mine == "first" else 0.0)
        on_first_byte()
        return mine

    return attempt, attempts


def _hedging() -> Hedging:
    """Floor 50 ms; first bytes: 20 at 10 ms and one at 10 s, so the 98th percentile is 10 s (no call
    below reaches it); answers decode in 2 ms per character."""
    hedging = Hedging(quantile=0.98, floor_s=0.05, max_share=1.0, min_seen=4)
    for _ in range(20):
        hedging.observe(0.01)
    hedging.observe(10.0)
    for size in (100, 1000) * 8:
        hedging.decode.observe(size, 0.002 * size)
    return hedging


@pytest.mark.parametrize("deadline", [False, True])
def test_a_call_that_would_miss_the_deadline_gets_its_duplicate_at_the_floor(deadline):
    async def go():
        hedging = _hedging()
        if deadline:  # 0.5 s from now: the long call (decode 2 s) would miss it with any first byte
            hedging.wanted_by(time.perf_counter() + 0.5)
        long_call, long_attempts = _scripted(3.0)
        short_call, short_attempts = _scripted(0.3)  # decode 0.2 s: 0.05 + 0.01 + 0.2 < 0.5
        answers = await asyncio.gather(
            first_answer(long_call, hedging, size=1000), first_answer(short_call, hedging, size=100)
        )
        return answers, long_attempts, short_attempts, hedging

    answers, long_attempts, short_attempts, hedging = asyncio.run(go())
    assert short_attempts == ["first"] and answers[1] == "first"
    if deadline:
        assert answers[0] == "duplicate" and hedging.hedges == hedging.for_deadline == 1
    else:  # 3 s is under the 98th percentile: the same call waits for its own first byte
        assert long_attempts == ["first"] and answers[0] == "first" and hedging.hedges == 0


def test_a_call_past_the_floor_weighs_the_deadline_when_it_is_told():
    async def go():
        hedging = _hedging()
        attempt, attempts = _scripted(5.0)
        call = asyncio.ensure_future(first_answer(attempt, hedging, size=1000))
        await asyncio.sleep(0.3)  # past the floor, no deadline: no duplicate (the quantile is 10 s)
        waited = list(attempts)
        hedging.wanted_by(time.perf_counter())  # the trainer waits now
        answer = await asyncio.wait_for(call, timeout=4.0)  # before the first attempt's 5 s
        return waited, answer, hedging

    waited, answer, hedging = asyncio.run(go())
    assert waited == ["first"]
    assert answer == "duplicate" and hedging.for_deadline == 1


def test_an_answer_with_a_first_byte_teaches_the_decode_time():
    async def go():
        hedging = Hedging(quantile=0.98, floor_s=0.05, max_share=1.0, min_seen=4)

        async def attempt(on_first_byte):
            on_first_byte()
            await asyncio.sleep(0.02)  # decoding
            return "answer"

        for _ in range(16):
            await first_answer(attempt, hedging, size=300)
        return hedging

    hedging = asyncio.run(go())
    assert hedging.decode.predict(300) == pytest.approx(0.02, abs=0.05)  # told after 16 answers


def test_a_critical_call_refused_a_slot_looks_again_at_the_floor_not_at_the_quantile():
    async def go():
        hedging = _hedging()
        hedging.wanted_by(time.perf_counter())  # the trainer waits now
        looks = []

        def spare():  # no slot at the first look, one at the next
            looks.append(time.perf_counter())
            return None if len(looks) == 1 else (lambda: None)

        attempt, attempts = _scripted(5.0)
        answer = await asyncio.wait_for(first_answer(attempt, hedging, spare=spare, size=1000), timeout=4.0)
        return answer, looks, hedging

    answer, looks, hedging = asyncio.run(go())  # before the quantile (10 s) and the first attempt (5 s)
    assert answer == "duplicate" and len(looks) == 2 and hedging.for_deadline == 1


def test_a_call_cancelled_while_it_waits_leaves_nothing_pending():
    async def go():
        hedging = _hedging()
        attempt, _ = _scripted(5.0)
        call = asyncio.ensure_future(first_answer(attempt, hedging, size=1000))
        await asyncio.sleep(0.2)  # past the floor, no deadline told: waiting for one
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        await asyncio.sleep(0)  # let cancellations run
        return [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]

    assert asyncio.run(go()) == []


def test_a_duplicate_left_alone_past_the_deadline_gets_its_own_duplicate_at_once():
    """The trainer waits now; a long call's first copy gets its duplicate at the floor (it would miss
    the deadline), the duplicate stalls and the first copy is cut with no first byte: the duplicate,
    alone, is weighed against the deadline in its turn and gets a duplicate then, long before the
    quantile (10 s)."""

    async def go():
        hedging = _hedging()
        room_for_two_duplicates(hedging)
        hedging.wanted_by(time.perf_counter())
        attempt, started = copies_script(first_fails_after_s=0.3, duplicate="stalls")
        answer = await asyncio.wait_for(first_answer(attempt, hedging, size=1000), timeout=4.0)
        return answer, started, hedging

    answer, started, hedging = asyncio.run(go())
    assert answer == "third" and hedging.hedges == hedging.for_deadline == 2 and len(started) == 3
