"""The one call path: every chat request to the judge's endpoint, structured or free text.

The verdict judge (:class:`~balcaprl.judge.client.OpenAICompatibleJudge`: joint verdicts, coverage
of a cached reference, reference decompositions), the evaluation protocols (DCScore's extraction,
matching and verification, CaptionQA's letters, CapArena's pairwise verdicts) and re-captioning all
call through :meth:`JudgeCaller.call`. Per call, in order:

1. the cache key (:func:`~balcaprl.judge.cache.cache_key`: endpoint, model, sampling parameters, schema, trial,
   and what the messages say: an explicit identity, or the messages' hash);
2. the calls in flight on this event loop: an identical one shares its answer (coalescing);
3. the sqlite cache;
4. the endpoint (:class:`~balcaprl.judge.endpoint.Endpoint`: concurrency bound, rate limits, the SDK's
   retries), with one re-ask of an invalid answer (bad JSON, wrong shape, or one that ``check``
   rejects);
5. the cache again: successes are stored, failures never (a retry can succeed later).

Each call ends as a value or a :class:`~balcaprl.judge.protocol.JudgeFailure` with a reason; only a
configuration the endpoint rejects outright (401/403/404) raises
:class:`~balcaprl.judge.config.JudgeConfigError`. :meth:`JudgeCaller.call` records the calls it
makes (calls, tokens, latency, re-asks) in the given stats and leaves counting the *request* to its
caller, who knows what one is: :meth:`~JudgeCaller.call_json` and :meth:`~JudgeCaller.call_text`
count each call as one request in ``caller.stats``; the verdict judge counts its ``JudgeRequest``\\ s.

Repeated trials of one sampled question (DCScore asks its matching and verification three times at
temperature > 0) differ only in ``trial``: each trial has its own cache entry, so a resumed run
re-uses every trial it already paid for and asks only for the missing ones.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from balcaprl.judge.accounting import JudgeStats
from balcaprl.judge.cache import JudgeCache, cache_key, endpoint_identity
from balcaprl.judge.config import JudgeConfig, load_judge_config
from balcaprl.judge.endpoint import Endpoint
from balcaprl.judge.images import ImageLoader, PreparedImage
from balcaprl.judge.protocol import JudgeFailure
from balcaprl.judge.schemas import json_response_format, schema_digest
from balcaprl.judge.transport import reask_messages
from balcaprl.rewards.rubrics import Rubric

__all__ = ["USE_CONFIG", "CallResult", "JudgeCaller", "messages_sha256", "prompt_identity"]

log = logging.getLogger("balcaprl.judge")

USE_CONFIG: Any = object()  # a default meaning "what the judge config says" (cache, temperature)


def messages_sha256(messages: list[dict[str, Any]]) -> str:
    """sha256 of the canonical JSON of a conversation (images included, as their data URLs)."""
    canonical = json.dumps(messages, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def prompt_identity(
    rubric: Rubric, image: PreparedImage, max_image_side: int, **texts: Any
) -> dict[str, Any]:
    """What decides the messages of a rubric + image + texts call, for :meth:`JudgeCaller.key`'s
    ``identity``: cheaper to hash than the messages (no image bytes) and readable in a debugger.
    ``rubric.reference_mode`` is "any" for rubrics the reference mode does not change."""
    return {
        "rubric_version": rubric.version,
        "reference_mode": rubric.reference_mode,
        "image_sha256": image.sha256,
        "max_image_side": max_image_side,
        **texts,
    }


@dataclass(frozen=True)
class CallResult:
    """One call's outcome: ``value`` (a schema instance, or the answer's text) or ``failure``."""

    value: Any
    failure: JudgeFailure | None
    key: str
    cached: bool = False  # answered from the cache, no call made
    shared: bool = False  # identical to a call in flight; its answer was shared
    prompt_tokens: int = 0  # what this call cost (a re-ask included; 0 when cached or shared)
    completion_tokens: int = 0
    calls: int = 0  # endpoint calls made for it: 0 (cached or shared), 1, or 2 with a re-ask

    @property
    def ok(self) -> bool:
        return self.failure is None


def _encode(value: Any, schema: type[BaseModel] | None) -> dict[str, Any]:
    return {"text": value} if schema is None else {"json": value.model_dump(mode="json")}


def _decode(
    stored: dict[str, Any], schema: type[BaseModel] | None, check: Callable[[Any], None] | None
) -> Any:
    """A cached answer, validated again as a fresh one would be (``ValueError`` and friends if not)."""
    if schema is None:
        value = stored.get("text", stored.get("caption"))  # "caption": rows of the old re-captioner
        if not isinstance(value, str) or not value.strip():
            raise ValueError("not a text answer")
    else:
        value = schema.model_validate(stored["json"])
    if check is not None:
        check(value)
    return value


class JudgeCaller:
    """Calls to the endpoint of a judge config (see the module docstring).

    ``config``: a :class:`JudgeConfig`, a YAML path or a mapping. ``cache``: a :class:`JudgeCache`,
    ``None`` for none, or (default) the one ``config.cache_path`` names (closed with the caller; a
    cache passed in is left open for its owner). ``image_root``: where
    :attr:`images` resolves relative paths (and which paths may not leave). ``endpoint``: share an
    existing endpoint (its clients, limits and coalescing) instead of opening a new one.
    Use ``async with`` or call :meth:`aclose`.
    """

    def __init__(
        self,
        config: JudgeConfig | Path | str | dict[str, Any],
        *,
        cache: JudgeCache | None | Any = USE_CONFIG,
        image_root: Path | str | None = None,
        http_client: Any = None,
        endpoint: Endpoint | None = None,
    ):
        cfg = config if isinstance(config, JudgeConfig) else load_judge_config(config)
        self.config = cfg
        self.endpoint = endpoint if endpoint is not None else Endpoint(cfg, http_client=http_client)
        self._owns_endpoint = endpoint is None
        self._owns_cache = cache is USE_CONFIG
        if cache is USE_CONFIG:
            cache = JudgeCache(cfg.cache_path) if cfg.cache_path is not None else None
        self.cache: JudgeCache | None = cache
        self.images = ImageLoader(cfg.max_image_side, root=image_root)
        self.stats = JudgeStats()

    def __repr__(self) -> str:  # never the key
        return f"JudgeCaller(base_url={self.config.base_url!r}, model={self.config.model!r})"

    @property
    def model(self) -> str:
        return self.config.model

    # ----------------------------------------------------------------------------- keys and cache

    def key(
        self,
        kind: str,
        *,
        messages: list[dict[str, Any]] | None = None,
        identity: dict[str, Any] | None = None,
        schema: type[BaseModel] | None = None,
        temperature: float | None | Any = USE_CONFIG,
        max_tokens: int | None = None,
        trial: int | None = None,
        extra_body: dict[str, Any] | None = None,
    ) -> str:
        """The cache key of a call (:func:`~balcaprl.judge.cache.cache_key` with this config's endpoint,
        model and sampling defaults). ``identity`` (what determines the messages, e.g.
        :func:`prompt_identity`) stands in for the messages' hash when a caller wants to look a call
        up before building its messages, or to skip hashing an image; give one of the two."""
        if (messages is None) == (identity is None):
            raise ValueError("give exactly one of `messages` and `identity`")
        cfg = self.config
        return cache_key(
            kind,
            endpoint=endpoint_identity(cfg.base_url),
            model=cfg.model,
            temperature=cfg.temperature if temperature is USE_CONFIG else temperature,
            max_tokens=max_tokens or cfg.max_tokens,
            content=identity
            if identity is not None
            else {"messages_sha256": messages_sha256(messages or [])},
            schema=None if schema is None else schema_digest(schema, kind),
            trial=trial,
            extra_body=extra_body,
        )

    def cached_text(self, key: str) -> str | None:
        """A cached free-text answer, or None (also for rows of another shape)."""
        value = self.cache.get(key) if self.cache is not None else None
        try:
            return None if not value else _decode(value, None, None)
        except ValueError:
            return None

    # ----------------------------------------------------------------------------- calls

    async def call_json(
        self,
        messages: list[dict[str, Any]],
        schema: type[BaseModel],
        *,
        kind: str,
        temperature: float | None | Any = USE_CONFIG,
        max_tokens: int | None = None,
        trial: int | None = None,
        identity: dict[str, Any] | None = None,
        check: Callable[[Any], None] | None = None,
        extra_body: dict[str, Any] | None = None,
    ) -> CallResult:
        """A structured answer validated against ``schema`` (strict json_schema ``response_format``
        named ``balcaprl_<kind>``). ``check(value)`` may raise ``ValueError`` for answers that
        validate but cannot be used; both are schema violations, re-asked once. Counted as one
        request in :attr:`stats`."""
        result = await self.call(
            messages, kind=kind, schema=schema, check=check, temperature=temperature,
            max_tokens=max_tokens, trial=trial, identity=identity, extra_body=extra_body,
        )  # fmt: skip
        return self._counted(result)

    async def call_text(
        self,
        messages: list[dict[str, Any]],
        *,
        kind: str,
        temperature: float | None | Any = USE_CONFIG,
        max_tokens: int | None = None,
        trial: int | None = None,
        identity: dict[str, Any] | None = None,
        accept: Callable[[str], None] | None = None,
        extra_body: dict[str, Any] | None = None,
        truncated_ok: bool = False,
    ) -> CallResult:
        """A free-text answer (stripped; no ``response_format`` is sent). ``accept(text)`` may raise
        ``ValueError`` to have an unusable answer re-asked once (a ``schema_violation`` if it fails
        again); without it any non-empty answer is kept, and an empty one fails at once
        (``invalid_json``: nothing to re-ask about). ``truncated_ok``: keep an answer cut off at
        ``max_tokens`` instead of failing it as ``truncated_output``. Counted as one request in
        :attr:`stats`."""
        result = await self.call(
            messages, kind=kind, check=accept, temperature=temperature, max_tokens=max_tokens,
            trial=trial, identity=identity, extra_body=extra_body, truncated_ok=truncated_ok,
        )  # fmt: skip
        return self._counted(result)

    def _counted(self, result: CallResult) -> CallResult:
        stats = self.stats
        stats.requests += 1
        stats.record_answer(cached=result.cached, shared=result.shared)
        if result.failure is not None:
            stats.failures[result.failure.reason] += 1
        return result

    async def call(
        self,
        messages: list[dict[str, Any]] | Callable[[], list[dict[str, Any]]],
        *,
        kind: str,
        schema: type[BaseModel] | None = None,
        check: Callable[[Any], None] | None = None,
        identity: dict[str, Any] | None = None,
        temperature: float | None | Any = USE_CONFIG,
        max_tokens: int | None = None,
        trial: int | None = None,
        extra_body: dict[str, Any] | None = None,
        truncated_ok: bool = False,
        stats: JudgeStats | None = None,
    ) -> CallResult:
        """The one call path (see the module docstring): a ``schema`` instance, or with ``schema=None``
        the answer's text. The endpoint calls it makes are recorded in ``stats`` (default
        :attr:`stats`); the request itself is not counted (see :meth:`call_json`).

        ``messages`` may be a function that builds them, together with an ``identity``: it is called
        only when a call is made (a cache hit or a shared call never needs the messages)."""
        if callable(messages) and identity is None:
            raise ValueError("messages given as a function need an `identity` for the cache key")
        cfg = self.config
        temperature = cfg.temperature if temperature is USE_CONFIG else temperature
        max_tokens = max_tokens or cfg.max_tokens
        key = self.key(
            kind, messages=None if identity is not None else messages, identity=identity, schema=schema,
            temperature=temperature, max_tokens=max_tokens, trial=trial, extra_body=extra_body,
        )  # fmt: skip
        stats = self.stats if stats is None else stats

        async def compute() -> CallResult:
            # The cache is used synchronously on the event loop, on purpose: a WAL read never blocks
            # and a write takes tens of microseconds, while a thread hop per lookup (asyncio.to_thread)
            # cost more in GIL hand-offs than the query itself (measured: it was the largest CPU item
            # at 128 calls in flight).
            stored = self.cache.get(key) if self.cache is not None else None
            if stored is not None:
                try:
                    return CallResult(_decode(stored, schema, check), None, key, cached=True)
                except (KeyError, TypeError, ValueError, ValidationError):
                    log.warning("judge cache: a stored %s answer no longer validates; asking again", kind)
            conversation = messages() if callable(messages) else messages
            send = dict(
                temperature=temperature, max_tokens=max_tokens, schema=schema, check=check,
                response_format=None if schema is None else json_response_format(schema, kind),
                extra_body=extra_body, truncated_ok=truncated_ok,
            )  # fmt: skip
            answer = await self.endpoint.send(conversation, stats, **send)
            calls, tokens = 1, [answer.prompt_tokens, answer.completion_tokens]
            # A structured answer that is broken is re-asked once; a free-text one only when `check`
            # rejected what it said (an empty text answer is a failure at once).
            if answer.worth_reasking and (schema is not None or answer.content is not None):
                stats.reasks += 1
                answer = await self.endpoint.send(reask_messages(conversation, answer), stats, **send)
                calls, tokens = 2, [tokens[0] + answer.prompt_tokens, tokens[1] + answer.completion_tokens]
            paid = {"calls": calls, "prompt_tokens": tokens[0], "completion_tokens": tokens[1]}
            if answer.failure is not None:
                log.debug(
                    "judge: %s call failed: %s (%s)", kind, answer.failure.reason, answer.failure.detail
                )
                return CallResult(None, answer.failure, key, **paid)
            if self.cache is not None:
                self.cache.put(key, {**_encode(answer.parsed, schema), "kind": kind, "model": cfg.model})
            return CallResult(answer.parsed, None, key, **paid)

        result, shared = await self.endpoint.coalesce(key, compute)
        if shared:  # the tokens were paid once, by the caller that made the call
            return CallResult(result.value, result.failure, key, cached=result.cached, shared=True)
        return result

    # ----------------------------------------------------------------------------- lifetime

    async def aclose(self) -> None:
        """Close the connections and the cache, those of them this caller opened."""
        if self._owns_endpoint:
            await self.endpoint.aclose()
        if self._owns_cache and self.cache is not None:
            self.cache.close()

    async def __aenter__(self) -> JudgeCaller:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
