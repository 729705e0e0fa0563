"""Judging overlapped with TRL's generation: the TRL adapter of :class:`~balcaprl.train.early_judge.EarlyJudge`.

``train.judge_overlap`` picks the schedule: ``per_rollout`` (each rollout judged as vLLM finishes it,
where TRL lets that be seen: colocated vLLM without tensor parallelism, and a vLLM server's
per-prompt responses, every process's rollouts judged on the main process that posts them;
elsewhere as ``batch``), ``batch`` (the batch's calls start when ``_generate`` returns), ``off``
(TRL's own order). The TRL and vLLM names this leans on are listed in ``train/trl_seams.py``; the
real-engine slice (``tests/vllm_engine``) runs them.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, Literal

from balcaprl.judge.protocol import JudgeRequest
from balcaprl.train.early_judge import EarlyJudge, StepTimes
from balcaprl.train.judging import caption_text

OverlapMode = Literal["per_rollout", "batch", "off"]

logger = logging.getLogger(__name__)

# ------------------------------------------------------------------------------------------------
# The TRL trainer's side: a mixin for GRPOTrainer subclasses (BalancedGRPOTrainer).
# ------------------------------------------------------------------------------------------------


def requests_for(
    scorer: Any, inputs: Sequence[Mapping[str, Any]], completions: Sequence[Any]
) -> list[JudgeRequest]:
    """The requests the scorer's reward functions will send for these rows and completions (the
    columns TRL passes them, built by the scorer as its reward functions build them)."""
    columns = {key: [row.get(key) for row in inputs] for key in inputs[0]} if inputs else {}
    captions = [caption_text(completion) for completion in completions]
    return scorer.requests([str(i) for i in range(len(inputs))], captions, columns)


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


class TrlJudgeOverlap:
    """Judging overlapped with one TRL trainer's generation, and the judge's share of each step.

    The trainer (``trl_backend.BalancedGRPOTrainer``) calls it at five points of its step, in order, on
    every process: :meth:`begin_batch` (the batch's rows), :meth:`watching` around TRL's generation,
    :meth:`settle` with the completions TRL decoded, :meth:`share_verdicts` when TRL asks for the
    rewards, :meth:`stage_metrics` once the rewards are in.

    ``mode`` (:data:`OverlapMode`): with ``batch`` the scorer's judge is wrapped in an
    :class:`EarlyJudge` and the batch's judge calls start as soon as generation returns the
    completions: before the old-log-prob forward, the reference model and the padding that TRL does
    next. ``per_rollout`` also starts each rollout's call as colocated vLLM finishes it
    (:func:`watching_finishes`), or as a vLLM server answers its prompt (:func:`watching_prompt_responses`),
    with the caption decoded as TRL decodes it; :meth:`settle` keeps each early call whose request is
    the one TRL built for that rollout and starts the rest. Where no finish can be seen (no vLLM, tensor
    parallelism, a text-only server batch, tool calls, a response parser), ``per_rollout`` is ``batch``.
    ``off``: nothing changes but the metrics.

    Server mode with several processes: TRL gathers every process's prompts on the main process, which
    posts them all and sends each process its slice once the last response is in. So the main process
    judges every process's rollouts as their responses arrive (the rows gathered from every process
    when generation starts, in TRL's order), and when TRL asks for the rewards it sends each process
    the outcomes of its slice (:meth:`share_verdicts`); a process settles its batch with them, and
    judges itself only a rollout whose outcome did not come (a failed call, another decoding).
    """

    def __init__(self, trainer: Any, mode: OverlapMode):
        """Call after ``GRPOTrainer.__init__`` (it starts the reward event loop, ``async_loop``)."""
        if mode not in ("per_rollout", "batch", "off"):
            raise ValueError(f"judge_overlap: {mode!r} is not one of per_rollout, batch, off")
        self.trainer = trainer
        self.mode: OverlapMode = "off"
        self.early_judge: EarlyJudge | None = None
        loop = getattr(trainer, "async_loop", None)
        if mode != "off" and loop is not None:
            self.mode = mode
            self.early_judge = EarlyJudge(trainer.scorer.judge, loop)
            trainer.scorer.judge = self.early_judge
        self._inputs: Sequence[Mapping[str, Any]] | None = None
        self._decoding = threading.Lock()  # server mode: responses arrive on TRL's client threads
        self._watched = False  # whether this batch's rollouts could be seen finishing
        self._shared = False  # whether the main process judges every process's rollouts (server mode)
        self._decoded: list[JudgeRequest] | None = None  # settled when the main process's verdicts come
        self._shared_wait_s = 0.0  # this batch's wait for them
        self._warned_not_early = False

    def begin_batch(self, inputs: Sequence[Mapping[str, Any]] | None) -> None:
        """A new batch's rows (``None``: the batch is over); calls started for an earlier one are dropped."""
        if inputs is not None and self.early_judge is not None:
            dropped = self.early_judge.forget_started()
            if dropped:
                logger.warning(
                    "judge overlap: %d calls started for the previous batch were never used", dropped
                )
        self._inputs = inputs
        self._watched = self._shared = False
        self._decoded = None

    def watching(self, prompts: Sequence[Any]) -> AbstractContextManager:
        """While TRL generates this batch: each rollout judged as the vLLM engine finishes it (colocate:
        request ``i`` is rollout ``i``; server: prompt ``j``'s response holds rollouts ``j*n`` to
        ``j*n+n-1`` of every process's batches, in TRL's order), where that applies; else nothing. In
        server mode with several processes every process calls it (the rows are gathered)."""
        watcher, self._watched, self._shared = self._watcher(prompts, self._inputs)
        return watcher

    def _watcher(self, prompts, inputs) -> tuple[AbstractContextManager, bool, bool]:
        """(the context, whether rollouts are seen finishing, whether the main process judges every
        process's). Every condition before the gather is the same on every process."""
        trainer = self.trainer
        if (
            self.mode != "per_rollout"
            or self.early_judge is None
            or inputs is None
            or len(inputs) != len(prompts)
            or not getattr(trainer, "use_vllm", False)
            or getattr(trainer, "rollout_func", None) is not None
            or getattr(trainer, "tools", None)  # completions rewritten by the tool loop
            or _parses_responses(trainer)
        ):
            return nullcontext(), False, False
        generation = getattr(trainer, "vllm_generation", None)
        mode = getattr(trainer, "vllm_mode", None)
        if mode == "colocate" and getattr(generation, "tensor_parallel_size", 1) == 1:
            engine = getattr(getattr(generation, "llm", None), "llm_engine", None)
            if engine is not None:  # (with tensor parallelism the engine runs the group's prompts)
                judged = functools.partial(self.judge_finished, prompts, inputs)
                watcher = watching_finishes(
                    engine, lambda finished: judged([(i, out.outputs[0].token_ids) for i, out in finished])
                )
                return watcher, True, False
        if mode == "server":
            accelerator, n = trainer.accelerator, trainer.num_generations
            shared = accelerator.num_processes > 1
            rows = self._gathered_rows(inputs) if shared else inputs  # the batch the server is sent
            client = getattr(generation, "vllm_client", None) if accelerator.is_main_process else None
            if client is None:  # another process: its rollouts are judged on the main process
                return nullcontext(), shared, shared
            judged = functools.partial(self.judge_finished, prompts, rows)
            watcher = watching_prompt_responses(
                client,
                lambda j, response: judged(
                    [(j * n + k, choice["token_ids"]) for k, choice in enumerate(response["choices"])]
                ),
            )
            return watcher, True, shared
        return nullcontext(), False, False

    def _gathered_rows(self, inputs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Every process's rows, in process order as TRL gathers the prompts (``gather_object``; a
        collective), each with only the columns a judge request is built from."""
        from accelerate.utils import gather_object

        columns = self.trainer.scorer.request_columns
        return gather_object([{key: row[key] for key in columns if key in row} for row in inputs])

    def judge_finished(self, prompts, rows, finished: Sequence[tuple[int, Sequence[int]]]) -> None:
        """Start the calls of finished rollouts ``(index in rows, completion token ids)``, their captions
        decoded as TRL's ``_generate`` will decode them (``batch_decode(..., skip_special_tokens=True)``; one
        sequence decodes the same alone as in a batch). ``rows``: the batch the engine was given, this
        process's rows first (colocated: only those; served: the main process's, then every other
        process's, ``rows`` cut in batches of this one's size as TRL slices them), another process's held
        for it (:meth:`share_verdicts`)."""
        from trl.data_utils import is_conversational

        conversational = is_conversational({"prompt": prompts[0]})
        size = len(self._inputs or ())
        own, held = {}, {}
        with self._decoding:
            for index, token_ids in finished:
                if not 0 <= index < len(rows) or not size:
                    continue
                (text,) = self.trainer.processing_class.batch_decode(
                    [list(token_ids)], skip_special_tokens=True
                )
                completion = [{"role": "assistant", "content": text}] if conversational else text
                (request,) = requests_for(self.trainer.scorer, [rows[index]], [completion])
                if index < size:
                    own[index] = request
                else:
                    held[divmod(index, size)] = request  # (process, index in its batch)
        self.early_judge.start_rollouts(own)  # type: ignore[union-attr]
        if held:
            self.early_judge.start_held(held)  # type: ignore[union-attr]

    def settle(self, completions: Sequence[Any]) -> None:
        """The completions TRL decoded, in rollout order: every rollout's call is started now (the early
        ones kept where they were started for exactly that request). A process whose rollouts the main
        process judges settles when their outcomes come (:meth:`share_verdicts`)."""
        inputs = self._inputs
        if self.early_judge is None or inputs is None or len(inputs) != len(completions):
            return
        if getattr(getattr(self.trainer, "model", None), "training", True):  # an evaluation batch has no step
            self.early_judge.generation_done()  # every process: its rewards are wanted after the log-probs
        requests = requests_for(self.trainer.scorer, inputs, completions)
        if self._shared and not self.trainer.accelerator.is_main_process:
            self._decoded = requests
        else:
            self.early_judge.settle(requests)

    def share_verdicts(self) -> None:
        """When TRL asks for the rewards, on every process (a collective), in server mode with several
        processes: the main process waits for the calls it started for the other processes' rollouts and
        sends them out (``broadcast_object_list``, as TRL sends the completions); each process takes the
        outcomes of its slice and settles its batch with them. Elsewhere nothing."""
        if not self._shared:
            return
        from accelerate.utils import broadcast_object_list

        self._shared = False
        accelerator, early_judge = self.trainer.accelerator, self.early_judge
        assert early_judge is not None  # shared only with an early judge
        began = time.perf_counter()
        by_process: list[dict] | None = None
        if accelerator.is_main_process:
            held = asyncio.run_coroutine_threadsafe(early_judge.held_verdicts(), early_judge.loop).result()
            by_process = [{} for _ in range(accelerator.num_processes)]
            for (process, index), verdict in held.items():
                by_process[process][index] = verdict
        box = [by_process]
        broadcast_object_list(box, from_process=0)
        if not accelerator.is_main_process and self._decoded is not None:
            early_judge.receive(box[0][accelerator.process_index])
            early_judge.settle(self._decoded)
        self._decoded = None
        self._shared_wait_s = time.perf_counter() - began

    def stage_metrics(self, asked: float) -> dict[str, float]:
        """The judge's share of the step once the rewards are in (``asked``: when TRL asked for them,
        ``time.perf_counter``): ``judge/wall_s``, ``judge/exposed_s``, ``judge/started_early_share``.
        The wait for the main process's verdicts (:meth:`share_verdicts`) is exposed; a process that
        received its verdicts cannot see when their calls started, so its ``wall_s`` is at least that wait.
        Warns once per run when ``per_rollout`` applied and no rollout was judged while generated."""
        if self.early_judge is not None:
            times, share = self.early_judge.step_times(), self.early_judge.started_early_share()
            exposed = times.exposed_s + self._shared_wait_s
            times = StepTimes(max(times.wall_s, exposed), exposed)
        else:
            elapsed = time.perf_counter() - asked
            times, share = StepTimes(elapsed, elapsed), 0.0
        self._shared_wait_s = 0.0
        if self._watched and share == 0.0 and not self._warned_not_early:
            self._warned_not_early = True  # once per run
            logger.warning(
                "judge overlap: train.judge_overlap=per_rollout, but no rollout of this batch was judged while "
                "it was generated (judge/started_early_share = 0): the rollout engine's finishes were not seen, "
                "so the judge waits for the whole batch. Rewards are unchanged; the step is slower. The TRL and "
                "vLLM names this relies on are in balcaprl/train/trl_seams.py"
            )
        return {
            "judge/wall_s": times.wall_s,
            "judge/exposed_s": times.exposed_s,
            "judge/started_early_share": share,
        }


def _parses_responses(trainer: Any) -> bool:
    """Whether TRL 1.16's ``_generate`` decodes with ``parse_response`` (a tokenizer with a response
    template or schema) rather than ``batch_decode``: per-rollout judging then waits for TRL's text."""
    tokenizer = getattr(trainer, "_tokenizer", None)
    return (
        getattr(tokenizer, "response_template", None) is not None
        or getattr(tokenizer, "response_schema", None) is not None
    )
