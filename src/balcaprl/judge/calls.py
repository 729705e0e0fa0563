"""Generic judge calls: any chat request through the judge's endpoint machinery, structured or free text.

The verdict judge (:class:`~balcaprl.judge.client.OpenAICompatibleJudge`) asks one kind of question.
Evaluation protocols and data preparation ask others — DCScore's fact extraction, matching and
verification (JSON schemas), CaptionQA's single-letter answers and re-captioning (free text),
CapArena's pairwise verdicts — and they need the same plumbing. This module is that plumbing, once:

- :class:`Endpoint`: one configured OpenAI-compatible endpoint — the API key, the SDK clients (their
  retries, backoff and timeouts), the concurrency semaphore, the request/token rate limiters and the
  coalescing of identical calls in flight, rebuilt per event loop. The verdict judge runs on one too.
- :class:`JudgeCaller`: ``await caller.call_json(messages, Schema, kind=...)`` and
  ``await caller.call_text(messages, kind=...)``. Per call, in order: the cache key (model, the
  messages' hash or a caller-given identity, sampling parameters, schema, trial number), the calls
  in flight (identical calls share one), the sqlite cache, and only then the endpoint. An invalid
  answer (bad JSON, wrong shape, or one that ``check``/``accept`` rejects) is re-asked once. Each
  call ends as a value or a :class:`~balcaprl.judge.protocol.JudgeFailure` with a reason; only a
  configuration the endpoint rejects outright (401/403/404) raises
  :class:`~balcaprl.judge.config.JudgeConfigError`. Every call is counted in ``caller.stats``.

Repeated trials of one sampled question (DCScore asks its matching and verification three times at
temperature > 0) differ only in ``trial``: each trial has its own cache entry, so a resumed run
re-uses every trial it already paid for and asks only for the missing ones.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import openai
from aiolimiter import AsyncLimiter
from pydantic import BaseModel, ValidationError

from balcaprl.judge.accounting import JudgeStats
from balcaprl.judge.cache import JudgeCache, cache_key
from balcaprl.judge.config import JudgeConfig, load_judge_config
from balcaprl.judge.connections import http_client, retire
from balcaprl.judge.images import ImageLoader
from balcaprl.judge.inflight import InFlight
from balcaprl.judge.prompt import approx_image_tokens, approx_tokens
from balcaprl.judge.protocol import JudgeFailure
from balcaprl.judge.schemas import _portable
from balcaprl.judge.transport import CallAnswer, call_endpoint, reask_messages

__all__ = ["CallResult", "Endpoint", "JudgeCaller", "json_response_format", "messages_sha256"]

log = logging.getLogger("balcaprl.judge")

_USE_CONFIG: Any = object()
_CONNECTIONS_PER_CLIENT = 32


@dataclass
class _Runtime:
    """State bound to one event loop (the SDK's connection pool, asyncio primitives, limiters)."""

    loop: asyncio.AbstractEventLoop
    clients: list[openai.AsyncOpenAI]
    semaphore: asyncio.Semaphore
    rpm: AsyncLimiter | None
    tpm: AsyncLimiter | None
    inflight: InFlight
    calls_started: int = 0

    def next_client(self) -> openai.AsyncOpenAI:
        self.calls_started += 1
        return self.clients[self.calls_started % len(self.clients)]


class Endpoint:
    """One OpenAI-compatible endpoint as a :class:`JudgeConfig` describes it.

    ``http_client``: an ``httpx2.AsyncClient`` for the SDK (tests use a mock transport).
    Bound to whichever event loop uses it: a new loop gets fresh clients and asyncio primitives.
    """

    def __init__(self, config: JudgeConfig, *, http_client: Any = None):
        self.config = config
        self.api_key = config.resolve_api_key()
        self._http_client = http_client
        self.state: _Runtime | None = None
        self._finalizer: weakref.finalize | None = None  # closes aiohttp clients left open (connections.py)

    def runtime(self) -> _Runtime:
        loop = asyncio.get_running_loop()
        state = self.state
        if state is not None and state.loop is loop:
            return state
        # First use, or a new event loop (asyncio.run called again): asyncio primitives and the
        # connection pool belong to one loop, so build fresh ones.
        cfg = self.config
        if self._http_client is not None:
            http_clients = [self._http_client]
        else:
            # Several SDK clients, each with its own pool of about _CONNECTIONS_PER_CLIENT connections:
            # httpx's pool scans all its connections on every request, which at 128+ calls in flight
            # was the largest CPU item of a call (cProfile). See connections.py for the clients.
            shards = -(-cfg.concurrency // _CONNECTIONS_PER_CLIENT)
            http_clients = [http_client(cfg.http_backend) for _ in range(shards)]
        clients = [
            openai.AsyncOpenAI(
                api_key=self.api_key,
                base_url=cfg.base_url,
                timeout=cfg.timeout_s,
                max_retries=cfg.max_retries,
                http_client=http,
            )
            for http in http_clients
        ]
        if self._finalizer is not None:
            self._finalizer()  # the previous loop's aiohttp clients
        if self._http_client is None and cfg.http_backend == "aiohttp":
            self._finalizer = weakref.finalize(self, retire, loop, clients)
        self.state = _Runtime(
            loop=loop,
            clients=clients,
            semaphore=asyncio.Semaphore(cfg.concurrency),
            rpm=AsyncLimiter(cfg.requests_per_minute, 60) if cfg.requests_per_minute else None,
            tpm=AsyncLimiter(cfg.tokens_per_minute, 60) if cfg.tokens_per_minute else None,
            inflight=InFlight(),
        )
        return self.state

    async def send(
        self,
        messages: list[dict[str, Any]],
        stats: JudgeStats,
        *,
        temperature: float | None,
        max_tokens: int,
        response_format: dict[str, Any] | None = None,
        schema: type[BaseModel] | None = None,
        check: Callable[[Any], None] | None = None,
        extra_body: dict[str, Any] | None = None,
        truncated_ok: bool = False,
    ) -> CallAnswer:
        """One call under the rate limits and the concurrency bound; recorded in ``stats``."""
        runtime = self.runtime()
        cfg = self.config
        if runtime.rpm is not None:
            await runtime.rpm.acquire(1)
        if runtime.tpm is not None:
            # Providers count max_tokens against the token budget up front; so do we.
            await runtime.tpm.acquire(min(self.estimate_tokens(messages) + max_tokens, cfg.tokens_per_minute))
        async with runtime.semaphore:
            start = time.perf_counter()
            answer = await call_endpoint(
                runtime.next_client(),
                model=cfg.model,
                messages=messages,
                temperature=temperature,
                max_tokens=max_tokens,
                response_format=response_format,
                schema=schema,
                check=check,
                extra_body=extra_body,
                secret=self.api_key,
                truncated_ok=truncated_ok,
            )
            latency = time.perf_counter() - start
        stats.record_call(latency, answer.prompt_tokens, answer.completion_tokens)
        return answer

    def estimate_tokens(self, messages: list[dict[str, Any]]) -> int:
        total = 0
        for message in messages:
            content = message["content"]
            if isinstance(content, str):
                total += approx_tokens(content)
                continue
            for part in content:
                if part["type"] == "text":
                    total += approx_tokens(part["text"])
                else:  # an upper bound: the image is at most max_image_side on each side
                    side = self.config.max_image_side
                    total += approx_image_tokens(side, side)
        return total

    async def aclose(self) -> None:
        if self._finalizer is not None:
            self._finalizer.detach()  # closed here, not by the finalizer
            self._finalizer = None
        state, self.state = self.state, None
        if state is None:
            return
        if state.loop is not asyncio.get_running_loop() and self.config.http_backend == "aiohttp":
            # Used on another loop (a trainer's reward loop, closed from the main thread): an aiohttp
            # session can only be closed on its own loop, else it logs "Unclosed client session".
            pending = retire(state.loop, state.clients)
            if pending is not None and state.loop.is_running():
                await asyncio.wrap_future(pending)
            return
        for client in state.clients:
            await client.close()


def messages_sha256(messages: list[dict[str, Any]]) -> str:
    """sha256 of the canonical JSON of a conversation (images included, as their data URLs)."""
    canonical = json.dumps(messages, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


@cache
def json_response_format(schema: type[BaseModel], name: str) -> dict[str, Any]:
    """The strict ``response_format`` for ``schema`` under ``name`` (the portable JSON-schema subset:
    bounds are checked locally with pydantic instead). Treat the returned dict as read-only."""
    from openai.lib._parsing import type_to_response_format_param

    param = type_to_response_format_param(schema)
    body = _portable(param["json_schema"]["schema"])  # type: ignore[index]
    return {"type": "json_schema", "json_schema": {"name": name, "schema": body, "strict": True}}


@cache
def _schema_digest(schema: type[BaseModel]) -> str:
    """A short hash of a schema's JSON schema: a changed schema never reuses cached answers."""
    text = json.dumps(schema.model_json_schema(), sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


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

    @property
    def ok(self) -> bool:
        return self.failure is None


class JudgeCaller:
    """Generic calls to the endpoint of a judge config (see the module docstring).

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
        cache: JudgeCache | None | Any = _USE_CONFIG,
        image_root: Path | str | None = None,
        http_client: Any = None,
        endpoint: Endpoint | None = None,
    ):
        cfg = config if isinstance(config, JudgeConfig) else load_judge_config(config)
        self.config = cfg
        self.endpoint = endpoint if endpoint is not None else Endpoint(cfg, http_client=http_client)
        self._owns_endpoint = endpoint is None
        self._owns_cache = cache is _USE_CONFIG
        if cache is _USE_CONFIG:
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
        temperature: float | None | Any = _USE_CONFIG,
        max_tokens: int | None = None,
        trial: int | None = None,
        extra_body: dict[str, Any] | None = None,
    ) -> str:
        """The cache key of a call. ``identity`` (what determines the messages, e.g. a rubric version,
        an image hash and a text) stands in for the messages' hash when a caller wants to look a call
        up before building its messages; give one of the two."""
        if (messages is None) == (identity is None):
            raise ValueError("give exactly one of `messages` and `identity`")
        cfg = self.config
        parts: dict[str, Any] = {
            "kind": kind,
            "model": cfg.model,
            "temperature": cfg.temperature if temperature is _USE_CONFIG else temperature,
            "max_tokens": max_tokens or cfg.max_tokens,
        }
        if schema is not None:
            parts["schema"] = _schema_digest(schema)
        if trial is not None:
            parts["trial"] = trial
        if extra_body:
            parts["extra_body"] = extra_body
        if identity is not None:
            overlap = set(identity) & set(parts)
            if overlap:
                raise ValueError(f"identity may not redefine {sorted(overlap)}")
            parts.update(identity)
        else:
            parts["messages_sha256"] = messages_sha256(messages or [])
        return cache_key(**parts)

    def cached_text(self, key: str) -> str | None:
        """A cached free-text answer, or None (also for rows of another shape)."""
        value = self.cache.get(key) if self.cache is not None else None
        if not value:
            return None
        text = value.get("text", value.get("caption"))  # "caption": rows written by the old re-captioner
        return text if isinstance(text, str) and text.strip() else None

    # ----------------------------------------------------------------------------- calls

    async def call_json(
        self,
        messages: list[dict[str, Any]],
        schema: type[BaseModel],
        *,
        kind: str,
        temperature: float | None | Any = _USE_CONFIG,
        max_tokens: int | None = None,
        trial: int | None = None,
        identity: dict[str, Any] | None = None,
        check: Callable[[Any], None] | None = None,
        extra_body: dict[str, Any] | None = None,
    ) -> CallResult:
        """A structured answer validated against ``schema`` (strict json_schema ``response_format``
        named ``balcaprl_<kind>``). ``check(value)`` may raise ``ValueError`` for answers that
        validate but cannot be used; both are schema violations, re-asked once."""
        fmt = json_response_format(schema, f"balcaprl_{kind}")

        def decode(stored: dict[str, Any]) -> Any:
            value = schema.model_validate(stored["json"])
            if check is not None:
                check(value)
            return value

        return await self._call(
            messages, kind=kind, temperature=temperature, max_tokens=max_tokens, trial=trial,
            identity=identity, extra_body=extra_body, schema=schema, response_format=fmt, check=check,
            encode=lambda value: {"json": value.model_dump(mode="json")}, decode=decode,
        )  # fmt: skip

    async def call_text(
        self,
        messages: list[dict[str, Any]],
        *,
        kind: str,
        temperature: float | None | Any = _USE_CONFIG,
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
        ``max_tokens`` instead of failing it as ``truncated_output``."""

        def decode(stored: dict[str, Any]) -> str:
            text = stored.get("text", stored.get("caption"))
            if not isinstance(text, str) or not text.strip():
                raise ValueError("not a text answer")
            if accept is not None:
                accept(text)
            return text

        return await self._call(
            messages, kind=kind, temperature=temperature, max_tokens=max_tokens, trial=trial,
            identity=identity, extra_body=extra_body, schema=None, response_format=None, check=accept,
            encode=lambda value: {"text": value}, decode=decode, truncated_ok=truncated_ok,
        )  # fmt: skip

    async def _call(
        self,
        messages: list[dict[str, Any]],
        *,
        kind: str,
        temperature: Any,
        max_tokens: int | None,
        trial: int | None,
        identity: dict[str, Any] | None,
        extra_body: dict[str, Any] | None,
        schema: type[BaseModel] | None,
        response_format: dict[str, Any] | None,
        check: Callable[[Any], None] | None,
        encode: Callable[[Any], dict[str, Any]],
        decode: Callable[[dict[str, Any]], Any],
        truncated_ok: bool = False,
    ) -> CallResult:
        cfg = self.config
        temperature = cfg.temperature if temperature is _USE_CONFIG else temperature
        max_tokens = max_tokens or cfg.max_tokens
        key = self.key(
            kind, messages=None if identity is not None else messages, identity=identity, schema=schema,
            temperature=temperature, max_tokens=max_tokens, trial=trial, extra_body=extra_body,
        )  # fmt: skip
        stats = self.stats
        stats.requests += 1
        runtime = self.endpoint.runtime()

        async def compute() -> CallResult:
            stored = self.cache.get(key) if self.cache is not None else None
            if stored is not None:
                try:
                    value = decode(stored)
                    stats.cache_hits += 1
                    return CallResult(value, None, key, cached=True)
                except (KeyError, TypeError, ValueError, ValidationError):
                    log.warning("judge cache: a stored %s answer no longer validates; asking again", kind)
            stats.judged += 1
            send = dict(
                temperature=temperature, max_tokens=max_tokens, response_format=response_format,
                schema=schema, check=check, extra_body=extra_body, truncated_ok=truncated_ok,
            )  # fmt: skip
            answer = await self.endpoint.send(messages, stats, **send)
            tokens = [answer.prompt_tokens, answer.completion_tokens]
            # A structured answer that is broken is re-asked once; a free-text one only when `accept`
            # rejected what it said (an empty text answer is a failure at once).
            if answer.worth_reasking and (schema is not None or answer.content is not None):
                stats.reasks += 1
                answer = await self.endpoint.send(reask_messages(messages, answer), stats, **send)
                tokens = [tokens[0] + answer.prompt_tokens, tokens[1] + answer.completion_tokens]
            usage = {"prompt_tokens": tokens[0], "completion_tokens": tokens[1]}
            if answer.failure is not None:
                log.debug(
                    "judge: %s call failed: %s (%s)", kind, answer.failure.reason, answer.failure.detail
                )
                return CallResult(None, answer.failure, key, **usage)
            if self.cache is not None:  # failures are never cached
                self.cache.put(key, {**encode(answer.parsed), "kind": kind, "model": cfg.model})
            return CallResult(answer.parsed, None, key, **usage)

        result, shared = await runtime.inflight.run(key, compute)
        if shared:
            stats.coalesced += 1
            result = CallResult(result.value, result.failure, key, cached=result.cached, shared=True)
            # the tokens were paid once, by the caller that made the call
        if result.failure is not None:  # per request, as the verdict judge counts them
            stats.failures[result.failure.reason] += 1
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
