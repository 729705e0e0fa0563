"""Judge accounting: what a batch cost and how it went (calls, cache, tokens, failures, latency, USD).

One :class:`JudgeStats` per batch (returned with the outcomes and logged), merged into the judge's
running total. ``requests`` splits into ``cache_hits + coalesced + judged + skipped_empty + rejected``
(rejected = bad input found before any call); ``calls`` counts the chat-completion calls actually made
(re-asks and reference decompositions included; a call's own retries are part of it, not counted
apart).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from balcaprl.judge.config import PriceTable


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0..100) with linear interpolation; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass
class JudgeStats:
    """Counters of one batch (or, merged, of a judge's lifetime)."""

    requests: int = 0
    cache_hits: int = 0
    coalesced: int = 0  # identical to a request already in flight: shared its single call
    judged: int = 0  # requests answered by a fresh call (whatever the outcome)
    skipped_empty: int = 0  # empty captions: scored 0 without a call
    rejected: int = 0  # bad input found before any call (image, reference)
    calls: int = 0  # chat-completion calls made
    reasks: int = 0  # calls that re-asked after an invalid answer
    reference_calls: int = 0  # calls that decomposed a reference (cached-reference mode)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    failures: Counter = field(default_factory=Counter)
    latencies_s: list[float] = field(default_factory=list)  # one per call, its retries included
    # -- tail control (judge/tail.py) --
    hedges: int = 0  # duplicate attempts sent (each also one of `calls`)
    hedge_wins: int = 0  # duplicates that answered first

    def record_answer(self, *, cached: bool, shared: bool) -> None:
        """A request that reached the call path: shared with an identical call in flight, answered
        from the cache, or judged by a fresh call (whatever its outcome)."""
        if shared:
            self.coalesced += 1
        elif cached:
            self.cache_hits += 1
        else:
            self.judged += 1

    def record_call(self, latency_s: float, prompt_tokens: int, completion_tokens: int) -> None:
        self.calls += 1
        self.latencies_s.append(latency_s)
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += completion_tokens

    def record_hedge(self, won: bool, cancelled_prompt_tokens: int) -> None:
        """A duplicate attempt: one more call, and the prompt of the attempt cancelled (billed, unseen)."""
        self.hedges += 1
        self.hedge_wins += int(won)
        self.calls += 1
        self.prompt_tokens += cancelled_prompt_tokens

    def merge(self, other: JudgeStats) -> None:
        for name in (
            "requests", "cache_hits", "coalesced", "judged", "skipped_empty", "rejected",
            "calls", "reasks", "reference_calls", "prompt_tokens", "completion_tokens", "hedges", "hedge_wins",
        ):  # fmt: skip
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.failures.update(other.failures)
        self.latencies_s.extend(other.latencies_s)

    def cost_usd(self, prices: PriceTable | None) -> float | None:
        if prices is None:
            return None
        return (self.prompt_tokens * prices.prompt + self.completion_tokens * prices.completion) / 1e6

    def as_dict(self, prices: PriceTable | None = None) -> dict[str, Any]:
        """JSON-ready summary (latency percentiles instead of the raw list)."""
        return {
            "requests": self.requests,
            "cache_hits": self.cache_hits,
            "coalesced": self.coalesced,
            "judged": self.judged,
            "skipped_empty": self.skipped_empty,
            "rejected": self.rejected,
            "calls": self.calls,
            "reasks": self.reasks,
            "reference_calls": self.reference_calls,
            "hedges": self.hedges,
            "hedge_wins": self.hedge_wins,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "failures": dict(sorted(self.failures.items())),
            "latency_s": {f"p{q}": percentile(self.latencies_s, q) for q in (50, 95, 99)},
            "estimated_cost_usd": self.cost_usd(prices),
        }

    def one_line(self, prices: PriceTable | None = None) -> str:
        """A log line: the figures someone watching a training run wants."""
        lat = {q: percentile(self.latencies_s, q) for q in (50, 95, 99)}
        fmt = lambda v: "-" if v is None else f"{v:.2f}s"  # noqa: E731
        cost = self.cost_usd(prices)
        failures = ", ".join(f"{k}={v}" for k, v in sorted(self.failures.items())) or "none"
        return (
            f"judge: {self.requests} requests, {self.calls} calls, {self.cache_hits} cache hits, "
            f"{self.coalesced} coalesced, {self.skipped_empty} empty; tokens {self.prompt_tokens} in / "
            f"{self.completion_tokens} out; latency p50 {fmt(lat[50])} p95 {fmt(lat[95])} "
            f"p99 {fmt(lat[99])}; failures: {failures}" + ("" if cost is None else f"; ~${cost:.4f}")
        )
