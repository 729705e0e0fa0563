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
    # the trainer waits from 20 s. Call A (start 15 s, decode 10 s) would answer past 20 s even with a
    # typical first byte: a duplicate at 15 + 5 = 20 s if it is still waiting. Call B (start 0, decode
    # 2 s) would not, and its first byte at 8 s is under the 98th percentile: no duplicate.
    slow = call(replay, 15.0, 9.0, 19.0, 12.0)  # first byte at 9 s, answer at 15 + 19 = 34 s alone
    fine = call(replay, 0.0, 8.0, 10.0, 3.0)
    calls = [slow, fine] + [call(replay, 0.0, 1.0, 3.0, 6.0) for _ in range(38)]
    assert replay.critical_path(calls, 20.0) == 32.0  # 15 + 5 + 12: the duplicate wins
    assert replay.p98(calls, 20.0) == 34.0  # 9 s is under the 98th percentile (18 s): none sent
