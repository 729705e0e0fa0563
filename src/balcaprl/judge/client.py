"""The OpenAI-compatible judge: (image, caption, reference) -> validated verdict, for whole batches.

Per request, in order: clean the texts (empty caption -> scored 0 without a call; empty reference or
unreadable image -> ``bad_input``), load the image once per batch, look the request up among the
calls in flight (identical requests share one call) and in the sqlite cache, and only then call the
endpoint, under a concurrency semaphore and optional request/token rate limits. An invalid answer is
re-asked once. Every request ends as a ``Judgement`` or a ``JudgeFailure``; no single failure fails
the batch (only a configuration the endpoint rejects outright, 401/403/404, raises).

Reference modes (``config.reference_mode``):
- ``joint``: one call per rollout decomposes both caption and reference (the paper).
- ``cached-reference``: the reference is decomposed once per (image, reference) — coalesced, cached
  in memory and in sqlite — and each rollout's call only marks coverage of that fixed, numbered list.
  Fewer output tokens, and all rollouts of a prompt share one recall denominator.
"""

from __future__ import annotations

import asyncio
import logging
import os
import traceback
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError

from balcaprl.judge.accounting import JudgeStats
from balcaprl.judge.cache import JudgeCache, cache_key
from balcaprl.judge.calls import Endpoint, JudgeCaller, _Runtime
from balcaprl.judge.config import JudgeConfig, JudgeConfigError
from balcaprl.judge.images import ImageError, ImageLoader, PreparedImage
from balcaprl.judge.outcomes import empty_caption_judgement, judgement_from_verdict, rewards_tensor
from balcaprl.judge.prompt import build_judge_messages, clean_caption, clean_text
from balcaprl.judge.protocol import JudgeFailure, Judgement, JudgeOutcome, JudgeRequest
from balcaprl.judge.schemas import (
    CallKind,
    CoverageVerdict,
    ReferenceAssertions,
    assemble_verdict,
    response_format,
    schema_for,
)
from balcaprl.judge.transport import CallAnswer, reask_messages, redact
from balcaprl.rewards import Verdict
from balcaprl.rewards.rubrics import Rubric, load_rubric

__all__ = ["BatchResult", "OpenAICompatibleJudge", "build_judge"]

log = logging.getLogger("balcaprl.judge")

_USE_CONFIG = object()
_JUDGE_RUBRICS = ("training", "evaluation")
_REFERENCE_MEMO_SIZE = 65536  # reference decompositions kept in memory (cached-reference mode)


@dataclass(frozen=True)
class BatchResult:
    """A batch's outcomes (one per request, in order) and its accounting."""

    outcomes: list[JudgeOutcome]
    stats: JudgeStats

    def rewards(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """``(N, 3)`` precision/recall/linguistic, NaN rows for failures (see :func:`rewards_tensor`)."""
        return rewards_tensor(self.outcomes, dtype=dtype)


class OpenAICompatibleJudge:
    """A :class:`~balcaprl.judge.protocol.Judge` backed by any OpenAI-compatible chat endpoint.

    ``image_root``: resolve relative image paths against it and refuse paths that leave it.
    ``cache``: a :class:`JudgeCache`, ``None`` for no cache, or (default) the one ``config.cache_path``
    names. ``http_client``: an ``httpx2.AsyncClient`` for the SDK (tests use a mock transport).
    """

    def __init__(
        self,
        config: JudgeConfig,
        *,
        image_root: Path | str | None = None,
        cache: JudgeCache | None | Any = _USE_CONFIG,
        http_client: Any = None,
    ):
        self.config = config
        self._endpoint = Endpoint(config, http_client=http_client)
        self._api_key = self._endpoint.api_key
        self.images = ImageLoader(config.max_image_side, root=image_root)
        if cache is _USE_CONFIG:
            cache = JudgeCache(config.cache_path) if config.cache_path is not None else None
        self.cache: JudgeCache | None = cache
        self.stats = JudgeStats()  # lifetime total; each batch also returns its own
        self._reference_memo: OrderedDict[str, list[str]] = OrderedDict()
        mode = config.reference_mode
        self._rubrics: dict[str, Rubric] = {name: load_rubric(name, mode) for name in _JUDGE_RUBRICS}
        self._reference_rubric = load_rubric("reference_decomposition")

    def __repr__(self) -> str:  # never the key
        return f"OpenAICompatibleJudge(base_url={self.config.base_url!r}, model={self.config.model!r})"

    def rubric_version(self, rubric: str = "training") -> str:
        return self._rubrics[rubric].version

    @property
    def _runtime_state(self) -> _Runtime | None:
        return self._endpoint.state

    def caller(self) -> JudgeCaller:
        """A :class:`~balcaprl.judge.calls.JudgeCaller` for generic calls on this judge's endpoint:
        same connections, concurrency bound, rate limits, coalescing and cache. It has its own
        ``stats``; closing the judge closes both (closing the caller closes nothing)."""
        return JudgeCaller(self.config, cache=self.cache, endpoint=self._endpoint)

    # ----------------------------------------------------------------------------- public API

    async def judge_batch(self, requests: Sequence[JudgeRequest]) -> list[JudgeOutcome]:
        """One outcome per request, in order (the :class:`Judge` protocol)."""
        return (await self.judge_batch_with_stats(requests)).outcomes

    async def judge_batch_with_stats(
        self,
        requests: Sequence[JudgeRequest],
        on_outcome: Callable[[int, JudgeOutcome], None] | None = None,
    ) -> BatchResult:
        """Outcomes plus this batch's :class:`JudgeStats`; ``on_outcome(i, outcome)`` as each finishes
        (for progress bars). Raises only :class:`JudgeConfigError` (the endpoint rejects the config)."""
        runtime = self._runtime()
        stats = JudgeStats()
        images: dict[tuple, asyncio.Task] = {}
        outcomes: list[JudgeOutcome | None] = [None] * len(requests)

        async def run(i: int, request: JudgeRequest) -> None:
            outcome = await self._judge_one(request, stats, images, runtime)
            outcomes[i] = outcome
            if isinstance(outcome, JudgeFailure):
                stats.failures[outcome.reason] += 1
            if on_outcome is not None:
                on_outcome(i, outcome)

        try:
            async with asyncio.TaskGroup() as group:
                for i, request in enumerate(requests):
                    group.create_task(run(i, request))
        except* JudgeConfigError as errors:
            raise errors.exceptions[0] from None
        self.stats.merge(stats)
        log.info(stats.one_line(self.config.price_per_million_tokens))
        return BatchResult([o for o in outcomes if o is not None], stats)

    async def aclose(self) -> None:
        """Close the HTTP connections and the cache."""
        await self._endpoint.aclose()
        if self.cache is not None:
            self.cache.close()

    async def __aenter__(self) -> OpenAICompatibleJudge:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ----------------------------------------------------------------------------- internals

    def _runtime(self) -> _Runtime:
        return self._endpoint.runtime()

    async def _judge_one(
        self, request: JudgeRequest, stats: JudgeStats, images: dict[tuple, asyncio.Task], runtime: _Runtime
    ) -> JudgeOutcome:
        stats.requests += 1
        try:
            if request.rubric not in self._rubrics:
                stats.rejected += 1
                return JudgeFailure(
                    "bad_input", f"unknown rubric {request.rubric!r}; use one of {_JUDGE_RUBRICS}"
                )
            caption = clean_caption(request.caption, self.config.caption_char_cap)
            reference = clean_text(request.reference).strip()
            if not reference:
                stats.rejected += 1
                return JudgeFailure("bad_input", "the reference caption is empty; recall needs a reference")
            if not caption.text:
                stats.skipped_empty += 1
                return empty_caption_judgement(reference)
            try:
                image = await self._image(request.image, images)
            except ImageError as error:
                stats.rejected += 1
                return JudgeFailure("bad_input", redact(str(error), self._api_key)[:300])
            rubric = self._rubrics[request.rubric]
            if self.config.reference_mode == "joint":
                return await self._judge_joint(
                    rubric, image, reference, caption.text, caption.truncated, stats, runtime
                )
            return await self._judge_cached_reference(
                rubric, image, reference, caption.text, caption.truncated, stats, runtime
            )
        except JudgeConfigError:
            raise
        except Exception as error:  # a bug must not fail the other 2047 rollouts; it is logged loudly
            detail = redact(f"internal error: {type(error).__name__}: {error}", self._api_key)[:300]
            # the traceback's frames, not its message: a message could carry anything, the key included
            frames = "".join(traceback.format_tb(error.__traceback__))
            log.error("judge: %s (one request failed; the batch goes on)\n%s", detail, frames)
            return JudgeFailure("server_error", detail)

    async def _image(self, image: Path | str | bytes, images: dict[tuple, asyncio.Task]) -> PreparedImage:
        # The rollouts of one prompt share their image object: load (decode, hash) it once per batch.
        identity = (
            ("path", os.fspath(image)) if isinstance(image, str | os.PathLike) else ("object", id(image))
        )
        task = images.get(identity)
        if task is None:
            task = asyncio.ensure_future(asyncio.to_thread(self.images.load, image))
            images[identity] = task
        return await task

    def _key(self, kind: CallKind, rubric: Rubric, image: PreparedImage, **texts: Any) -> str:
        cfg = self.config
        return cache_key(
            kind=kind,
            model=cfg.model,
            rubric_version=rubric.version,
            reference_mode=cfg.reference_mode,
            image_sha256=image.sha256,
            max_image_side=cfg.max_image_side,
            temperature=cfg.temperature,
            max_tokens=cfg.max_tokens,
            **texts,
        )

    async def _judge_joint(
        self, rubric: Rubric, image: PreparedImage, reference: str, caption: str, truncated: bool,
        stats: JudgeStats, runtime: _Runtime,
    ) -> JudgeOutcome:  # fmt: skip
        key = self._key("verdict", rubric, image, reference=reference, caption=caption)

        async def produce() -> JudgeOutcome:
            messages = build_judge_messages(rubric, image, reference=reference, caption=caption)
            answer = await self._ask(messages, "verdict", stats, runtime)
            if isinstance(answer, JudgeFailure):
                return answer
            assert isinstance(answer, Verdict)
            return judgement_from_verdict(answer, truncated_input=truncated)

        return await self._once(key, produce, stats, runtime, truncated)

    async def _judge_cached_reference(
        self, rubric: Rubric, image: PreparedImage, reference: str, caption: str, truncated: bool,
        stats: JudgeStats, runtime: _Runtime,
    ) -> JudgeOutcome:  # fmt: skip
        assertions = await self._reference_assertions(image, reference, stats, runtime)
        if isinstance(assertions, JudgeFailure):
            return assertions
        key = self._key("coverage", rubric, image, reference_assertions=assertions, caption=caption)

        def check(answer: Any) -> None:
            assemble_verdict(answer, assertions)  # raises ValueError on a bad id list

        async def produce() -> JudgeOutcome:
            messages = build_judge_messages(rubric, image, reference_assertions=assertions, caption=caption)
            answer = await self._ask(messages, "coverage", stats, runtime, check=check)
            if isinstance(answer, JudgeFailure):
                return answer
            assert isinstance(answer, CoverageVerdict)
            return judgement_from_verdict(assemble_verdict(answer, assertions), truncated_input=truncated)

        return await self._once(key, produce, stats, runtime, truncated)

    async def _reference_assertions(
        self, image: PreparedImage, reference: str, stats: JudgeStats, runtime: _Runtime
    ) -> list[str] | JudgeFailure:
        """The reference's assertions: from memory, the cache, or one (coalesced) call."""
        rubric = self._reference_rubric
        key = self._key("reference_assertions", rubric, image, reference=reference)
        known = self._reference_memo.get(key)
        if known is not None:
            return known

        async def compute() -> list[str] | JudgeFailure:
            cached = self._cache_get(key)
            if cached is not None and isinstance(cached.get("reference_assertions"), list):
                return [str(t) for t in cached["reference_assertions"]]
            messages = build_judge_messages(rubric, image, reference=reference)
            answer = await self._ask(messages, "reference_assertions", stats, runtime, reference_call=True)
            if isinstance(answer, JudgeFailure):
                return answer
            assert isinstance(answer, ReferenceAssertions)
            texts = [a.text for a in answer.reference_assertions]
            self._cache_put(key, {"reference_assertions": texts})
            return texts

        result, _ = await runtime.inflight.run(key, compute)
        if not isinstance(result, JudgeFailure):
            self._reference_memo[key] = result
            while len(self._reference_memo) > _REFERENCE_MEMO_SIZE:
                self._reference_memo.popitem(last=False)
        return result

    async def _once(
        self,
        key: str,
        produce: Callable[[], Awaitable[JudgeOutcome]],
        stats: JudgeStats,
        runtime: _Runtime,
        truncated: bool,
    ) -> JudgeOutcome:
        """Coalesce identical in-flight requests, then consult the cache, then ``produce``."""

        async def compute() -> JudgeOutcome:
            cached = self._cache_get(key)
            outcome = None if cached is None else self._decode(cached, truncated)
            if outcome is not None:
                stats.cache_hits += 1
                return outcome
            stats.judged += 1
            outcome = await produce()
            if isinstance(outcome, Judgement):  # failures are never cached
                self._cache_put(
                    key, {"verdict": outcome.verdict.model_dump(mode="json"), "model": self.config.model}
                )
            return outcome

        outcome, shared = await runtime.inflight.run(key, compute)
        if shared:
            stats.coalesced += 1
        return outcome

    @staticmethod
    def _decode(cached: dict[str, Any], truncated: bool) -> Judgement | None:
        try:
            return judgement_from_verdict(
                Verdict.model_validate(cached["verdict"]), truncated_input=truncated
            )
        except (KeyError, TypeError, ValidationError):
            log.warning("judge cache: a stored verdict no longer validates; judging again")
            return None

    # The cache is used synchronously on the event loop, on purpose: a WAL read never blocks and a
    # write takes tens of microseconds, while a thread hop per lookup (asyncio.to_thread) cost more in
    # GIL hand-offs than the query itself (measured: it was the largest CPU item at 128 calls in flight).
    def _cache_get(self, key: str) -> dict[str, Any] | None:
        return None if self.cache is None else self.cache.get(key)

    def _cache_put(self, key: str, value: dict[str, Any]) -> None:
        if self.cache is not None:
            self.cache.put(key, value)

    async def _ask(
        self,
        messages: list[dict[str, Any]],
        kind: CallKind,
        stats: JudgeStats,
        runtime: _Runtime,
        check: Callable[[Any], None] | None = None,
        reference_call: bool = False,
    ) -> Any:
        """The validated answer, or a failure; an invalid answer (bad JSON or schema) is re-asked once."""
        answer = await self._call(messages, kind, stats, runtime, check, reference_call)
        if answer.worth_reasking:
            stats.reasks += 1
            answer = await self._call(
                reask_messages(messages, answer), kind, stats, runtime, check, reference_call
            )
        if answer.failure is not None:
            log.debug("judge: %s call failed: %s (%s)", kind, answer.failure.reason, answer.failure.detail)
            return answer.failure
        return answer.parsed

    async def _call(
        self,
        messages: list[dict[str, Any]],
        kind: CallKind,
        stats: JudgeStats,
        runtime: _Runtime,
        check: Callable[[Any], None] | None,
        reference_call: bool,
    ) -> CallAnswer:
        cfg = self.config
        answer = await self._endpoint.send(
            messages, stats, temperature=cfg.temperature, max_tokens=cfg.max_tokens,
            response_format=response_format(kind), schema=schema_for(kind), check=check,
        )  # fmt: skip
        if reference_call:
            stats.reference_calls += 1
        return answer


def build_judge(
    config: JudgeConfig | Path | str | dict[str, Any],
    *,
    image_root: Path | str | None = None,
    no_cache: bool = False,
    cache_path: Path | str | None = None,
    http_client: Any = None,
) -> OpenAICompatibleJudge:
    """The judge a trainer or evaluator uses: from a :class:`JudgeConfig`, a YAML path or a mapping.

    ``no_cache`` disables the cache whatever the config says; ``cache_path`` overrides its location.
    Raises :class:`JudgeConfigError` for a bad config or a missing API key variable.
    """
    from balcaprl.judge.config import load_judge_config

    cfg = config if isinstance(config, JudgeConfig) else load_judge_config(config)
    if cache_path is not None:
        cfg = cfg.model_copy(update={"cache_path": Path(cache_path).expanduser()})
    if no_cache:
        cfg = cfg.model_copy(update={"cache_path": None})
    if cfg.cache_path is not None and not isinstance(cfg.cache_path, Path):
        raise JudgeConfigError(f"cache_path must be a path, got {cfg.cache_path!r}")
    return OpenAICompatibleJudge(cfg, image_root=image_root, http_client=http_client)
