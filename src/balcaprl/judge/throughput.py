"""``concurrency: auto``: as many calls in flight as the rate limits can feed at the observed latency.

A fixed concurrency below what the limits allow makes waves (2,048 calls at 256 in flight are 8
waves, each as long as its slowest call); above it, calls only queue at the rate limiters. By
Little's law the calls in flight that keep a rate ``r`` (calls a second) busy at latency ``L`` are
``r x L``; :func:`auto_concurrency` takes ``r`` from the configured ``requests_per_minute`` and
``tokens_per_minute`` (at a call's estimated tokens), ``L`` from the recently observed latency (a high
quantile, so the slow calls do not starve the rest), with 25% headroom, up to ``concurrency`` (the
upper bound the config keeps). Without rate limits every call goes in flight at once (the bound).
"""

from __future__ import annotations

import asyncio
import math
from collections import deque

FIRST_LATENCY_S = 30.0  # before any call has been seen: a slow hosted judge call (p99 of the model)


def auto_concurrency(
    requests_per_minute: int | None,
    tokens_per_minute: int | None,
    tokens_per_call: int,
    latency_s: float,
    upper: int,
    headroom: float = 1.25,
) -> int:
    """Calls in flight that keep the rate limits busy: ``rate x latency x headroom``, in [1, upper]."""
    rates = []
    if requests_per_minute:
        rates.append(requests_per_minute / 60)
    if tokens_per_minute:
        rates.append(tokens_per_minute / 60 / max(1, tokens_per_call))
    if not rates:
        return upper
    return max(1, min(upper, math.ceil(min(rates) * latency_s * headroom)))


class AdaptiveLimit:
    """A concurrency bound whose limit may change while calls hold it (``async with limit:``)."""

    def __init__(self, limit: int, window: int = 256, quantile: float = 0.95):
        self.limit = limit
        self.in_use = 0
        self._condition = asyncio.Condition()
        self._latencies: deque[float] = deque(maxlen=window)
        self._quantile = quantile

    async def __aenter__(self) -> AdaptiveLimit:
        async with self._condition:
            await self._condition.wait_for(lambda: self.in_use < self.limit)
            self.in_use += 1
        return self

    async def __aexit__(self, *exc: object) -> None:
        async with self._condition:
            self.in_use -= 1
            self._condition.notify_all()  # the limit may have grown: wake every waiter that now fits

    def observe(self, latency_s: float) -> None:
        self._latencies.append(latency_s)

    def latency_s(self) -> float:
        """The recently observed latency's quantile (:data:`FIRST_LATENCY_S` before any call)."""
        if not self._latencies:
            return FIRST_LATENCY_S
        ordered = sorted(self._latencies)
        return ordered[min(len(ordered) - 1, math.ceil(self._quantile * len(ordered)) - 1)]
