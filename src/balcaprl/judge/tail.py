"""The judge's tail: telling a stalled call from a long one, and hedging the stalled ones.

A step waits for its slowest judge call, and one call that stalls holds the whole step until its
timeout, then again on every retry. A timeout on the whole answer cannot tell "stalled" from "long",
so it falls on the longest captions. What can tell them apart is the time to the answer's first
byte -- the first token when the answer is streamed (``stream: true``) -- and the silence between
its chunks; and what bounds an answer that trickles in is a deadline on the whole attempt
(``timeout_s``, held by ``asyncio.timeout`` around it: the HTTP client's own timeouts are per read).

Hedging (:func:`first_answer`, on by default): an attempt that has produced nothing after a high
quantile (``hedge_quantile``) of the recently observed times to first byte -- never less than
``hedge_floor_s`` -- gets one duplicate; the first to answer wins and the other is cancelled.
Duplicates are capped at ``hedge_max_share`` of the calls started (default 5%), counted in the
accounting (``hedges``, ``hedge_wins``, one more call each, and the cancelled attempt's prompt
tokens as estimated, since a provider bills a prompt it has read).

:func:`assemble_stream` turns a streamed answer (server-sent events) back into the one chat
completion it stands for, so everything after the HTTP exchange is the same for both.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")


class Hedging:
    """When an attempt gets a duplicate, from the times to first byte seen on one endpoint."""

    def __init__(
        self, quantile: float, floor_s: float, max_share: float, window: int = 512, min_seen: int = 16
    ):
        self.quantile, self.floor_s, self.max_share, self.min_seen = quantile, floor_s, max_share, min_seen
        self._seen: deque[float] = deque(maxlen=window)
        self.waiting: dict[int, float] = {}  # attempts without a first byte yet: when each started
        self.started = 0  # attempts started (duplicates not counted)
        self.hedges = 0

    def observe(self, seconds: float) -> None:
        self._seen.append(seconds)

    def threshold_s(self, now: float | None = None) -> float | None:
        """The wait after which an attempt without a first byte gets a duplicate: the quantile of
        the observed times, at least the floor; None until ``min_seen`` have been observed. The
        attempts still waiting count with the time they have waited so far (a lower bound of their
        own): early in a batch only the fast ones have answered, and a quantile of those alone would
        be far too low."""
        if len(self._seen) < self.min_seen:
            return None
        now = time.perf_counter() if now is None else now
        ordered = sorted([*self._seen, *(now - start for start in self.waiting.values())])
        return max(self.floor_s, ordered[min(len(ordered) - 1, math.ceil(self.quantile * len(ordered)) - 1)])

    def allow(self) -> bool:
        """One more duplicate keeps them within ``max_share`` of the attempts started."""
        return self.hedges + 1 <= self.max_share * self.started


async def first_answer(
    attempt: Callable[[Callable[[], None]], Awaitable[T]],
    hedging: Hedging | None,
    on_hedge: Callable[[bool], None] = lambda won: None,
) -> T:
    """``attempt(on_first_byte)``'s result; with ``hedging``, a duplicate ``attempt`` when the first
    has produced no byte after :meth:`Hedging.threshold_s` (and the cap allows): the first to
    succeed wins, the other is cancelled, ``on_hedge(hedge_won)`` is told. When both fail, the first
    attempt's exception is raised."""
    if hedging is None:
        return await attempt(lambda: None)
    hedging.started += 1
    started = time.perf_counter()
    first_byte = asyncio.Event()
    token = id(first_byte)
    hedging.waiting[token] = started

    def seen() -> None:
        if not first_byte.is_set():
            first_byte.set()
            hedging.waiting.pop(token, None)
            hedging.observe(time.perf_counter() - started)

    primary = asyncio.ensure_future(attempt(seen))
    byte_seen = asyncio.ensure_future(first_byte.wait())
    try:
        while True:
            if primary.done() or first_byte.is_set():
                return await primary
            threshold = hedging.threshold_s()
            due = None if threshold is None else started + threshold - time.perf_counter()
            if due is not None and due <= 0 and hedging.allow():
                break
            # Not yet due, too few first bytes seen to tell, or the cap spent for now (it grows with
            # the calls started): look again then, or every floor_s.
            wait = hedging.floor_s if due is None or due <= 0 else due
            await asyncio.wait({primary, byte_seen}, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
        hedging.hedges += 1
        duplicate = asyncio.ensure_future(attempt(lambda: None))
        pending = {primary, duplicate}
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            winner = next((t for t in done if not t.cancelled() and t.exception() is None), None)
            if winner is not None:
                for task in pending:
                    task.cancel()
                on_hedge(winner is duplicate)
                return winner.result()
        on_hedge(False)
        return primary.result()  # both failed: the first attempt's failure
    finally:
        byte_seen.cancel()
        hedging.waiting.pop(token, None)
        if not first_byte.is_set():
            # A slow attempt cut short still tells something: its first byte took at least this long.
            # Leaving it out would bias the quantile towards the fast attempts, and hedge ever more.
            hedging.observe(time.perf_counter() - started)
        if not primary.done():
            primary.cancel()


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
