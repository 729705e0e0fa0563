"""What a hedging rule can reach on the judge-stage benchmark's own steps, replayed offline.

``bench_judge_stage.py`` measures the client against a loopback judge; this replays hedging rules on
the same steps and the same draws (its ``plan_step`` and ``LatencyModel``: each attempt's time to
first byte and to the whole answer, first attempts' stalls included) with no server, no concurrency
bound and no estimation, so it separates what a rule can reach from what the client makes of it. A
call's second attempt (its retry or its duplicate) is taken at its drawn time even where the model
stalls it too (0.3% of second attempts), and no call has a third: the real client's worst calls
(a duplicate that stalls, a retry cut again) are not replayed. Every rule gives
at most ``hedge_max_share`` (5%) of each process's calls a duplicate, sent no sooner than the hedge
floor; a stalled attempt with no duplicate is cut at the first-byte limit and retried.

- ``none``: no duplicates;
- ``p98``: the client's rule with the percentile known, not estimated: a duplicate for an attempt
  with no first byte after the 98th percentile of the model's times to first byte;
- ``p98 + waited-on``: the same, and once the trainer waits for its rewards (the end of generation
  and old log-probs) every call still without a first byte gets one, after the floor, oldest first;
- ``critical path``: the client's rule when the trainer tells it when the rewards are wanted
  (``judge/tail.py``, ``Hedging.misses_deadline``), with the median first byte and the decode time
  known, not estimated: ``p98``, and a duplicate for every call still without a first byte at the floor
  (or when generation ends, if later: when the trainer tells the deadline, its end of generation plus
  the old log-probs) that would answer, even with a typical first byte then, after the deadline and
  after every call started so far would typically have answered (its decode time from its caption's
  length);
- ``oracle``: a rule that knows every draw: each process duplicates, at the floor, the calls that
  finish last, one by one while that moves its last answer. No online rule can do better with
  duplicates sent at the floor or later; it bounds what a better rule could buy;
- ``oracle, no cap``: the same without the 5% cap (whether the cap or the knowledge binds).

Per step: the exposed judge time (rewards ready minus the last process's end of generation and old
log-probs) under ``per_rollout`` and ``after_generation``, and their ratio (the stage benchmark's
exposed-time goal is at most 0.4); and under ``today`` (every call started when the trainer waits),
which a rule must not make worse. Steps are the stage benchmark's (``plan_step(step, ...)``; its
real-speed run uses the first of them).

Run: ``python benchmarks/replay_hedging.py [--steps 8] [--json PATH]``; about 30 s of CPU.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from bench_judge_stage import (  # noqa: E402  (a sibling script: the same steps, the same model)
    GENERATION_S,
    GROUP_SIZE,
    LOGPROB_S,
    PAPER_ROLLOUTS,
    PROCESSES,
    latency_model,
    plan_step,
)

from balcaprl.judge import JudgeConfig  # noqa: E402

MODEL = latency_model()  # in real seconds
_DEFAULTS = JudgeConfig.model_fields
FLOOR_S = _DEFAULTS["hedge_floor_s"].default
FIRST_BYTE_LIMIT_S = _DEFAULTS["first_byte_timeout_s"].default
SHARE = _DEFAULTS["hedge_max_share"].default
QUANTILE = _DEFAULTS["hedge_quantile"].default


def first_byte_quantile(q: float) -> float:
    """The model's time to first byte at quantile ``q``: ``first_byte_s * exp(sigma * z_q)``."""
    return MODEL.first_byte_s * math.exp(MODEL.sigma * statistics.NormalDist().inv_cdf(q))


class Call:
    """One judge call of a process: when it starts and its first two attempts' draws."""

    def __init__(self, start_s: float, caption: str):
        first, second = MODEL.timing(caption, 0), MODEL.timing(caption, 1)
        self.start_s = start_s
        self.first_byte_s = math.inf if first.stalled else first.first_byte_s
        self.second_s = second.total_s  # a retry's or a duplicate's whole answer
        # alone: its first attempt, or one cut at the first-byte limit (a stall, or a first byte later
        # than the limit) and retried
        cut = first.stalled or first.first_byte_s > FIRST_BYTE_LIMIT_S
        self.alone_s = FIRST_BYTE_LIMIT_S + self.second_s if cut else first.total_s
        self.typical_decode_s = MODEL.per_char_s * len(caption)  # the model's median: known from the caption

    def end(self, duplicate_at_s: float | None = None) -> float:
        """When it answers, given a duplicate sent ``duplicate_at_s`` after its start (None: none)."""
        alone = self.start_s + self.alone_s
        return alone if duplicate_at_s is None else min(alone, self.start_s + duplicate_at_s + self.second_s)

    def waiting_at(self, after_s: float) -> bool:
        """Still without a first byte ``after_s`` after its start (and not cut yet)."""
        return after_s < min(self.first_byte_s, FIRST_BYTE_LIMIT_S)


Rule = Callable[[list[Call], float], float]  # a process's calls and when its trainer waits -> last answer


def no_duplicates(calls: list[Call], waits_at_s: float) -> float:
    return max(c.end() for c in calls)


def duplicates_in_time_order(calls: list[Call], due: list[tuple[float, int]]) -> float:
    """``due``: (when, call index) a duplicate becomes due; granted in time order within the cap."""
    budget, sent = math.floor(SHARE * len(calls)), {}
    for when, i in sorted(due):
        call = calls[i]
        if budget and i not in sent and call.waiting_at(when - call.start_s):
            sent[i], budget = when - call.start_s, budget - 1
    return max(c.end(sent.get(i)) for i, c in enumerate(calls))


def p98(calls: list[Call], waits_at_s: float) -> float:
    after = max(FLOOR_S, first_byte_quantile(QUANTILE))
    return duplicates_in_time_order(calls, [(c.start_s + after, i) for i, c in enumerate(calls)])


def p98_and_waited_on(calls: list[Call], waits_at_s: float) -> float:
    after = max(FLOOR_S, first_byte_quantile(QUANTILE))
    due = [(c.start_s + after, i) for i, c in enumerate(calls)]
    due += [(max(waits_at_s, c.start_s + FLOOR_S), i) for i, c in enumerate(calls)]
    return duplicates_in_time_order(calls, due)


def critical_path(calls: list[Call], waits_at_s: float) -> float:
    """``p98``, and a duplicate for every call still without a first byte when it is weighed (at the
    floor, or when the deadline is told at the end of generation, if later) that would answer after
    the deadline and after every call started by then would typically have answered, even with a
    typical first byte then: the calls the step will wait for, sent first."""
    after = max(FLOOR_S, first_byte_quantile(QUANTILE))
    told = waits_at_s - LOGPROB_S  # the end of generation
    typical = MODEL.first_byte_s  # the median first byte

    def misses(call: Call, at_s: float) -> bool:
        started = [c.start_s + typical + c.typical_decode_s for c in calls if c.start_s <= at_s]
        return at_s + typical + call.typical_decode_s > max([waits_at_s, *started])

    due = [(c.start_s + after, i) for i, c in enumerate(calls)]
    weighed = [(max(c.start_s + FLOOR_S, told), i) for i, c in enumerate(calls)]
    return duplicates_in_time_order(calls, due + [(t, i) for t, i in weighed if misses(calls[i], t)])


def oracle(calls: list[Call], waits_at_s: float, share: float = SHARE) -> float:
    ends, sent, budget = [c.end() for c in calls], set(), math.floor(share * len(calls))
    while budget:
        last = max((i for i in range(len(calls)) if i not in sent), key=ends.__getitem__)
        helped = calls[last].end(FLOOR_S)
        if ends[last] < max(ends) or helped >= ends[last]:
            break  # the last answer is one a duplicate cannot move
        ends[last], budget = helped, budget - 1
        sent.add(last)
    return max(ends)


RULES: dict[str, Rule] = {
    "none": no_duplicates,
    "p98": p98,
    "p98 + waited-on": p98_and_waited_on,
    "critical path": critical_path,
    "oracle": oracle,
    "oracle, no cap": lambda calls, waits_at_s: oracle(calls, waits_at_s, share=1.0),  # does the cap bind?
}


def exposed_s(step: int, schedule: str, rule: Rule) -> float:
    """One step's exposed judge time under ``schedule`` (``per_rollout``, ``after_generation``, or
    ``today``: every call started when the trainer waits)."""
    plan = plan_step(step, PROCESSES, PAPER_ROLLOUTS // PROCESSES, GROUP_SIZE, GENERATION_S)
    ready = []
    for p, generation_end in enumerate(plan.generation_end_s):
        mine = plan.rollouts_of(p)
        start = {"after_generation": generation_end, "today": generation_end + LOGPROB_S}.get(schedule)
        starts = [r.finish_s if start is None else start for r in mine]
        calls = [Call(s, r.request.caption) for s, r in zip(starts, mine, strict=True)]
        ready.append(rule(calls, generation_end + LOGPROB_S))
    return max(0.0, max(ready) - (max(plan.generation_end_s) + LOGPROB_S))


def replay(steps: int) -> dict:
    rows = []
    for name, rule in RULES.items():
        per_step = [
            (exposed_s(s, "per_rollout", rule), exposed_s(s, "after_generation", rule)) for s in range(steps)
        ]
        ratios = [a / b if b > 0 else math.nan for a, b in per_step]
        rows.append({"rule": name, "per_rollout_s": [a for a, _ in per_step],
                     "after_generation_s": [b for _, b in per_step], "ratio": ratios,
                     "today_s": [exposed_s(s, "today", rule) for s in range(steps)]})  # fmt: skip
    return {"steps": steps, "quantile_s": first_byte_quantile(QUANTILE), "floor_s": FLOOR_S, "share": SHARE,
            "rows": rows}  # fmt: skip


def markdown(result: dict) -> str:
    lines = [
        "| rule | per_rollout exposed, median | after_generation exposed, median | ratio, median (min-max) "
        "| ratio at steps 0, 1 | today exposed, median |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in result["rows"]:
        r = row["ratio"]
        lines.append(
            f"| {row['rule']} | {statistics.median(row['per_rollout_s']):.1f} s "
            f"| {statistics.median(row['after_generation_s']):.1f} s "
            f"| {statistics.median(r):.2f} ({min(r):.2f}-{max(r):.2f}) | {r[0]:.2f}, {r[1]:.2f} "
            f"| {statistics.median(row['today_s']):.1f} s |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = parser.parse_args()
    result = replay(max(2, args.steps))
    result["markdown"] = markdown(result)
    print(result["markdown"])
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
