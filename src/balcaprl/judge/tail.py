"""The judge's tail: telling a stalled call from a long one, and hedging the stalled ones.

A step waits for its slowest judge call, and one call that stalls holds the whole step until its
timeout, then again on every retry. A timeout on the whole answer cannot tell "stalled" from "long",
so it falls on the longest captions. What can tell them apart is the time to the answer's first
byte -- the first token when the answer is streamed (``stream: true``) -- and the silence between
its chunks; and what bounds an answer that trickles in is a deadline on the whole attempt
(``timeout_s``, held by ``asyncio.timeout`` around it: the HTTP client's own timeouts are per read).

Hedging (:func:`first_answer`, on by default): an attempt that has produced nothing after a high
quantile (``hedge_quantile``) of the recently observed times to first byte -- never less than
``hedge_floor_s`` -- gets one duplicate; the first to answer wins and the other is cancelled. A call
has at most two copies in flight: when one fails while the other has produced nothing, the one left
is watched by the same rule unless it has had its duplicate (a stalled duplicate must not hold the
call until its own limit; a duplicate that fails fast is not sent again). The
quantile counts an attempt still waiting only for the time it has waited (:meth:`Hedging.threshold_s`),
so a run whose calls start one by one does not read its fast first answers as the whole distribution.
Duplicates are capped at ``hedge_max_share`` (default 5%) in every window, not over a lifetime (a quiet
stretch must not save up duplicates for a later slow batch): of the calls of any batch
(:func:`hedge_batch`), of any 1,000 consecutive calls, and of the calls started so far. A duplicate is
a request like any other: admitted by the rate limits and given a slot of the concurrency bound, or
not sent yet (``spare``). Duplicates are counted in the accounting (``hedges``, ``hedge_wins``, one
more call each, and the cancelled attempt's prompt tokens as estimated, since a provider bills a
prompt it has read).

A trainer waits for its batch's last reward, so what a duplicate buys depends on when the rewards are
wanted. When the trainer says so (:meth:`Hedging.wanted_by`, from
:class:`~balcaprl.train.early_judge.EarlyJudge`: the end of generation plus the previous step's wait
until the rewards were asked for), a call is also weighed once, when it has waited the floor (or when
the deadline is told, if later): one still without a first byte that would answer after the deadline
*and* after every call of the step would typically have answered, even if a typical first byte came
now, is on the step's critical path and gets its duplicate then, within the same cap
(:meth:`Hedging.misses_deadline`). Its answer's decode time is predicted from the prompt's size
(:class:`DecodeTimes`: a judge's answer restates the caption's assertions, so it grows with them).

:func:`assemble_stream` turns a streamed answer (server-sent events) back into the one chat
completion it stands for, so everything after the HTTP exchange is the same for both.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import contextvars
import json
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")

WINDOW_CALLS = 1000  # the cap holds in any this many consecutive calls


class _Batch:
    """The calls started and duplicates sent within one batch (:func:`hedge_batch`)."""

    def __init__(self) -> None:
        self.started = 0
        self.hedges = 0


_BATCH: contextvars.ContextVar[_Batch | None] = contextvars.ContextVar("balcaprl_hedge_batch", default=None)


@contextlib.contextmanager
def hedge_batch() -> Iterator[None]:
    """Calls started within this block (and the tasks it creates) are one batch for the hedge cap;
    within a batch already open, nothing changes (the outer batch counts)."""
    if _BATCH.get() is not None:
        yield
        return
    token = _BATCH.set(_Batch())
    try:
        yield
    finally:
        try:
            _BATCH.reset(token)
        except ValueError:  # a coroutine closed from another context (collected at exit): end it there
            _BATCH.set(None)


class DecodeTimes:
    """An answer's time from its first byte to its end, predicted from its prompt's size (characters
    of text): the least-squares line through the last ``window`` answers, ``seconds = a + b * size``
    (a judge's answer restates the caption's assertions, so it grows with the caption; the rubric's
    fixed text is the intercept's share). None until ``min_seen`` answers are known; with sizes all
    alike, their mean."""

    def __init__(self, window: int = 512, min_seen: int = 16):
        self.min_seen = min_seen
        self._seen: deque[tuple[float, float]] = deque(maxlen=window)
        self._sums = [0.0] * 5  # n, sum x, sum y, sum x^2, sum x*y over the window

    def _add(self, x: float, y: float, sign: float) -> None:
        for i, term in enumerate((1.0, x, y, x * x, x * y)):
            self._sums[i] += sign * term

    def observe(self, size: int, seconds: float) -> None:
        if len(self._seen) == self._seen.maxlen:
            self._add(*self._seen[0], -1.0)
        self._seen.append((float(size), seconds))
        self._add(float(size), seconds, 1.0)

    def predict(self, size: int) -> float | None:
        n, sx, sy, sxx, sxy = self._sums
        if len(self._seen) < self.min_seen:
            return None
        spread = n * sxx - sx * sx
        if spread <= 1e-9 * max(1.0, n * sxx):  # one size: no slope to fit
            return max(0.0, sy / n)
        slope = (n * sxy - sx * sy) / spread
        return max(0.0, (sy - slope * sx) / n + slope * size)


class Hedging:
    """When an attempt gets a duplicate, from the times to first byte seen on one endpoint."""

    def __init__(
        self,
        quantile: float,
        floor_s: float,
        max_share: float,
        window: int = 512,
        min_seen: int | None = None,
    ):
        self.quantile, self.floor_s, self.max_share = quantile, floor_s, max_share
        # A quantile q is told from n attempts only if one of them is expected above it, n (1 - q) >= 1
        # (50 for the 98th percentile), and never from fewer than 16.
        self.min_seen = max(16, math.ceil(1 / (1 - quantile) - 1e-9)) if min_seen is None else min_seen
        # (seconds, whether the first byte came then: else the attempt ended without one after them)
        self._seen: deque[tuple[float, bool]] = deque(maxlen=window)
        self.waiting: dict[int, float] = {}  # attempts without a first byte yet: when each started
        self.started = 0  # calls started (duplicates not counted): the next call's position
        self.hedges = 0
        self._hedged: list[int] = []  # positions of the calls that got a duplicate, sorted
        self.decode = DecodeTimes(window)
        self.deadline: float | None = None  # when the rewards are wanted (perf_counter), if told
        self.for_deadline = 0  # duplicates sent because a call would miss it
        self._step: deque[tuple[float, int]] = deque(maxlen=8 * WINDOW_CALLS)  # (start, size): this step's
        self.deadline_changed = asyncio.Event()  # set, and replaced, when the deadline changes

    def observe(self, seconds: float, *, first_byte: bool = True) -> None:
        """An attempt's first byte came after ``seconds``; or, ``first_byte=False``, it ended without
        one after ``seconds`` (cut short by its duplicate, or timed out)."""
        self._seen.append((seconds, first_byte))

    def threshold_s(self, now: float | None = None) -> float | None:
        """The wait after which an attempt without a first byte gets a duplicate: the ``quantile`` of the
        times to first byte (:meth:`first_byte_quantile_s`), at least the floor; None while it is not told."""
        told = self.first_byte_quantile_s(self.quantile, now)
        return None if told is None else max(self.floor_s, told)

    def first_byte_quantile_s(self, quantile: float, now: float | None = None) -> float | None:
        """The ``quantile`` of the times to first byte; None while it is not told.

        An attempt still waiting, or one that ended without a first byte, only says its first byte
        takes longer than it has waited: taking that wait for its time to first byte counts the calls
        just started as fast ones, so while calls start one by one the quantile comes out low (traced
        at the start of a run: the 98th percentile of a heavy tail came out between its 82nd and
        96th, and the capped duplicates went to calls that were not slow). The product-limit
        estimate (Kaplan and Meier, 1958) counts each such attempt only for the times it has reached:
        ``1 - F(t) = prod over first-byte times s <= t of (1 - d_s / n_s)``, ``d_s`` the attempts
        whose first byte came at ``s``, ``n_s`` those that reached ``s`` without one. The quantile is
        told where at least ``min_seen`` attempts are known to have answered by it or to have waited
        past it, and not at all while more than ``1 - quantile`` of them may never answer (the
        first-byte limit ends those)."""
        if len(self._seen) + len(self.waiting) < self.min_seen:
            return None
        now = time.perf_counter() if now is None else now
        times = sorted(  # at a tie the first bytes come first: an attempt waiting s has reached s
            [(seconds, not first_byte) for seconds, first_byte in self._seen]
            + [(now - started, True) for started in self.waiting.values()]
        )
        survival, censored, i = 1.0, 0, 0  # censored: attempts that stopped telling before t
        while i < len(times):
            t, reached = times[i][0], len(times) - i  # n_t
            # known at t: answered by t, or reached t without a first byte
            known, first_bytes = len(times) - censored, 0
            while i < len(times) and times[i][0] == t:
                censored += times[i][1]
                first_bytes += not times[i][1]
                i += 1
            if first_bytes:
                survival *= 1 - first_bytes / reached
                if 1 - survival >= quantile - 1e-9:
                    return t if known >= self.min_seen else None
        return None

    def wanted_by(self, when: float | None) -> None:
        """The step's rewards are wanted at ``when`` (``time.perf_counter``); None: no step waits now
        (its rewards are in), and the next step's calls are counted afresh."""
        self.deadline = when
        if when is None:
            self._step.clear()
        changed, self.deadline_changed = self.deadline_changed, asyncio.Event()
        changed.set()  # the calls waiting for their first byte weigh the new deadline now

    def misses_deadline(self, now: float, size: int) -> bool:
        """Whether a call of prompt ``size`` still without a first byte at ``now`` is on the step's
        critical path: even if a typical (median) first byte came now, its answer would come after the
        deadline and after every call of the step would typically have answered (each from its start,
        a typical first byte and its predicted decode). A call that would miss the deadline when every
        other call does too cannot be told from the rest: the step's end is the batch's, not its own.
        False while no deadline is told, or the median or the decode time is not."""
        typical, decode = self.first_byte_quantile_s(0.5, now), self.decode.predict(size)
        if self.deadline is None or typical is None or decode is None:
            return False
        predict = self.decode.predict
        horizon = max([self.deadline] + [start + typical + (predict(s) or 0.0) for start, s in self._step])
        return now + typical + decode > horizon

    def begin(self, size: int = 0) -> tuple[int, _Batch | None]:
        """A call of prompt ``size`` started: its position among the calls, and the batch it belongs to."""
        batch = _BATCH.get()
        if batch is not None:
            batch.started += 1
        self.started += 1
        self._step.append((time.perf_counter(), size))
        return self.started - 1, batch

    def allow(self, position: int | None = None, batch: _Batch | None = None) -> bool:
        """A duplicate for the call at ``position`` (default: the last started) keeps duplicates within
        ``max_share`` of the calls started so far, of ``batch``'s calls, and of any
        :data:`WINDOW_CALLS` consecutive calls."""
        position = self.started - 1 if position is None else position
        if self.hedges + 1 > self.max_share * self.started:
            return False
        if batch is not None and batch.hedges + 1 > self.max_share * batch.started:
            return False
        return self.window_peak(position) + 1 <= self.max_share * WINDOW_CALLS

    def window_peak(self, position: int) -> int:
        """The most duplicates already sent in any :data:`WINDOW_CALLS` consecutive calls that hold
        ``position`` (the busiest window starts at a hedged call, or at ``position`` itself)."""
        hedged = self._hedged
        near = hedged[
            bisect.bisect_right(hedged, position - WINDOW_CALLS) : bisect.bisect_left(
                hedged, position + WINDOW_CALLS
            )
        ]
        starts = [p for p in near if p <= position] + [position]
        return max(sum(1 for p in near if start <= p < start + WINDOW_CALLS) for start in starts)

    def record(self, position: int, batch: _Batch | None) -> None:
        """A duplicate sent for the call at ``position``."""
        self.hedges += 1
        if batch is not None:
            batch.hedges += 1
        bisect.insort(self._hedged, position)
        if len(self._hedged) > 8 * WINDOW_CALLS:  # the oldest are far behind any call still in flight
            del self._hedged[: 4 * WINDOW_CALLS]


class _Copy:
    """One copy of a call's attempt in flight: its task, when it started, when its first byte came."""

    def __init__(
        self, attempt: Callable[[Callable[[], None]], Awaitable[Any]], on_first_byte: Callable[[], None]
    ):
        self.started = time.perf_counter()
        self.first_byte = asyncio.Event()
        self.first_byte_at: float | None = None
        self.weighed = self.critical = False  # against the step's deadline, once: whether it would miss it
        self.duplicated = False  # one duplicate per copy: a duplicate that fails fast is not sent again
        self._on_first_byte = on_first_byte
        self.task = asyncio.ensure_future(attempt(self._seen))

    def _seen(self) -> None:
        if self.first_byte_at is None:
            self.first_byte_at = time.perf_counter()
            self.first_byte.set()
            self._on_first_byte()

    def succeeded(self) -> bool:
        return self.task.done() and not self.task.cancelled() and self.task.exception() is None


def _freeing(attempt: Callable[[Callable[[], None]], Awaitable[T]], release: Callable[[], None]):
    """``attempt``, freeing what its admission took (:func:`first_answer`'s ``spare``) when it ends."""

    async def duplicated(on_first_byte: Callable[[], None]) -> T:
        try:
            return await attempt(on_first_byte)
        finally:
            release()

    return duplicated


async def first_answer(
    attempt: Callable[[Callable[[], None]], Awaitable[T]],
    hedging: Hedging | None,
    on_hedge: Callable[[bool], None] = lambda won: None,
    spare: Callable[[], Callable[[], None] | None] = lambda: lambda: None,
    ticket: tuple[int, _Batch | None] | None = None,
    size: int = 0,
) -> T:
    """``attempt(on_first_byte)``'s result; with ``hedging``, a duplicate ``attempt`` for a copy in flight
    alone that has produced no byte after :meth:`Hedging.threshold_s`, or that would miss the step's
    deadline (:meth:`Hedging.misses_deadline`, weighed once per copy), when the cap allows it and
    ``spare()`` admits it (returning the function that frees what it took; None: not now). At most two
    copies are in flight, and each copy gets at most one duplicate: when a copy fails while the other
    has produced no byte, the one left is watched by the same rule, as a retry would be, unless it has
    had its duplicate (waiting on a stalled duplicate alone left a call behind it until its own
    first-byte limit; a duplicate that fails fast is not sent again, so a 429 does not bounce). The
    first to succeed wins, the others are cancelled; ``on_hedge(hedge_won)`` is told once per duplicate
    sent, however the call ends. When every copy fails, the first attempt's exception is raised.
    ``ticket``: the call's :meth:`Hedging.begin` (a retry keeps its call's); None begins a new call. ``size``: the prompt's characters of text (its answer's decode time)."""
    if hedging is None:
        return await attempt(lambda: None)
    position, batch = hedging.begin(size) if ticket is None else ticket

    def first_byte() -> None:  # the times to first byte are the first copies' (a duplicate is sent late)
        hedging.waiting.pop(token, None)
        hedging.observe(primary.first_byte_at - primary.started)  # type: ignore[operator]

    def ended_unanswered() -> None:
        # A slow attempt cut short still tells something: its first byte took at least this long.
        # Leaving it out would bias the quantile towards the fast attempts, and hedge ever more.
        hedging.observe(time.perf_counter() - primary.started, first_byte=False)

    primary = _Copy(attempt, first_byte)
    winner: _Copy | None = None
    token = id(primary)
    hedging.waiting[token] = primary.started
    copies: list[_Copy] = [primary]  # the first attempt, then its duplicates
    looks: set[asyncio.Future] = set()  # this round's waits for a first byte or the deadline
    try:
        while True:
            if primary.task.done() and hedging.waiting.pop(token, None) is not None:
                ended_unanswered()  # the first copy failed with no first byte; a duplicate goes on
            winner = next((copy for copy in copies if copy.succeeded()), None)
            live = [copy for copy in copies if not copy.task.done()]
            if winner is not None or not live:
                break
            lone = len(live) == 1 and live[0].first_byte_at is None and not live[0].duplicated
            watched = live[0] if lone else None
            wait: float | None = None  # None: until a copy ends
            if watched is not None:
                now = time.perf_counter()
                # No duplicate before the floor: most attempts answer by then, and never estimate the threshold.
                wait = watched.started + hedging.floor_s - now
                if wait <= 0:
                    if not watched.weighed and hedging.deadline is not None:
                        watched.weighed, watched.critical = True, hedging.misses_deadline(now, size)
                    threshold = hedging.threshold_s(now)
                    due = None if threshold is None else watched.started + threshold - now
                    by_quantile = due is not None and due <= 0
                    if (watched.critical or by_quantile) and hedging.allow(position, batch):
                        release = spare()
                        if release is not None:
                            hedging.record(position, batch)
                            watched.duplicated = True
                            hedging.for_deadline += watched.critical and not by_quantile
                            copies.append(_Copy(_freeing(attempt, release), lambda: None))
                            continue
                    # Not yet due, too few first bytes seen to tell, the cap spent for now (it grows with
                    # the calls started), or no rate or slot to spare: look again then, or every floor_s;
                    # and, until it is weighed, when the trainer tells the step's deadline.
                    wait = hedging.floor_s if watched.critical or due is None or by_quantile else due
                    if not watched.weighed:
                        looks.add(asyncio.ensure_future(hedging.deadline_changed.wait()))
                looks.add(asyncio.ensure_future(watched.first_byte.wait()))
            await asyncio.wait(
                {copy.task for copy in live} | looks, timeout=wait, return_when=asyncio.FIRST_COMPLETED
            )
            for look in looks:
                look.cancel()
            looks.clear()
        if winner is None:
            return primary.task.result()  # every copy failed: the first attempt's failure
        if winner.first_byte_at is not None:  # its decode time, for the next calls' critical path
            hedging.decode.observe(size, time.perf_counter() - winner.first_byte_at)
        return winner.task.result()
    finally:
        for duplicate in copies[1:]:  # each sent and paid for, whatever ended the call
            on_hedge(duplicate is winner)
        for look in looks:
            look.cancel()  # cancelled while waiting (the caller gave up): nothing left pending
        if hedging.waiting.pop(token, None) is not None:
            ended_unanswered()
        for copy in copies:
            if not copy.task.done():
                copy.task.cancel()
            elif not copy.task.cancelled():
                copy.task.exception()  # retrieved: a losing copy's failure is no one's to log


def assemble_stream(raw: bytes) -> bytes:
    """The chat completion a streamed answer (``data: {chunk}`` events, ``data: [DONE]``) stands for:
    its content and refusal joined, its last finish_reason, the usage of its last chunk. A body that
    is not an event stream is returned as it is; an ``error`` event is returned as an error body."""
    content: list[str] = []
    refusal: list[str] = []
    finish_reason = None
    usage: Any = None
    head: dict[str, Any] = {}
    events = 0
    for line in raw.splitlines():
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            continue
        try:
            chunk = json.loads(data)
        except ValueError:
            return raw  # not a stream we can read: classification says what it is
        if not isinstance(chunk, dict):
            return raw
        if "error" in chunk:
            return json.dumps({"error": chunk["error"]}).encode()
        events += 1
        head = head or {k: chunk[k] for k in ("id", "model", "created") if k in chunk}
        if chunk.get("usage"):
            usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str):
                content.append(delta["content"])
            if isinstance(delta.get("refusal"), str):
                refusal.append(delta["refusal"])
            finish_reason = choice.get("finish_reason") or finish_reason
    if not events:
        return raw
    message = {"role": "assistant", "content": "".join(content) if content else None}
    message["refusal"] = "".join(refusal) if refusal else None
    completion = {
        **head,
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": usage,
    }
    return json.dumps(completion, ensure_ascii=False).encode("utf-8")
