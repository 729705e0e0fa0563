"""Judging started before it is asked for: a rollout's judge call starts as soon as its caption exists.
Backend-neutral (no TRL, no verl): the TRL trainer drives it through ``train/judge_overlap.py``; verl's
reward loop judges each rollout as it finishes by itself and uses only the time stamps below.

TRL 1.16 calls the reward functions after generation *and* the old-log-prob forward, so the judge's
whole stage sits on the step's critical path. :class:`EarlyJudge` wraps the judge the reward
functions use: the trainer hands it the batch's requests as soon as the completions exist
(:meth:`EarlyJudge.start`, from any thread), or one rollout at a time as the rollout engine finishes
it (:meth:`EarlyJudge.start_rollouts`, then :meth:`EarlyJudge.settle` with the batch TRL decoded),
and when the reward functions later ask (:meth:`EarlyJudge.judge_batch`, the ``Judge`` protocol)
each request is answered by the call already in flight for it. Requests nobody started are judged
then, as without overlap. Where one process sees every process's rollouts finish (TRL's server mode:
the main process posts all prompts), it starts the other processes' calls as well
(:meth:`EarlyJudge.start_held`) and hands over their outcomes (:meth:`EarlyJudge.held_verdicts`, sent
by the trainer); each process takes its own (:meth:`EarlyJudge.receive`) before it settles. The calls are the judge's own, for the same requests (built by
:func:`~balcaprl.train.judging.judge_requests`, as ``judge_rollouts`` builds them): the rewards and
advantages are those of the path without overlap (tests check both on the tiny model).

It also times the stage for the step's metrics (:meth:`EarlyJudge.step_times`): ``judge/wall_s``
from the first call started to the rewards ready, ``judge/exposed_s`` from when the reward functions
asked to the rewards ready (the part of the judge the step waits for), and counts
``judge/started_early_share``: the share of the batch's rollouts whose call was started while they
were being generated (:meth:`EarlyJudge.start_rollouts`, kept by :meth:`EarlyJudge.settle`).
Judge usage comes back with each batch, one dict of counters
(:meth:`EarlyJudge.judge_batch_counted`, read by :func:`~balcaprl.train.judging.counted_judge_batch`).

It also tells a judge that can use it (:class:`~balcaprl.judge.protocol.SupportsDeadline`) when the
rewards will be wanted: when generation ends (:meth:`EarlyJudge.generation_done`, which the trainer calls
for a training batch), the time from the end of generation to the reward functions' call in the previous step
(the old-log-prob forward, the reference model) from now; and no deadline once the rewards are in. The
judge spends its duplicate requests on the calls that would answer after it (``judge/tail.py``). The
first step has none: its time is learned then.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

from balcaprl.judge.protocol import Judge, JudgeOutcome, JudgeRequest, SupportsDeadline, sendable_requests
from balcaprl.train.judging import UsageMeter, counted_judge_batch

logger = logging.getLogger(__name__)


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


# ------------------------------------------------------------------------------------------------
# The judge's share of a step from per-rollout timestamps (verl: compute_score stamps each rollout).
# ------------------------------------------------------------------------------------------------

STARTED, FINISHED = "judge_started_s", "judge_finished_s"


def stamped(result: dict[str, Any], started: float) -> dict[str, Any]:
    """A per-rollout result with when its judging started and finished (``time.time()``)."""
    result[STARTED], result[FINISHED] = started, time.time()
    return result


def judge_stage_metrics(results: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """``judge/wall_s`` (first judging started to last finished) and ``judge/exposed_s`` (last
    started to last finished: verl judges each rollout as soon as it is generated, so the last start
    is the end of generation and what follows it is the part of the judge the step waits for), from
    the rollouts' stamps; {} without any."""
    stamps = [(float(r[STARTED]), float(r[FINISHED])) for r in results if STARTED in r and FINISHED in r]
    stamps = [(s, f) for s, f in stamps if s == s and f == f]  # NaN: not stamped
    if not stamps:
        return {}
    starts, ends = zip(*stamps, strict=True)
    return {"judge/wall_s": max(ends) - min(starts), "judge/exposed_s": max(ends) - max(starts)}


class EarlyJudge:
    """A :class:`~balcaprl.judge.protocol.Judge` whose calls may start before they are asked for.

    ``loop``: the event loop the reward functions run on (TRL's ``async_loop``); :meth:`start` hands
    requests to it thread-safely. The requests started since the last loop iteration go to the
    wrapped judge as one batch (a rollout engine finishing rollouts one by one makes small batches).
    :meth:`judge_batch_counted`: the outcomes and the usage of the calls spent since the last batch
    answered (those it used, whenever they ran, and any started and then dropped), counted by
    :func:`~balcaprl.train.judging.counted_judge_batch` (a judge's own per-batch stats, or its
    cumulative counters read through one :class:`~balcaprl.train.judging.UsageMeter`, so batches in
    flight together are counted once).
    """

    def __init__(self, judge: Judge, loop: asyncio.AbstractEventLoop | None = None):
        self.judge = judge
        self.loop = loop
        self._meter = UsageMeter(judge)
        self._spent: Counter[str] = Counter()  # usage of the calls finished since the last batch answered
        self._started: dict[Hashable, deque[asyncio.Future]] = defaultdict(deque)
        self._slots: dict[int, tuple[Hashable, asyncio.Future]] = {}  # rollout index -> its early call
        self._held: dict[Hashable, tuple[Hashable, asyncio.Future]] = {}  # another process's rollouts
        self.mismatched = 0  # early calls whose rollout TRL decoded to another request (none expected)
        self._first_start: float | None = None
        self._last_times = StepTimes(0.0, 0.0)
        self._early_share = 0.0  # of the last settled batch: calls started while it was generated
        self._generated_at: float | None = None  # when this batch's generation ended
        self.lead_s: float | None = None  # the last step's end of generation -> rewards asked for

    def __repr__(self) -> str:
        return f"EarlyJudge({self.judge!r})"

    # -- starting calls early ---------------------------------------------------------------------

    def start(self, requests: Sequence[JudgeRequest]) -> None:
        """Start judging ``requests`` now (thread-safe; returns at once)."""
        if requests:
            self._on_loop(self._register, list(requests))

    def start_rollouts(self, by_index: Mapping[int, JudgeRequest]) -> None:
        """Start judging rollouts the engine just finished, by their index in the batch (thread-safe).
        Held by index until :meth:`settle` compares them with the batch TRL decoded."""
        if by_index:
            self._on_loop(self._launch_rollouts, dict(by_index))

    def start_held(self, by_place: Mapping[Hashable, JudgeRequest]) -> None:
        """Start judging rollouts that another process will score (thread-safe), by their place (a key
        of the caller's, e.g. ``(process, index)``). Held until :meth:`held_verdicts` hands them over."""
        if by_place:
            self._on_loop(self._launch_held, dict(by_place))

    async def held_verdicts(self) -> dict[Hashable, tuple[Hashable, JudgeOutcome]]:
        """The held calls' outcomes by place, each with its request's :func:`request_key` (on the loop);
        a call that failed or was dropped is left out (its process judges that rollout itself). Their
        usage is counted here, in the next batch this judge answers."""
        held, self._held = self._held, {}
        verdicts = {}
        for place, (key, future) in held.items():
            if future.cancelled():
                continue
            try:
                outcome, spent = await future
            except Exception:  # the owner's own call will meet the judge's exception, as without overlap
                continue
            self._account(spent)
            verdicts[place] = (key, outcome)
        return verdicts

    def receive(self, verdicts: Mapping[int, tuple[Hashable, JudgeOutcome]]) -> None:
        """Outcomes another process judged for this process's rollouts while they were generated, by index
        in the batch, each with its request's :func:`request_key` (thread-safe): :meth:`settle` then keeps
        each one whose request is the one decoded here, as it keeps a call started here."""
        if verdicts:
            self._on_loop(self._receive, dict(verdicts))

    def generation_done(self) -> None:
        """This process's generation has ended (thread-safe): the judge is told the rewards are wanted
        the last step's lead from now (:class:`~balcaprl.judge.protocol.SupportsDeadline`)."""
        self._on_loop(self._generation_done, time.perf_counter(), starts=False)

    def _generation_done(self, at: float) -> None:
        self._generated_at = at
        if self.lead_s is not None:
            self._tell_deadline(at + self.lead_s)

    def _tell_deadline(self, when: float | None) -> None:
        if isinstance(self.judge, SupportsDeadline):
            self.judge.rewards_wanted_at(when)

    def settle(self, requests: Sequence[JudgeRequest]) -> None:
        """The batch as TRL decoded it, in rollout order (thread-safe): the call started for rollout
        ``i`` answers ``requests[i]`` if it was started for exactly that request; every other request
        starts now. Either way each request then has one call, found by :meth:`judge_batch`."""
        self._on_loop(self._settle, list(requests))

    def _on_loop(self, callback: Callable[..., None], *args: Any, starts: bool = True) -> None:
        """``callback(*args)`` on the loop; ``starts``: it starts judge calls (the stage's wall time)."""
        if self.loop is None:
            raise RuntimeError("EarlyJudge.start needs the reward functions' event loop (loop=...)")
        if starts and self._first_start is None:
            self._first_start = time.perf_counter()
        try:
            on_loop = asyncio.get_running_loop() is self.loop
        except RuntimeError:  # another thread (the trainer's): no running loop there
            on_loop = False
        if on_loop:  # at once, so a judge_batch right after finds them
            callback(*args)
        else:  # in call order, before anything submitted to the loop later (TRL's reward functions)
            self.loop.call_soon_threadsafe(callback, *args)

    def _launch(self, requests: list[JudgeRequest]) -> list[asyncio.Future]:
        if not requests:
            return []
        futures = [self.loop.create_future() for _ in requests]  # type: ignore[union-attr]
        self.loop.create_task(self._judge_into(requests, futures))  # type: ignore[union-attr]
        return futures

    def _register(self, requests: list[JudgeRequest]) -> None:
        for request, future in zip(requests, self._launch(requests), strict=True):
            self._started[request_key(request)].append(future)

    def _launch_rollouts(self, by_index: dict[int, JudgeRequest]) -> None:
        futures = self._launch(list(by_index.values()))
        for (index, request), future in zip(by_index.items(), futures, strict=True):
            self._slots[index] = (request_key(request), future)

    def _launch_held(self, by_place: dict[Hashable, JudgeRequest]) -> None:
        futures = self._launch(list(by_place.values()))
        for (place, request), future in zip(by_place.items(), futures, strict=True):
            self._held[place] = (request_key(request), future)

    def _receive(self, verdicts: dict[int, tuple[Hashable, JudgeOutcome]]) -> None:
        for index, (key, outcome) in verdicts.items():
            future = self.loop.create_future()  # type: ignore[union-attr]
            future.set_result((outcome, None))  # paid for, and counted, where it was judged
            self._slots[index] = (key, future)

    def _settle(self, requests: list[JudgeRequest]) -> None:
        mismatched = self.mismatched
        slot_futures: list[asyncio.Future | None] = []
        for index, request in enumerate(requests):
            key, future = self._slots.pop(index, (None, None))
            if future is not None and key != request_key(request):  # by index, then checked by content
                future.cancel()
                self.mismatched += 1
                future = None
            slot_futures.append(future)
        for _, future in self._slots.values():  # indices beyond the batch
            future.cancel()
            self.mismatched += 1
        self._slots.clear()
        if self.mismatched > mismatched:
            logger.warning(
                "judge overlap: %d early calls did not match TRL's decoded rollouts; judged again",
                self.mismatched - mismatched,
            )
        kept = sum(future is not None for future in slot_futures)
        self._early_share = kept / len(requests) if requests else 0.0
        fresh = iter(self._launch([r for r, f in zip(requests, slot_futures, strict=True) if f is None]))
        for request, future in zip(requests, slot_futures, strict=True):  # in rollout order
            self._started[request_key(request)].append(future if future is not None else next(fresh))

    async def _judge_into(self, requests: list[JudgeRequest], futures: list[asyncio.Future]) -> None:
        try:
            outcomes, spent = await self._judge(requests)
        except Exception as error:  # the reward functions see the judge's exception, as without overlap
            for future in futures:
                if not future.done():
                    future.set_exception(error)
                    future.exception()  # retrieved: only a waiter re-raises it, none logs a traceback
            return
        for future, outcome in zip(futures, outcomes, strict=True):
            if not future.done():  # a future dropped by forget_started or settle is cancelled
                future.set_result((outcome, spent))
                spent = None  # a batch's cost, counted once
        self._account(spent)  # a batch nobody used was paid for all the same

    async def _judge(self, requests: list[JudgeRequest]) -> tuple[list[JudgeOutcome], dict[str, float]]:
        # A request that is no valid Unicode is never sent, early or not: judge_rollouts refuses its
        # rollout (naming its row) and never asks for it, so its bad_input here is never read.
        batch = sendable_requests(requests, ["this rollout"] * len(requests))
        if not batch.sent:
            return batch.outcomes([]), {}
        outcomes, usage = await counted_judge_batch(self.judge, batch.sent, self._meter)
        return batch.outcomes(outcomes), usage

    def _account(self, spent: Mapping[str, float] | None) -> None:
        if spent is not None:
            self._spent.update(spent)

    # -- the Judge protocol -----------------------------------------------------------------------

    async def judge_batch(self, requests: Sequence[JudgeRequest]) -> list[JudgeOutcome]:
        """One outcome per request, in order (the ``Judge`` protocol)."""
        outcomes, _ = await self.judge_batch_counted(requests)
        return outcomes

    async def judge_batch_counted(
        self, requests: Sequence[JudgeRequest]
    ) -> tuple[list[JudgeOutcome], dict[str, float]]:
        """One outcome per request, in order: from the call started for it, else a fresh call; and the
        usage of every call finished since the last batch answered."""
        asked = time.perf_counter()
        first = self._first_start if self._first_start is not None else asked
        if self._generated_at is not None:
            self.lead_s = asked - self._generated_at  # the next step's deadline, from its generation end
        waiting: list[asyncio.Future | None] = []
        fresh: list[JudgeRequest] = []
        for request in requests:
            queue = self._started.get(request_key(request))
            waiting.append(queue.popleft() if queue else None)
            if waiting[-1] is None:
                fresh.append(request)
        fresh_outcomes: list[JudgeOutcome] = []
        if fresh:
            fresh_outcomes, spent = await self._judge(fresh)
            self._account(spent)
        outcomes: list[JudgeOutcome] = []
        next_fresh = iter(fresh_outcomes)
        for future in waiting:
            if future is None:
                outcomes.append(next(next_fresh))
                continue
            outcome, spent = await future
            self._account(spent)
            outcomes.append(outcome)
        done = time.perf_counter()
        self._last_times = StepTimes(done - first, done - asked)
        self._first_start = None
        self._end_of_step()
        usage = dict(self._spent)
        self._spent.clear()
        return outcomes, usage

    def started_early_share(self) -> float:
        """Share of the last settled batch's rollouts whose call started while it was being generated."""
        return self._early_share

    def step_times(self) -> StepTimes:
        """``(wall_s, exposed_s)`` of the last batch the reward functions asked for."""
        return self._last_times

    def forget_started(self) -> int:
        """Drop the calls started but never asked for (a step that failed before its rewards, or
        requests the reward functions built differently); how many. Called before each batch."""
        dropped = 0
        for queue in self._started.values():
            for future in queue:
                dropped += 1
                future.cancel()
        self._started.clear()
        for _, future in [*self._slots.values(), *self._held.values()]:
            dropped += 1
            future.cancel()
        self._slots.clear()
        self._held.clear()
        self._first_start = None
        self._early_share = 0.0
        self._end_of_step()
        return dropped

    def _end_of_step(self) -> None:
        """No step waits for rewards now: the judge hedges by its own rule until the next deadline."""
        if self._generated_at is not None:
            self._generated_at = None
            self._tell_deadline(None)
