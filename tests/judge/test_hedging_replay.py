"""benchmarks/replay_hedging.py's rules on hand-made calls: the cap, the time order, the floor, and
the oracle's bound (no rule that sends duplicates at the floor or later answers sooner)."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def replay():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec = importlib.util.spec_from_file_location("replay_hedging", BENCHMARKS / "replay_hedging.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(BENCHMARKS))


def call(replay, start_s, first_byte_s, alone_s, second_s):
    c = object.__new__(replay.Call)
    c.start_s, c.first_byte_s, c.alone_s, c.second_s = start_s, first_byte_s, alone_s, second_s
    c.typical_decode_s = alone_s - min(first_byte_s, alone_s)
    return c


def test_duplicates_go_in_time_order_within_the_cap_and_only_to_calls_still_waiting(replay):
    # 40 calls: the cap is floor(0.05 x 40) = 2 duplicates. Calls 0-2 are slow to a first byte (30 s,
    # answer at 40 s); a duplicate answers 6 s after it is sent.
    calls = [call(replay, 0.0, 1.0, 3.0, 6.0) for _ in range(40)]
    for i in range(3):
        calls[i] = call(replay, float(i), 30.0, 40.0, 6.0)
    due = [(20.0 + i, i) for i in range(3)] + [(2.0, 5)]  # call 5 answered its first byte at 1 s: skipped
    # calls 0 and 1 get the two duplicates (due first): 0 + 20 + 6 = 26, 1 + 21 + 6 = 28; call 2 none: 42
    assert replay.duplicates_in_time_order(calls, due) == 42.0
    assert replay.no_duplicates(calls, 0.0) == 42.0


def test_the_oracle_moves_the_last_answer_while_it_can_and_bounds_the_rules(replay):
    calls = [call(replay, 0.0, 1.0, 3.0, 6.0) for _ in range(38)]
    calls += [call(replay, 0.0, math.inf, 36.0, 6.0), call(replay, 10.0, 20.0, 25.0, 6.0)]
    # the stall answers at 36 alone, 5 + 6 = 11 duplicated; then the slow one, 10 + 25 = 35 -> 10 + 5 + 6 = 21
    assert replay.oracle(calls, 0.0) == 21.0
    assert replay.oracle(calls, 0.0, share=0.0) == 36.0
    for rule in replay.RULES.values():
        assert rule(calls, 0.0) >= replay.oracle(calls, 0.0)


def test_the_critical_path_rule_duplicates_at_the_floor_what_the_step_will_wait_for(replay):
    # The trainer waits from 20 s (told at the end of generation, 20 - 15 = 5 s). Call A (start 15 s,
    # decode 10 s) would answer past 20 s, and past every call's typical answer (its own: 15 + 1.8 + 10
    # = 26.8 s), even with a typical 1.8 s first byte at 15 + 5 = 20 s: 31.8 s; a duplicate then, as it
    # still waits. Call B (start 0, decode 2 s) would not, and its first byte at 8 s is under the 98th
    # percentile: no duplicate.
    assert replay.LOGPROB_S == 15.0 and replay.MODEL.first_byte_s == pytest.approx(1.8)
    slow = call(replay, 15.0, 9.0, 19.0, 12.0)  # first byte at 9 s, answer at 15 + 19 = 34 s alone
    fine = call(replay, 0.0, 8.0, 10.0, 3.0)
    calls = [slow, fine] + [call(replay, 0.0, 1.0, 3.0, 6.0) for _ in range(38)]
    assert replay.critical_path(calls, 20.0) == 32.0  # 15 + 5 + 12: the duplicate wins
    assert replay.p98(calls, 20.0) == 34.0  # 9 s is under the 98th percentile (18 s): none sent


def test_the_critical_path_rule_spends_nothing_where_every_call_misses_the_deadline_alike(replay):
    # Every call starts when the trainer already waits (20 s) with the same decode (2 s): at the floor
    # each would answer at 25 + 1.8 + 2 = 28.8 s, past the deadline, but past every call's typical
    # answer (20 + 1.8 + 2 = 23.8 s) too, so the step cannot be told to wait for one more than another:
    # only the longer caption (decode 9 s: 25 + 1.8 + 9 = 35.8 s > 20 + 1.8 + 9 = 30.8 s, the
    # horizon it sets) is duplicated. The rest keep the quantile rule.
    calls = [call(replay, 20.0, 7.0, 9.0, 3.0) for _ in range(39)]  # first byte at 7 s, answered at 29 s
    calls.append(call(replay, 20.0, 10.0, 19.0, 9.0))  # first byte at 10 s, answered at 39 s alone
    # the duplicate of the long one, sent at 25 s, answers at 34 s; the others at 29 s, undisturbed
    assert replay.critical_path(calls, 20.0) == 34.0
    assert replay.p98(calls, 20.0) == 39.0


def test_a_first_byte_later_than_its_limit_is_cut_and_retried(replay):
    # the client cuts an attempt at the first-byte limit (30 s) whether it stalled or is merely slow
    limit = replay.FIRST_BYTE_LIMIT_S
    caption = next(
        text
        for text in (f"caption {i}" for i in range(100_000))
        if replay.MODEL.timing(text, 0).first_byte_s > limit and not replay.MODEL.timing(text, 0).stalled
    )
    slow = replay.Call(0.0, caption)
    assert slow.alone_s == limit + slow.second_s < replay.MODEL.timing(caption, 0).total_s


def test_the_stage_benchmark_gives_each_steps_ratio_and_their_median_after_the_first(replay):
    import bench_judge_stage  # loaded by the replay fixture's path

    def row(schedule, step, exposed):
        return {"schedule": schedule, "step": step, "exposed_s": exposed}

    exposed = {
        0: (8.0, 10.0),
        1: (2.0, 10.0),
        2: (6.0, 10.0),
        3: (3.0, 12.0),
    }  # per_rollout, after_generation
    record = {"steps": [r for step, (ours, base) in exposed.items()
                        for r in (row("per_rollout", step, ours), row("after_generation", step, base))]}  # fmt: skip
    text = bench_judge_stage._per_step(record)
    assert "step 0: 8.00 / 10.00 s = 0.80; step 1: 2.00 / 10.00 s = 0.20" in text
    # every step: 0.80, 0.20, 0.60, 0.25 -> median (0.25 + 0.60) / 2 = 0.425
    assert "Median ratio over every step: 0.425;" in text
    # steps 1-3: 0.20, 0.60, 0.25 -> median 0.25; at or under 0.4: steps 1 and 3
    assert "after the first (the judge told the trainer's deadline, learned in the first): 0.250" in text
    assert "2 of 4 steps at or under 0.4" in text
    # a run started at a later step (--first-step 7): its own first step has no deadline
    later = {"steps": [row("per_rollout", 7, 4.0), row("after_generation", 7, 5.0),
                       row("per_rollout", 8, 1.0), row("after_generation", 8, 10.0)]}  # fmt: skip
    text = bench_judge_stage._per_step(later)
    assert "every step: 0.450;" in text and "learned in the first): 0.100;" in text
