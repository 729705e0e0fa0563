"""Judging overlapped with generation: a rollout's judge call starts as soon as its caption exists.

TRL 1.16 calls the reward functions after generation *and* the old-log-prob forward, so the judge's
whole stage sits on the step's critical path. :class:`EarlyJudge` wraps the judge the reward
functions use: the trainer hands it the batch's requests as soon as the completions exist
(:meth:`EarlyJudge.start`, from any thread), or one rollout at a time as the rollout engine finishes
it (:meth:`EarlyJudge.start_rollouts`, then :meth:`EarlyJudge.settle` with the batch TRL decoded),
and when the reward functions later ask (:meth:`EarlyJudge.judge_batch`, the ``Judge`` protocol)
each request is answered by the call already in flight for it. Requests nobody started are judged
then, as without overlap. The calls are the judge's own, for the same requests: the rewards and
advantages are those of the path without overlap (tests check both on the tiny model).

``train.judge_overlap`` picks the schedule: ``per_rollout`` (each rollout judged as vLLM finishes it,
where TRL lets that be seen: colocated vLLM without tensor parallelism, and a vLLM server's
per-prompt responses for the main process's share; elsewhere as ``batch``), ``batch`` (the batch's
calls start when ``_generate`` returns), ``off`` (TRL's own order).

It also times the stage for the step's metrics (:meth:`EarlyJudge.step_times`): ``judge/wall_s``
from the first call started to the rewards ready, ``judge/exposed_s`` from when the reward functions
asked to the rewards ready (the part of the judge the step waits for).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import threading
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, Literal

from balcaprl.judge.accounting import JudgeStats
from balcaprl.judge.protocol import Judge, JudgeOutcome, JudgeRequest, sendable_requests
from balcaprl.train.judging import caption_text, judge_usage

OverlapMode = Literal["per_rollout", "batch", "off"]

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
    judge, its cumulative ``usage`` as each batch is answered, less what earlier batches took).
    """

    def __init__(self, judge: Judge, loop: asyncio.AbstractEventLoop | None = None):
        self.judge = judge
        self.loop = loop
        self.stats = JudgeStats()
        self._usage: Counter[str] = Counter()  # judges without judge_batch_with_stats
        self._usage_seen = judge_usage(judge)  # their cumulative usage, as of the last batch answered
        self.config = getattr(judge, "config", None)  # its prices, for judge_usage
        self._started: dict[Hashable, deque[asyncio.Future]] = defaultdict(deque)
        self._slots: dict[int, tuple[Hashable, asyncio.Future]] = {}  # rollout index -> its early call
        self.mismatched = 0  # early calls whose rollout TRL decoded to another request (none expected)
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
        if requests:
            self._on_loop(self._register, list(requests))

    def start_rollouts(self, by_index: Mapping[int, JudgeRequest]) -> None:
        """Start judging rollouts the engine just finished, by their index in the batch (thread-safe).
        Held by index until :meth:`settle` compares them with the batch TRL decoded."""
        if by_index:
            self._on_loop(self._launch_rollouts, dict(by_index))

    def settle(self, requests: Sequence[JudgeRequest]) -> None:
        """The batch as TRL decoded it, in rollout order (thread-safe): the call started for rollout
        ``i`` answers ``requests[i]`` if it was started for exactly that request; every other request
        starts now. Either way each request then has one call, found by :meth:`judge_batch`."""
        self._on_loop(self._settle, list(requests))

    def _on_loop(self, callback: Callable[..., None], *args: Any) -> None:
        if self.loop is None:
            raise RuntimeError("EarlyJudge.start needs the reward functions' event loop (loop=...)")
        if self._first_start is None:
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

    async def _judge(self, requests: list[JudgeRequest]) -> tuple[list[JudgeOutcome], JudgeStats | Counter]:
        # A request that is no valid Unicode is never sent, early or not: judge_rollouts refuses its
        # rollout (naming its row) and never asks for it, so its bad_input here is never read.
        batch = sendable_requests(requests, ["this rollout"] * len(requests))
        if not batch.sent:
            return batch.outcomes([]), Counter()
        with_stats = getattr(self.judge, "judge_batch_with_stats", None)
        if with_stats is not None:
            result = await with_stats(batch.sent)
            return batch.outcomes(list(result.outcomes)), result.stats
        outcomes = list(await self.judge.judge_batch(batch.sent))
        # Usage since the last batch that finished, not since this one began: batches overlap (one
        # per finished rollout), and differences across each batch's own await would count twice.
        after, seen = judge_usage(self.judge), self._usage_seen
        self._usage_seen = after
        return batch.outcomes(outcomes), Counter({k: v - seen.get(k, 0.0) for k, v in after.items()})

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
        for _, future in self._slots.values():
            dropped += 1
            future.cancel()
        self._slots.clear()
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


@contextmanager
def watching_finishes(engine: Any, on_finished: Callable[[list[tuple[int, Any]]], None]) -> Iterator[None]:
    """While one vLLM ``LLM.generate`` runs on ``engine`` (its ``LLMEngine``), report each request as
    it finishes: ``on_finished([(index, output), ...])`` once per engine step, ``index`` the request's
    place in the prompts (the order ``LLM.generate`` adds them: ``add_request``'s request id first),
    ``output`` the finished ``RequestOutput``. Only the two engine methods ``LLM.generate`` drives are
    wrapped (``vllm/entrypoints/llm.py``: ``_validate_and_add_requests`` then ``_run_engine``, which
    loops ``step()`` and keeps the outputs with ``finished``), on this engine, for this call. A failing
    ``on_finished`` is logged and ignored: generation never depends on the judge."""
    add_request, step = engine.add_request, engine.step
    index_of: dict[str, int] = {}

    def adding(request_id, *args, **kwargs):
        index_of[str(request_id)] = len(index_of)
        return add_request(request_id, *args, **kwargs)

    def stepping(*args, **kwargs):
        outputs = step(*args, **kwargs)
        finished = [
            (index_of[str(output.request_id)], output)
            for output in outputs
            if getattr(output, "finished", False) and str(getattr(output, "request_id", "")) in index_of
        ]
        if finished:
            try:
                on_finished(finished)
            except Exception:  # the rollouts concerned are judged with the batch instead
                logger.exception("judge overlap: judging finished rollouts early failed")
        return outputs

    with _wrapped(engine, add_request=adding, step=stepping):
        yield


@contextmanager
def watching_prompt_responses(
    client: Any, on_response: Callable[[int, Mapping[str, Any]], None]
) -> Iterator[None]:
    """While TRL's vLLM client (server mode) generates for prompts with images, report each prompt's
    response as it arrives: ``on_response(j, response)``, ``j`` the prompt's place in the call.
    TRL 1.16's ``VLLMClient._generate_from_features`` sends one request per prompt from a thread pool
    through ``_post`` (``trl/generation/vllm_client.py``); the prompt is found by the identity of the
    token-id list its request carries (``prompts[j]``), never by its content. Called on the client's
    threads; a failing ``on_response`` is logged and ignored."""
    generate, post = client._generate_from_features, client._post
    index_of: dict[int, int] = {}  # id(prompts[j]) -> j, for the call in progress

    def generating(prompts, *args, **kwargs):
        index_of.clear()
        index_of.update({id(ids): j for j, ids in enumerate(prompts)})
        try:
            return generate(prompts, *args, **kwargs)
        finally:
            index_of.clear()

    def posting(url, *args, **kwargs):
        response = post(url, *args, **kwargs)
        body = kwargs.get("json")
        index = index_of.get(id(body.get("token_ids"))) if isinstance(body, dict) else None
        if index is not None and isinstance(response, Mapping) and "choices" in response:
            try:
                on_response(index, response)
            except Exception:  # the rollouts concerned are judged with the batch instead
                logger.exception("judge overlap: judging a prompt's rollouts early failed")
        return response

    with _wrapped(client, _generate_from_features=generating, _post=posting):
        yield


@contextmanager
def _wrapped(target: Any, **methods: Callable[..., Any]) -> Iterator[None]:
    """``target``'s methods replaced on the instance for a while, then as they were (its class's, or
    its own attributes)."""
    own = {name: vars(target)[name] for name in methods if name in vars(target)}
    for name, method in methods.items():
        setattr(target, name, method)
    try:
        yield
    finally:
        for name in methods:
            if name in own:
                setattr(target, name, own[name])
            else:
                delattr(target, name)


class JudgeOverlapMixin:
    """Judging overlapped with TRL's generation, and the judge's share of each step in the metrics.

    ``judge_overlap`` (:data:`OverlapMode`): with ``batch`` the scorer's judge is wrapped in an
    :class:`EarlyJudge` and the batch's judge calls start as soon as ``_generate`` returns the
    completions: before the old-log-prob forward, the reference model and the padding that
    ``_generate_and_score_completions`` does next. ``per_rollout`` also starts each rollout's call as
    colocated vLLM finishes it (:func:`watching_finishes`), or as a vLLM server answers its prompt
    (:func:`watching_prompt_responses`; the main process's rollouts), with the caption decoded as
    TRL's ``_generate`` decodes it; when ``_generate`` returns, :meth:`EarlyJudge.settle` keeps each
    early call whose request is the one TRL built for that rollout and starts the rest. Where no
    finish can be seen (no vLLM, tensor parallelism, a text-only server batch, tool calls, a
    response parser), ``per_rollout`` is ``batch``. ``off``: nothing changes but the metrics. Each step logs
    ``judge/wall_s`` (first call started to rewards ready) and ``judge/exposed_s`` (reward functions
    called to rewards ready).
    """

    scorer: Any
    _judge_inputs: Sequence[Mapping[str, Any]] | None = None
    early_judge: EarlyJudge | None = None
    judge_overlap: OverlapMode = "off"
    _decoding = threading.Lock()

    def _install_judge_overlap(self, mode: OverlapMode) -> None:
        """Call after ``GRPOTrainer.__init__`` (it starts the reward event loop)."""
        if mode not in ("per_rollout", "batch", "off"):
            raise ValueError(f"judge_overlap: {mode!r} is not one of per_rollout, batch, off")
        loop = getattr(self, "async_loop", None)
        if mode != "off" and loop is not None:
            self.judge_overlap = mode
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
        inputs = self._judge_inputs
        with self._watching_rollouts(prompts, inputs):
            output = super()._generate(prompts)  # type: ignore[misc]
        completions = output[3]
        if self.early_judge is not None and inputs is not None and len(inputs) == len(completions):
            self.early_judge.settle(requests_for(self.scorer, inputs, completions))
        return output

    def _watching_rollouts(self, prompts, inputs) -> AbstractContextManager:
        """While TRL generates this batch: each rollout judged as the vLLM engine finishes it (colocate:
        request ``i`` is rollout ``i``; server: prompt ``j``'s response holds rollouts ``j*n`` to
        ``j*n+n-1``, of which the main process's share is its own), where that applies; else nothing."""
        if (
            self.judge_overlap != "per_rollout"
            or self.early_judge is None
            or inputs is None
            or len(inputs) != len(prompts)
            or not getattr(self, "use_vllm", False)
            or getattr(self, "rollout_func", None) is not None
            or getattr(self, "tools", None)  # completions rewritten by the tool loop
            or _parses_responses(self)
        ):
            return nullcontext()
        generation = getattr(self, "vllm_generation", None)
        mode = getattr(self, "vllm_mode", None)
        judged = functools.partial(self._judge_finished, prompts, inputs)
        if mode == "colocate" and getattr(generation, "tensor_parallel_size", 1) == 1:
            engine = getattr(getattr(generation, "llm", None), "llm_engine", None)
            if engine is not None:  # (with tensor parallelism the engine runs the group's prompts)
                return watching_finishes(
                    engine, lambda finished: judged([(i, out.outputs[0].token_ids) for i, out in finished])
                )
        if mode == "server" and self.accelerator.is_main_process:  # type: ignore[attr-defined]
            client, n = getattr(generation, "vllm_client", None), self.num_generations  # type: ignore[attr-defined]
            if client is not None:
                return watching_prompt_responses(
                    client,
                    lambda j, response: judged(
                        [(j * n + k, choice["token_ids"]) for k, choice in enumerate(response["choices"])]
                    ),
                )
        return nullcontext()

    def _judge_finished(self, prompts, inputs, finished: Sequence[tuple[int, Sequence[int]]]) -> None:
        """Start the calls of finished rollouts ``(index in this process's batch, completion token
        ids)``, their captions decoded as TRL's ``_generate`` will decode them (``batch_decode(...,
        skip_special_tokens=True)``; one sequence decodes the same alone as in a batch). Rollouts
        beyond this process's batch are another process's."""
        from trl.data_utils import is_conversational  # TRL only here: verl's reward imports this module

        conversational = is_conversational({"prompt": prompts[0]})
        by_index = {}
        with self._decoding:  # server mode: responses arrive on TRL's client threads
            for index, token_ids in finished:
                if not 0 <= index < len(inputs):
                    continue
                (text,) = self.processing_class.batch_decode(  # type: ignore[attr-defined]
                    [list(token_ids)], skip_special_tokens=True
                )
                completion = [{"role": "assistant", "content": text}] if conversational else text
                (by_index[index],) = requests_for(self.scorer, [inputs[index]], [completion])
        self.early_judge.start_rollouts(by_index)  # type: ignore[union-attr]

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


def _parses_responses(trainer: Any) -> bool:
    """Whether TRL 1.16's ``_generate`` decodes with ``parse_response`` (a tokenizer with a response
    template or schema) rather than ``batch_decode``: per-rollout judging then waits for TRL's text."""
    tokenizer = getattr(trainer, "_tokenizer", None)
    return (
        getattr(tokenizer, "response_template", None) is not None
        or getattr(tokenizer, "response_schema", None) is not None
    )
