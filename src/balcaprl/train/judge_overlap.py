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
import logging
import os
import time
from collections import Counter, defaultdict, deque
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

from balcaprl.judge.accounting import JudgeStats
from balcaprl.judge.protocol import Judge, JudgeOutcome, JudgeRequest
from balcaprl.train.rewards import caption_text, judge_usage

__all__ = [
    "EarlyJudge",
    "JudgeOverlapMixin",
    "StepTimes",
    "judge_stage_metrics",
    "request_key",
    "requests_for",
    "stamped",
]

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
    :meth:`usage`: the accounting of the answers handed out, so a step's usage deltas count the
    calls it used, whenever they ran (exact for a judge with ``judge_batch_with_stats``; for another
    judge, each batch's difference of its cumulative ``usage``).
    """

    def __init__(self, judge: Judge, loop: asyncio.AbstractEventLoop | None = None):
        self.judge = judge
        self.loop = loop
        self.stats = JudgeStats()
        self._usage: Counter[str] = Counter()  # judges without judge_batch_with_stats
        self.config = getattr(judge, "config", None)  # its prices, for judge_usage
        self._started: dict[Hashable, deque[asyncio.Future]] = defaultdict(deque)
        self._first_start: float | None = None
        self._last_times = StepTimes(0.0, 0.0)

    def __repr__(self) -> str:
        return f"EarlyJudge({self.judge!r})"

    def usage(self) -> dict[str, float]:
        if self._usage:
            return dict(self._usage)
        prices = getattr(self.config, "price_per_million_tokens", None)
        return {k: float(v) for k, v in self.stats.as_dict(prices).items() if isinstance(v, int | float)}

    # -- starting calls early ---------------------------------------------------------------------

    def start(self, requests: Sequence[JudgeRequest]) -> None:
        """Start judging ``requests`` now (thread-safe; returns at once)."""
        if not requests:
            return
        if self.loop is None:
            raise RuntimeError("EarlyJudge.start needs the reward functions' event loop (loop=...)")
        if self._first_start is None:
            self._first_start = time.perf_counter()
        try:
            on_loop = asyncio.get_running_loop() is self.loop
        except RuntimeError:  # another thread (the trainer's): no running loop there
            on_loop = False
        if on_loop:  # at once, so a judge_batch right after finds them
            self._launch(list(requests))
        else:  # before anything submitted to the loop after this call (TRL's reward functions)
            self.loop.call_soon_threadsafe(self._launch, list(requests))

    def _launch(self, requests: list[JudgeRequest]) -> None:
        futures = [self.loop.create_future() for _ in requests]  # type: ignore[union-attr]
        for request, future in zip(requests, futures, strict=True):
            self._started[request_key(request)].append(future)
        self.loop.create_task(self._judge_into(requests, futures))  # type: ignore[union-attr]

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
            if not future.done():  # a future dropped by forget_started is cancelled
                future.set_result((outcome, spent))
                spent = None  # a batch's cost, counted once

    async def _judge(self, requests: list[JudgeRequest]) -> tuple[list[JudgeOutcome], JudgeStats | Counter]:
        with_stats = getattr(self.judge, "judge_batch_with_stats", None)
        if with_stats is not None:
            result = await with_stats(requests)
            return list(result.outcomes), result.stats
        before = judge_usage(self.judge)
        outcomes = list(await self.judge.judge_batch(requests))
        after = judge_usage(self.judge)
        return outcomes, Counter({k: v - before.get(k, 0.0) for k, v in after.items()})

    def _account(self, spent: JudgeStats | Counter | None) -> None:
        if isinstance(spent, JudgeStats):
            self.stats.merge(spent)
        elif spent is not None:
            self._usage.update(spent)

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
        return outcomes

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
        self._first_start = None
        return dropped


# ------------------------------------------------------------------------------------------------
# The TRL trainer's side: a mixin for GRPOTrainer subclasses (BalancedGRPOTrainer).
# ------------------------------------------------------------------------------------------------


def requests_for(
    scorer: Any, inputs: Sequence[Mapping[str, Any]], completions: Sequence[Any]
) -> list[JudgeRequest]:
    """The requests the scorer's reward functions will send for these rows and completions (the same
    columns TRL passes them, the same caption text and rubric)."""
    return [
        JudgeRequest(
            image=row[scorer.image_column],
            caption=caption_text(completion),
            reference=row[scorer.reference_column],
            rubric=scorer.rubric,
        )  # fmt: skip
        for row, completion in zip(inputs, completions, strict=True)
    ]


class JudgeOverlapMixin:
    """Judging overlapped with TRL's generation, and the judge's share of each step in the metrics.

    With ``judge_overlap`` on, the scorer's judge is wrapped in an :class:`EarlyJudge` and the batch's
    judge calls start as soon as ``_generate`` returns the completions: before the old-log-prob
    forward, the reference model and the padding that ``_generate_and_score_completions`` does next.
    Off, nothing changes but the metrics. Either way each step logs ``judge/wall_s`` (first call
    started to rewards ready) and ``judge/exposed_s`` (reward functions called to rewards ready).
    """

    scorer: Any
    _judge_inputs: Sequence[Mapping[str, Any]] | None = None
    early_judge: EarlyJudge | None = None

    def _install_judge_overlap(self, enabled: bool) -> None:
        """Call after ``GRPOTrainer.__init__`` (it starts the reward event loop)."""
        loop = getattr(self, "async_loop", None)
        if enabled and loop is not None:
            self.early_judge = EarlyJudge(self.scorer.judge, loop)
            self.scorer.judge = self.early_judge

    def _generate_and_score_completions(self, inputs):
        if self.early_judge is not None:
            dropped = self.early_judge.forget_started()
            if dropped:
                logger.warning(
                    "judge overlap: %d calls started for the previous batch were never used", dropped
                )
        self._judge_inputs = inputs
        try:
            return super()._generate_and_score_completions(inputs)  # type: ignore[misc]
        finally:
            self._judge_inputs = None

    def _generate(self, prompts):
        output = super()._generate(prompts)  # type: ignore[misc]
        inputs, completions = self._judge_inputs, output[3]
        if self.early_judge is not None and inputs is not None and len(inputs) == len(completions):
            self.early_judge.start(requests_for(self.scorer, inputs, completions))
        return output

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        asked = time.perf_counter()
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)  # type: ignore[misc]
        if self.early_judge is not None:
            times = self.early_judge.step_times()
        else:
            elapsed = time.perf_counter() - asked
            times = StepTimes(elapsed, elapsed)
        metrics = self._metrics["train" if self.model.training else "eval"]  # type: ignore[attr-defined]
        metrics["judge/wall_s"].append(times.wall_s)
        metrics["judge/exposed_s"].append(times.exposed_s)
        return rewards
