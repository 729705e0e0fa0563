"""How many judge calls go in flight, and how fast requests may start.

**Calls in flight.** ``concurrency`` is the number of calls in flight: a number, or ``auto``. Under
``auto``, by Little's law the calls in flight that keep a rate ``r`` (calls a second) busy at latency
``L`` are ``r x L``; :func:`auto_concurrency` takes ``r`` from the rate limits (stated, or
:data:`DEFAULT_TIER` when none is stated) and ``L`` from the observed latency of first attempts (a
high quantile, so the slow calls do not starve the rest; a retry's backoff is not the endpoint's
latency), with 25% headroom, up to :func:`auto_bound`: ``auto_max_concurrency`` and what the
process's open-file limit leaves (each call in flight holds a socket). :func:`calls_in_flight` is the
one place that turns a config into calls in flight; spans, the cost plan and the client all use it.

**Slots** (:class:`Slots`): the bound itself. A call holds a slot for one attempt, never through a
retry's backoff. A 429 halves the calls in flight allowed (and each answer adds one back, up to the
bound): additive increase, multiplicative decrease, the rule TCP uses for congestion (RFC 5681), so
a rate-limit storm lowers the load it meets, never raises it. Timeouts beyond the tail (more than 5%
of the recent attempts) halve it too, once per observed latency: retrying every timed-out attempt at
full concurrency only keeps an endpoint that cannot keep up from catching up.

**Rates** (:class:`RateWindow`): every attempt -- first, retry, hedge -- takes its slot first, then
is admitted by the request and token limits over a sliding minute (:data:`RATE_WINDOW_S`) and
starts at once, so in no 60 s window do more than ``requests_per_minute`` requests (or
``tokens_per_minute`` budgeted tokens) start. A token bucket of the same size would let twice that
through in its first minute (a full bucket, then its refill).
"""

from __future__ import annotations

import asyncio
import logging
import math
import resource
import time
from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from balcaprl.judge.config import JudgeConfig

log = logging.getLogger("balcaprl.judge")

FIRST_LATENCY_S = 30.0  # before any call has been seen: a slow hosted judge call (p99 of the model)
RATE_WINDOW_S = 60.0  # the window of requests_per_minute and tokens_per_minute
# The limits `auto` sizes from when a config states none: an OpenAI usage tier's for gpt-4o-mini
# (tier 3, the example of docs/judge.md). They size the calls in flight only; no pacing is added.
DEFAULT_TIER = {"requests_per_minute": 5_000, "tokens_per_minute": 4_000_000}
# Open files kept for everything but sockets (the cache, images, logs, the interpreter's own): a
# quarter of the limit, and at least this many.
FD_HEADROOM = 64
# Timeouts within this share of the recent attempts are the tail (hedge_max_share's default budget);
# beyond it they are an endpoint falling behind.
TIMEOUT_SHARE = 0.05


def auto_concurrency(
    requests_per_minute: int | None,
    tokens_per_minute: int | None,
    tokens_per_call: int,
    latency_s: float,
    upper: int,
    headroom: float = 1.25,
) -> int:
    """Calls in flight that keep the rate limits busy: ``rate x latency x headroom``, in [1, upper]."""
    minute = RATE_WINDOW_S  # the limits' window: 60 s (a benchmark at 10x speed shortens it)
    rates = []
    if requests_per_minute:
        rates.append(requests_per_minute / minute)
    if tokens_per_minute:
        rates.append(tokens_per_minute / minute / max(1, tokens_per_call))
    if not rates:
        return upper
    return max(1, min(upper, math.ceil(min(rates) * latency_s * headroom)))


def open_file_bound() -> int:
    """Sockets this process may hold at once: its open-file limit (RLIMIT_NOFILE, soft) less a quarter
    of it, and less at least :data:`FD_HEADROOM`, for everything else it opens."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1 << 20
    return max(1, soft - max(FD_HEADROOM, soft // 4))


def auto_bound(cfg: JudgeConfig) -> int:
    """The most calls ``auto`` puts in flight: ``auto_max_concurrency``, within the open-file limit."""
    return max(1, min(cfg.auto_max_concurrency, open_file_bound()))


def sizing_limits(cfg: JudgeConfig) -> tuple[int | None, int | None]:
    """The rates ``auto`` sizes from: the stated ones, else :data:`DEFAULT_TIER`'s."""
    if cfg.requests_per_minute is None and cfg.tokens_per_minute is None:
        return DEFAULT_TIER["requests_per_minute"], DEFAULT_TIER["tokens_per_minute"]
    return cfg.requests_per_minute, cfg.tokens_per_minute


def calls_in_flight(cfg: JudgeConfig, latency_s: float, tokens_per_call: int = 1) -> int:
    """Calls in flight under ``cfg`` at ``latency_s`` per call: ``concurrency`` when it is a number;
    under ``auto``, what the rate limits feed at that latency (:func:`auto_concurrency`)."""
    if not cfg.concurrency_auto:
        return cfg.concurrency
    rpm, tpm = sizing_limits(cfg)
    return auto_concurrency(rpm, tpm, tokens_per_call, latency_s, auto_bound(cfg))


def span_rows(cfg: JudgeConfig) -> int:
    """Rows judged per span (``evaluate``, ``score``): twice the most calls ever in flight, so one span
    keeps the judge busy while the other is written. Under ``auto`` that is its size at the longest a
    first attempt may take (``timeout_s``), at the request rate (a call's tokens taken as 1)."""
    return 2 * calls_in_flight(cfg, cfg.timeout_s)


def forecast_s(cfg: JudgeConfig, calls: int, tokens_per_call: int) -> tuple[float, str] | None:
    """The shortest time the stated rate limits allow for ``calls`` calls, and which limit it is;
    None without stated limits."""
    bounds = []
    if cfg.requests_per_minute:
        bounds.append((RATE_WINDOW_S * calls / cfg.requests_per_minute, "requests_per_minute"))
    if cfg.tokens_per_minute:
        bounds.append((RATE_WINDOW_S * calls * tokens_per_call / cfg.tokens_per_minute, "tokens_per_minute"))
    return max(bounds) if bounds else None


def announce(cfg: JudgeConfig, calls: int, tokens_per_call: int | None = None) -> float | None:
    """Say on the console, before the first call, when the rate limits make ``calls`` calls take
    longer than ``horizon_s``; returns the predicted seconds (None without stated limits).
    ``tokens_per_call``: by default an image at ``max_image_side`` and the first answer budget."""
    if tokens_per_call is None:
        from balcaprl.judge.tokens import CompletionBudget, image_cost_rule

        side = cfg.max_image_side
        tokens_per_call = image_cost_rule(cfg.model).tokens(side, side) + min(
            cfg.max_tokens, CompletionBudget().first_guess
        )
    forecast = forecast_s(cfg, calls, tokens_per_call)
    if forecast is None:
        return None
    seconds, limit = forecast
    if seconds > cfg.horizon_s:
        line = (
            f"judge: {calls:,} calls at {limit} {getattr(cfg, limit):,} take at least "
            f"{seconds / 60:,.1f} min (more than horizon_s, {cfg.horizon_s / 60:,.0f} min)"
        )
        log.warning("%s", line)
    return seconds


class RateWindow:
    """At most ``capacity`` units (requests, tokens) started in any ``window_s`` seconds."""

    def __init__(self, capacity: int, window_s: float | None = None):
        self.capacity = capacity
        self.window_s = RATE_WINDOW_S if window_s is None else window_s
        self._started: deque[tuple[float, int]] = deque()
        self._used = 0
        self._lock = asyncio.Lock()  # first come, first admitted

    def _expire(self, now: float) -> None:
        while self._started and self._started[0][0] <= now - self.window_s:
            self._used -= self._started.popleft()[1]

    def has_room(self, amount: int) -> bool:
        self._expire(time.monotonic())
        return self._used + min(amount, self.capacity) <= self.capacity

    def take(self, amount: int) -> None:
        """Record ``amount`` started now (after :meth:`has_room`)."""
        amount = min(amount, self.capacity)
        self._started.append((time.monotonic(), amount))
        self._used += amount

    async def acquire(self, amount: int) -> None:
        """Wait until ``amount`` more keeps the window within capacity, then take it (a call larger
        than the whole capacity takes all of it: refused at load when even the smallest is)."""
        async with self._lock:
            while not self.has_room(amount):
                await asyncio.sleep(max(0.001, self._started[0][0] + self.window_s - time.monotonic()))
            self.take(amount)


class Slots:
    """The bound on calls in flight (``async with slots:`` around one attempt): ``limit`` (the
    configured concurrency, or ``auto``'s size, which may change while calls hold slots), lowered
    under rate limiting by :meth:`throttled` and raised back by :meth:`answered` (see the module)."""

    def __init__(self, limit: int, window: int = 256, quantile: float = 0.95):
        self.limit = limit
        self.congestion = math.inf  # AIMD: the calls in flight the endpoint takes now (inf: no 429 lately)
        self.in_use = 0
        self._condition = asyncio.Condition()
        self._latencies: deque[float] = deque(maxlen=window)
        self._quantile = quantile
        self._timeouts: deque[bool] = deque(maxlen=window)
        self._last_cut = -math.inf

    @property
    def allowed(self) -> int:
        return max(1, self.limit if math.isinf(self.congestion) else min(self.limit, int(self.congestion)))

    async def __aenter__(self) -> Slots:
        async with self._condition:
            await self._condition.wait_for(lambda: self.in_use < self.allowed)
            self.in_use += 1
        return self

    async def __aexit__(self, *exc: object) -> None:
        async with self._condition:
            self.in_use -= 1
            self._condition.notify_all()  # the limit may have grown: wake every waiter that now fits

    def throttled(self) -> None:
        """A 429: half the calls in flight now (at least 1)."""
        self.congestion = max(1.0, min(self.congestion, self.in_use, self.limit) / 2)

    def timed_out(self, timed_out: bool) -> None:
        """An attempt's end, timed out or not. Timeouts beyond the tail the hedges are budgeted for
        (:data:`TIMEOUT_SHARE` of the recent attempts) mean an endpoint that cannot keep up: half the
        calls in flight, once per observed latency (TCP's rule for a retransmission timeout); a few
        stalls among many answers cut nothing."""
        self._timeouts.append(timed_out)
        now = time.monotonic()
        if (
            timed_out
            and sum(self._timeouts) > TIMEOUT_SHARE * len(self._timeouts)
            and now - self._last_cut >= self.latency_s()
        ):
            self._last_cut = now
            self.throttled()

    def answered(self) -> None:
        """An answer: one more call in flight allowed; back at ``limit``, no bound of its own."""
        self.congestion += 1
        if self.congestion >= self.limit:
            self.congestion = math.inf

    def observe(self, latency_s: float) -> None:
        """A first attempt's latency (retries and their backoff are not the endpoint's latency)."""
        self._latencies.append(latency_s)

    def latency_s(self) -> float:
        """The recently observed latency's quantile (:data:`FIRST_LATENCY_S` before any call)."""
        if not self._latencies:
            return FIRST_LATENCY_S
        ordered = sorted(self._latencies)
        return ordered[min(len(ordered) - 1, math.ceil(self._quantile * len(ordered)) - 1)]
