"""Judging overlapped with generation: a rollout's judge call starts as soon as its caption exists.

TRL 1.16 calls the reward functions after generation *and* the old-log-prob forward, so the judge's
whole stage sits on the step's critical path. :class:`EarlyJudge` wraps the judge the reward
functions use: the trainer hands it the batch's requests as soon as the completions exist
(:meth:`EarlyJudge.start`, from any thread), or one rollout at a time as the rollout engine finishes
it, and when the reward functions later ask (:meth:`EarlyJudge.judge_batch`, the ``Judge``
protocol) each request is answered by the call already in flight for it. Requests nobody started
are judged then, as without overlap. The calls are the judge's own, for the same requests: the
rewards and advantages are those of the path without overlap (tests check both on the tiny model).

It also times the stage for the step's metrics (:meth:`EarlyJudge.step_times`): ``judge/wall_s``
from the first call started to the rewards ready, ``judge/exposed_s`` from when the reward functions
asked to the rewards ready (the part of the judge the step waits for).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import defaultdict, deque
from collections.abc import Hashable, Sequence

from balcaprl.judge.accounting import JudgeStats
from balcaprl.judge.protocol import Judge, JudgeOutcome, JudgeRequest

__all__ = ["EarlyJudge", "StepTimes", "request_key"]


def request_key(request: JudgeRequest) -> Hashable:
    """What makes two requests the same call: rubric, texts, and the image (a path by its text, an
    in-memory image by identity: the rollouts of one prompt share their image object)."""
    image = request.image
    image_id = os.fspath(image) if isinstance(image, str | os.PathLike) else id(image)
    return (request.rubric, request.caption, request.reference, image_id)


class StepTimes(tuple):
    """``(wall_s, exposed_s)`` of one step's judge stage."""

    __slots__ = ()

    def __new__(cls, wall_s: float, exposed_s: float) -> StepTimes:
        return super().__new__(cls, (wall_s, exposed_s))

    @property
    def wall_s(self) -> float:
        return self[0]

    @property
    def exposed_s(self) -> float:
        return self[1]


class EarlyJudge:
    """A :class:`~balcaprl.judge.protocol.Judge` whose calls may start before they are asked for.

    ``loop``: the event loop the reward functions run on (TRL's ``async_loop``); :meth:`start` hands
    requests to it thread-safely. The requests started since the last loop iteration go to the
    wrapped judge as one batch (a rollout engine finishing rollouts one by one makes small batches).
    ``stats``: the accounting of the answers handed out (when the wrapped judge has
    ``judge_batch_with_stats``), so a step's usage counts the calls it used, whenever they ran.
    """

    def __init__(self, judge: Judge, loop: asyncio.AbstractEventLoop | None = None):
        self.judge = judge
        self.loop = loop
        self.stats = JudgeStats()
        self.config = getattr(judge, "config", None)  # prices for judge_usage
        self._started: dict[Hashable, deque[asyncio.Future]] = defaultdict(deque)
        self._first_start: float | None = None
        self._last_times = StepTimes(0.0, 0.0)

    def __repr__(self) -> str:
        return f"EarlyJudge({self.judge!r})"

    # -- starting calls early ---------------------------------------------------------------------

    def start(self, requests: Sequence[JudgeRequest]) -> None:
        """Start judging ``requests`` now (thread-safe; returns at once)."""
        if not requests:
            return
        if self.loop is None:
            raise RuntimeError("EarlyJudge.start needs the reward functions' event loop (loop=...)")
        if self._first_start is None:
            self._first_start = time.perf_counter()
        self.loop.call_soon_threadsafe(self._launch, list(requests))

    def _launch(self, requests: list[JudgeRequest]) -> None:
        futures = [self.loop.create_future() for _ in requests]  # type: ignore[union-attr]
        for request, future in zip(requests, futures, strict=True):
            self._started[request_key(request)].append(future)
        self.loop.create_task(self._judge_into(requests, futures))  # type: ignore[union-attr]

    async def _judge_into(self, requests: list[JudgeRequest], futures: list[asyncio.Future]) -> None:
        try:
            outcomes, stats = await self._judge(requests)
        except BaseException as error:  # the reward functions see the judge's exception, as without overlap
            for future in futures:
                if not future.done():
                    future.set_exception(error)
            if not isinstance(error, Exception):
                raise
            return
        for future, outcome in zip(futures, outcomes, strict=True):
            future.set_result((outcome, stats))

    async def _judge(self, requests: list[JudgeRequest]) -> tuple[list[JudgeOutcome], JudgeStats | None]:
        with_stats = getattr(self.judge, "judge_batch_with_stats", None)
        if with_stats is not None:
            result = await with_stats(requests)
            return list(result.outcomes), result.stats
        return list(await self.judge.judge_batch(requests)), None

    # -- the Judge protocol -----------------------------------------------------------------------

    async def judge_batch(self, requests: Sequence[JudgeRequest]) -> list[JudgeOutcome]:
        """One outcome per request, in order: from the call started for it, else a fresh call."""
        asked = time.perf_counter()
        first = self._first_start if self._first_start is not None else asked
        waiting: list[asyncio.Future | None] = []
        fresh: list[JudgeRequest] = []
        for request in requests:
            queue = self._started.get(request_key(request))
            waiting.append(queue.popleft() if queue else None)
            if waiting[-1] is None:
                fresh.append(request)
        fresh_outcomes: list[JudgeOutcome] = []
        if fresh:
            fresh_outcomes, stats = await self._judge(fresh)
            if stats is not None:
                self.stats.merge(stats)
        merged: set[int] = set()
        outcomes: list[JudgeOutcome] = []
        next_fresh = iter(fresh_outcomes)
        for future in waiting:
            if future is None:
                outcomes.append(next(next_fresh))
                continue
            outcome, stats = await future
            if stats is not None and id(stats) not in merged:  # one batch's stats, once
                merged.add(id(stats))
                self.stats.merge(stats)
            outcomes.append(outcome)
        done = time.perf_counter()
        self._last_times = StepTimes(done - first, done - asked)
        self._first_start = None
        return outcomes

    def step_times(self) -> StepTimes:
        """``(wall_s, exposed_s)`` of the last batch the reward functions asked for."""
        return self._last_times

    def forget_started(self) -> int:
        """Drop calls started but never asked for (a step that failed before its rewards); how many."""
        dropped = sum(len(queue) for queue in self._started.values())
        self._started.clear()
        self._first_start = None
        return dropped
