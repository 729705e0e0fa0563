"""The OpenAI-compatible judge: (image, caption, reference) -> validated verdict, for whole batches.

Per request, in order: clean the texts (empty caption -> scored 0 without a call; empty reference or
unreadable image -> ``bad_input``), load the image once per batch, then make the call through the
package's one call path (:mod:`balcaprl.judge.calls`). Every request ends as a ``Judgement`` or a
``JudgeFailure``; no single failure fails the batch (only a configuration the endpoint rejects
outright, 401/403/404, raises).

Reference modes (``config.reference_mode``):
- ``joint``: one call per rollout decomposes both caption and reference (the paper).
- ``cached-reference``: the reference is decomposed once -- coalesced, cached in memory and in
  sqlite -- by the same splitting rules as joint mode (one shared rubric part), from its text alone
  (``rubric.reference_image`` sends the image too), and each rollout's call only marks coverage of
  that fixed, numbered list. Fewer output tokens, and all rollouts of a prompt share one recall
  denominator. An answer that leaves some numbers unmarked (long references) is not thrown away: one
  follow-up asks for exactly those numbers, and the marks are merged; if the follow-up leaves a
  number unmarked too, the rollout fails (``schema_violation``, NaN), never a guessed mark. (Unknown
  or repeated numbers are a broken answer, re-asked once like any other.)

Rubrics: a request names its verdict rubric (``training``, ``evaluation``, or
``training_without_pointability`` for the "w/o pointability" ablation); each has its own wire schema,
whose field descriptions agree with its text (:mod:`balcaprl.judge.schemas`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import traceback
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from balcaprl.judge.accounting import JudgeStats
from balcaprl.judge.cache import JudgeCache
from balcaprl.judge.calls import JudgeCaller, cached_answer, prompt_identity, redact
from balcaprl.judge.config import JudgeConfig, JudgeConfigError
from balcaprl.judge.images import ImageError, PreparedImage
from balcaprl.judge.outcomes import empty_caption_judgement, judgement_from_verdict, rewards_tensor
from balcaprl.judge.prompt import build_coverage_followup, build_judge_messages, clean_caption, clean_text
from balcaprl.judge.protocol import JudgeFailure, JudgeOutcome, JudgeRequest
from balcaprl.judge.rubrics import VERDICT_RUBRICS, Rubric, load_rubric
from balcaprl.judge.schemas import (
    CoverageMarks,
    ReferenceAssertions,
    assemble_verdict,
    check_coverage,
    coverage_schema,
    judge_call_kind,
    missing_ids,
    to_verdict,
    verdict_schema,
)
from balcaprl.judge.tail import hedge_batch
from balcaprl.rewards import Verdict

if TYPE_CHECKING:  # torch only for BatchResult.rewards: the judge's path never imports it
    import torch

log = logging.getLogger("balcaprl.judge")

_REFERENCE_MEMO_SIZE = 65536  # reference decompositions kept in memory (cached-reference mode)


@dataclass(frozen=True)
class BatchResult:
    """A batch's outcomes (one per request, in order) and its accounting."""

    outcomes: list[JudgeOutcome]
    stats: JudgeStats

    def rewards(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """``(N, 3)`` precision/recall/linguistic, NaN rows for failures (see :func:`rewards_tensor`)."""
        return rewards_tensor(self.outcomes, dtype=dtype)


class OpenAICompatibleJudge:
    """A :class:`~balcaprl.judge.protocol.Judge` backed by any OpenAI-compatible chat endpoint.

    ``image_root``: resolve relative image paths against it and refuse paths that leave it.
    The cache is the one ``config.cache_path`` names (none when it is null), closed with the judge.
    ``http_client``: an ``aiohttp.ClientSession`` to send through (its owner closes it).
    """

    def __init__(
        self,
        config: JudgeConfig,
        *,
        image_root: Path | str | None = None,
        http_client: Any = None,
    ):
        self.config = config
        self._calls = JudgeCaller(config, image_root=image_root, http_client=http_client)
        self._endpoint = self._calls.endpoint
        self.cache: JudgeCache | None = self._calls.cache
        self.images = self._calls.images
        self.stats = JudgeStats()  # lifetime total; each batch also returns its own
        self._reference_memo: OrderedDict[tuple[str | None, str], list[str]] = OrderedDict()
        mode = config.reference_mode
        self._rubrics: dict[str, Rubric] = {name: load_rubric(name, mode) for name in VERDICT_RUBRICS}
        self._reference_image = config.rubric.reference_image
        self._reference_rubric = load_rubric(
            "reference_decomposition_with_image" if self._reference_image else "reference_decomposition"
        )

    def __repr__(self) -> str:  # never the key
        return f"OpenAICompatibleJudge(base_url={self.config.base_url!r}, model={self.config.model!r})"

    def rubric_version(self, rubric: str = "training") -> str:
        return self._rubrics[rubric].version

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
        stats = JudgeStats()
        images: dict[tuple, asyncio.Task] = {}
        outcomes: list[JudgeOutcome | None] = [None] * len(requests)
        for i, outcome in (await self._cached_verdicts(requests, stats)).items():
            outcomes[i] = outcome
            if on_outcome is not None:
                on_outcome(i, outcome)

        async def run(i: int, request: JudgeRequest) -> None:
            outcome = await self._judge_one(request, stats, images)
            outcomes[i] = outcome
            if isinstance(outcome, JudgeFailure):
                stats.failures[outcome.reason] += 1
            if on_outcome is not None:
                on_outcome(i, outcome)

        # The batch's calls are one batch for the hedge cap (tail.py), unless an outer one is open;
        # a batch of one call (a rollout judged as it finishes) is held by the cap's other windows.
        batch = hedge_batch() if len(requests) > 1 else contextlib.nullcontext()
        try:
            with batch:
                async with asyncio.TaskGroup() as group:
                    for i, request in enumerate(requests):
                        if outcomes[i] is None:  # not answered from the cache above
                            group.create_task(run(i, request))
        except* JudgeConfigError as errors:
            raise errors.exceptions[0] from None
        self.stats.merge(stats)
        if log.isEnabledFor(logging.INFO):  # the line's percentiles cost a sort per batch (one per rollout)
            log.info(stats.one_line(self.config.price_per_million_tokens))
        return BatchResult([o for o in outcomes if o is not None], stats)

    def rewards_wanted_at(self, when: float | None) -> None:
        """When the trainer wants this step's rewards (``time.perf_counter``; None: its rewards are in):
        calls that would answer after it get their duplicate sooner (the
        :class:`~balcaprl.judge.protocol.SupportsDeadline` extension). On the judge's event loop."""
        self._endpoint.rewards_wanted_at(when)

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

    async def _cached_verdicts(
        self, requests: Sequence[JudgeRequest], stats: JudgeStats
    ) -> dict[int, JudgeOutcome]:
        """The outcomes of the joint-mode requests whose verdict the cache holds, by index, found
        before any image is decoded: the images are hashed (:meth:`ImageLoader.sha256`) in one thread
        hop, and all the keys read in one query. On a warm cache that was the bulk of the time: each
        image decoded and re-encoded in a thread of its own, contending for the GIL with the lookups.
        Every other request (a miss, an empty text, an unreadable image) takes :meth:`_judge_one`,
        which gives it the same outcome it always had."""
        if self.cache is None or self.config.reference_mode != "joint":
            return {}  # cached-reference keys need the reference's assertions first (_judge_one)
        texts: dict[int, tuple[Rubric, Any, str]] = {}
        references: dict[str, str] = {}  # a group's rollouts, or an image's captions, share one
        for i, request in enumerate(requests):
            rubric = self._rubrics.get(request.rubric)
            caption = clean_caption(request.caption, self.config.caption_char_cap)
            reference = references.get(request.reference)
            if reference is None:
                reference = references[request.reference] = clean_text(request.reference).strip()
            if rubric is not None and caption.text and reference:
                texts[i] = (rubric, caption, reference)
        if not texts:
            return {}
        digests = await asyncio.to_thread(self._image_digests, [requests[i].image for i in texts])
        keys: dict[int, str] = {}
        for (i, (rubric, caption, reference)), digest in zip(texts.items(), digests, strict=True):
            if digest is not None:
                identity = self._identity(rubric, digest, reference=reference, caption=caption.text)
                keys[i] = self._calls.key(
                    judge_call_kind("verdict", rubric.name), identity=identity,
                    schema=verdict_schema(rubric.name), temperature=self.config.temperature,
                )  # fmt: skip
        stored = self.cache.get_many(list(keys.values()))  # a cache that cannot be read: {} (logged)
        outcomes: dict[int, JudgeOutcome] = {}
        for i, key in keys.items():
            rubric, caption, _ = texts[i]
            value = stored.get(key)
            answer = None if value is None else cached_answer(value, verdict_schema(rubric.name))
            if answer is not None:  # one that no longer validates is asked again (_judge_one)
                stats.requests += 1
                stats.record_answer(cached=True, shared=False)
                verdict = to_verdict(answer, value["json"])
                outcomes[i] = judgement_from_verdict(verdict, truncated_input=caption.truncated)
        return outcomes

    def _image_digests(self, images: Sequence[Path | str | bytes]) -> list[str | None]:
        """:meth:`ImageLoader.sha256` of each image (None where it cannot be read), each distinct
        image hashed once: a prompt's rollouts share one."""
        digests: dict[tuple, str | None] = {}
        for image in images:
            identity = self._image_identity(image)
            if identity not in digests:
                try:
                    digests[identity] = self.images.sha256(image)
                except ImageError:
                    digests[identity] = None
        return [digests[self._image_identity(image)] for image in images]

    @staticmethod
    def _image_identity(image: Path | str | bytes) -> tuple:
        return ("path", os.fspath(image)) if isinstance(image, str | os.PathLike) else ("object", id(image))

    async def _judge_one(
        self, request: JudgeRequest, stats: JudgeStats, images: dict[tuple, asyncio.Task]
    ) -> JudgeOutcome:
        stats.requests += 1
        try:
            if request.rubric not in self._rubrics:
                stats.rejected += 1
                return JudgeFailure(
                    "bad_input", f"unknown rubric {request.rubric!r}; use one of {VERDICT_RUBRICS}"
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
                return JudgeFailure("bad_input", redact(str(error), self._endpoint.api_key)[:300])
            rubric = self._rubrics[request.rubric]
            if self.config.reference_mode == "joint":
                verdict = await self._joint_verdict(rubric, image, reference, caption.text, stats)
            else:
                verdict = await self._coverage_verdict(rubric, image, reference, caption.text, stats)
            if isinstance(verdict, JudgeFailure):
                return verdict
            return judgement_from_verdict(verdict, truncated_input=caption.truncated)
        except JudgeConfigError:
            raise
        except Exception as error:  # a bug must not fail the other 2047 rollouts; it is logged loudly
            detail = redact(f"internal error: {type(error).__name__}: {error}", self._endpoint.api_key)[:300]
            # the traceback's frames, not its message: a message could carry anything, the key included
            frames = "".join(traceback.format_tb(error.__traceback__))
            log.error("judge: %s (one request failed; the batch goes on)\n%s", detail, frames)
            return JudgeFailure("server_error", detail)

    async def _image(self, image: Path | str | bytes, images: dict[tuple, asyncio.Task]) -> PreparedImage:
        # The rollouts of one prompt share their image object: load (decode, hash) it once per batch.
        identity = self._image_identity(image)
        task = images.get(identity)
        if task is None:
            known = self.images.prepared(image)  # prepared by an earlier batch: no thread hop
            if known is not None:
                return known
            task = asyncio.ensure_future(asyncio.to_thread(self.images.load, image))
            images[identity] = task
        return await task

    def _identity(self, rubric: Rubric, image: PreparedImage | str | None, **texts: Any) -> dict[str, Any]:
        if image is None:  # a text-only call: nothing about any image decides its messages
            return {"rubric_version": rubric.version, "reference_mode": rubric.reference_mode, **texts}
        return prompt_identity(rubric, image, self.config.max_image_side, **texts)

    async def _joint_verdict(
        self, rubric: Rubric, image: PreparedImage, reference: str, caption: str, stats: JudgeStats
    ) -> Verdict | JudgeFailure:
        """One call: the judge decomposes caption and reference and marks both (the paper)."""
        result = await self._calls.call(
            lambda: build_judge_messages(rubric, image, reference=reference, caption=caption),
            kind=judge_call_kind("verdict", rubric.name), schema=verdict_schema(rubric.name), stats=stats,
            temperature=self.config.temperature,
            identity=self._identity(rubric, image, reference=reference, caption=caption),
        )  # fmt: skip
        stats.record_answer(cached=result.cached, shared=result.shared)
        return to_verdict(result.value) if result.ok else result.failure

    async def _coverage_verdict(
        self, rubric: Rubric, image: PreparedImage, reference: str, caption: str, stats: JudgeStats
    ) -> Verdict | JudgeFailure:
        """The reference's fixed assertions, then one call marking the caption's coverage of them (and,
        for numbers that answer left unmarked, one follow-up asking for those only)."""
        assertions = await self._reference_assertions(image, reference, stats)
        if isinstance(assertions, JudgeFailure):
            return assertions
        n = len(assertions)

        def messages() -> list[dict[str, Any]]:
            return build_judge_messages(rubric, image, reference_assertions=assertions, caption=caption)

        def check(answer: Any) -> None:
            # unknown or repeated ids are a schema violation (re-asked); missing ones are asked for below
            check_coverage(answer, n, partial=True)

        identity = self._identity(rubric, image, reference_assertions=assertions, caption=caption)
        result = await self._calls.call(
            messages, kind=judge_call_kind("coverage", rubric.name), schema=coverage_schema(rubric.name),
            check=check, stats=stats, identity=identity, temperature=self.config.temperature,
        )  # fmt: skip
        stats.record_answer(cached=result.cached, shared=result.shared)
        if not result.ok:
            return result.failure
        answer = result.value
        missing = missing_ids(answer, n)
        if not missing:
            return assemble_verdict(answer, assertions)
        # A long list is where judges skip numbers: ask for exactly those, keep the rest of the answer.
        answer_json = answer.model_dump_json()
        wanted = {i: assertions[i - 1] for i in missing}

        def check_followup(marks: CoverageMarks) -> None:
            ids = [mark.id for mark in marks.reference_coverage]
            if len(set(ids)) != len(ids) or not set(ids) <= set(missing):
                raise ValueError(
                    f"reference_coverage may only mark the ids {missing}, each once, got ids {ids}"
                )

        followup = await self._calls.call(
            lambda: build_coverage_followup(messages(), answer_json, wanted),
            kind="coverage_missing", schema=CoverageMarks, check=check_followup, stats=stats,
            temperature=self.config.temperature,
            identity={**identity, "missing_ids": missing, "answer": answer_json},
        )  # fmt: skip
        if not followup.ok:
            return followup.failure
        marks = {mark.id: mark.covered for mark in followup.value.reference_coverage}
        still = [i for i in missing if i not in marks]
        if still:  # asked twice: a number without a mark is a failed rollout, never a guessed mark
            return JudgeFailure(
                "schema_violation",
                f"reference_coverage: ids {still} unmarked after a follow-up asking for them",
            )
        return assemble_verdict(answer, assertions, extra_marks=marks)

    async def _reference_assertions(
        self, image: PreparedImage, reference: str, stats: JudgeStats
    ) -> list[str] | JudgeFailure:
        """The reference's assertions: from memory, or the call path (coalesced, cached). The call is
        not one of the batch's requests: only its calls are counted (``reference_calls``). Without
        ``rubric.reference_image`` the call is text only, so one decomposition serves every image that
        shares the reference text."""
        sent_image = image if self._reference_image else None
        memo_key = (None if sent_image is None else image.sha256, reference)  # the rest is fixed per judge
        known = self._reference_memo.get(memo_key)
        if known is not None:
            return known
        rubric = self._reference_rubric
        result = await self._calls.call(
            lambda: build_judge_messages(rubric, sent_image, reference=reference),
            kind=judge_call_kind("reference_assertions"), schema=ReferenceAssertions, stats=stats,
            temperature=self.config.temperature,
            identity=self._identity(rubric, sent_image, reference=reference),
        )  # fmt: skip
        stats.reference_calls += result.calls
        if not result.ok:
            return result.failure
        texts = [a.text for a in result.value.reference_assertions]
        self._reference_memo[memo_key] = texts
        while len(self._reference_memo) > _REFERENCE_MEMO_SIZE:
            self._reference_memo.popitem(last=False)
        return texts


def build_judge(
    config: JudgeConfig | Path | str | dict[str, Any],
    *,
    image_root: Path | str | None = None,
    no_cache: bool = False,
    cache_path: Path | str | None = None,
    http_client: Any = None,
    processes: int = 1,
    rollouts: bool = False,
) -> OpenAICompatibleJudge:
    """The judge a trainer or evaluator uses: from a :class:`JudgeConfig`, a YAML path or a mapping.

    ``no_cache`` disables the cache whatever the config says; ``cache_path`` overrides its location;
    ``processes``: how many clients (one per GPU process of a launch) share the configured limits
    (:meth:`JudgeConfig.shared_by`); ``rollouts``: the judge scores RL rollouts, so the cache is off
    unless the config's ``cache_rollouts`` turns it on. Raises :class:`JudgeConfigError` for a bad config or a missing
    API key variable.
    """
    from balcaprl.judge.config import load_judge_config

    cfg = config if isinstance(config, JudgeConfig) else load_judge_config(config)
    cfg = cfg.shared_by(processes)
    if cache_path is not None:
        cfg = cfg.model_copy(update={"cache_path": Path(cache_path).expanduser()})
    if no_cache or (rollouts and not cfg.cache_rollouts):
        cfg = cfg.model_copy(update={"cache_path": None})
    if cfg.cache_path is not None and not isinstance(cfg.cache_path, Path):
        raise JudgeConfigError(f"cache_path must be a path, got {cfg.cache_path!r}")
    return OpenAICompatibleJudge(cfg, image_root=image_root, http_client=http_client)
