"""How one judge call is made, top to bottom: every call of the package comes through here.

:meth:`JudgeCaller.call`, in order:

1. **Key and cache.** The call's key (:meth:`JudgeCaller.key`: everything that decides its answer,
   the endpoint included) is looked up in the sqlite cache; a stored answer is validated again as a
   fresh one would be.
2. **Coalescing.** Identical calls in flight share one (:meth:`Endpoint.coalesce`): the G rollouts of
   a prompt often repeat a caption, TRL calls each reward function on the same completions, and in
   cached-reference mode all G rollouts need the same reference decomposition at once.
3. **Limits, per attempt.** Every attempt -- first, retry or hedge -- takes a slot of the
   concurrency bound, then is admitted by the request and token rate limits over a sliding minute,
   and starts at once (:meth:`Endpoint.send`; :mod:`balcaprl.judge.throughput`). The token limiter
   budgets a call's prompt at its model's image rate and a realistic answer
   (:class:`~balcaprl.judge.tokens.CompletionBudget`), not the whole ``max_tokens``. A 429 halves
   the calls in flight allowed; ``auto`` sizes from first attempts' latency only.
4. **Retries.** Timeouts, dropped connections, 408/409/429 and 5xx are tried again, up to
   ``max_retries`` times, after ``retry-after`` when the server gives one (up to
   :data:`RETRY_AFTER_CAP_S`), else an exponential backoff with jitter (:func:`backoff_s`). A call
   waiting to retry holds no slot.
5. **One attempt** (:meth:`Endpoint.attempt`): one HTTP exchange, under ``timeout_s`` for the whole
   of it. The answer is read in chunks up to :func:`answer_byte_limit` -- bytes read and bytes
   decompressed alike -- so an endless body, a gzip bomb or a 20 MB explanation ends as an
   ``oversized_answer`` failure, and memory stays within concurrency x that limit.
6. **Classification** (:func:`classify`): a validated answer, or a failure reason. A structured answer
   that is not JSON or breaks its schema is re-asked once (:func:`reask_messages`).

Authentication, permission and not-found errors (401/403/404) are not failures of one request but
a broken configuration that would fail every request: they raise :class:`JudgeConfigError` instead
of filling a training run with NaN rewards, and from the first one seen no request of the endpoint
starts again (every later attempt raises the same error before sending), so at most the calls
already in flight are paid.

The HTTP client is aiohttp, directly, one session per event loop: at 128+ calls in flight the
client's CPU per call bounds the judge's throughput (``docs/measurements.md``). Repeated trials of one
sampled question differ only in ``trial``, so each has its own cache entry and a resumed run asks only
for the missing ones.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import email.utils
import functools
import hashlib
import json
import logging
import math
import os
import random
import time
import weakref
import zlib
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from pydantic import BaseModel, ValidationError

from balcaprl.judge.accounting import JudgeStats
from balcaprl.judge.cache import JudgeCache, cache_key, endpoint_identity
from balcaprl.judge.config import JudgeConfig, JudgeConfigError, load_judge_config
from balcaprl.judge.images import ImageLoader, PreparedImage
from balcaprl.judge.protocol import FailureReason, JudgeFailure
from balcaprl.judge.rubrics import Rubric
from balcaprl.judge.schemas import json_response_format, schema_digest
from balcaprl.judge.tail import Hedging, assemble_stream, first_answer
from balcaprl.judge.throughput import RateWindow, Slots, auto_bound, auto_concurrency, sizing_limits
from balcaprl.judge.tokens import CompletionBudget, approx_prompt_tokens, prompt_chars

log = logging.getLogger("balcaprl.judge")

_DETAIL_CHARS = 300
RETRY_AFTER_CAP_S = 120.0  # a server asking for a longer wait is not retried at all (as the openai SDK)
_BACKOFF_FIRST_S, _BACKOFF_MAX_S = 0.5, 8.0  # the openai SDK's backoff, kept so retries pace as before
_ERROR_BODY_BYTES = 16 * 1024  # an error's body only feeds a 300-character detail


def redact(text: str, secret: str | None) -> str:
    """``text`` with every occurrence of ``secret`` replaced (API keys must not reach logs or files)."""
    if secret and len(secret) >= 4:
        text = text.replace(secret, "[REDACTED]")
    return text


def json_bytes(value: Any, **options: Any) -> bytes:
    """``value`` as UTF-8 JSON; one holding a text that is no valid Unicode (a lone surrogate, which
    UTF-8 cannot encode) goes with every non-ASCII character escaped, as ``json.dumps`` writes by default."""
    try:
        return json.dumps(value, ensure_ascii=False, **options).encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(value, **options).encode("ascii")


def messages_sha256(messages: list[dict[str, Any]]) -> str:
    """sha256 of the canonical JSON of a conversation (images included, as their data URLs)."""
    return hashlib.sha256(json_bytes(messages, sort_keys=True, separators=(",", ":"))).hexdigest()


def prompt_identity(
    rubric: Rubric, image: PreparedImage | str, max_image_side: int, **texts: Any
) -> dict[str, Any]:
    """What decides the messages of a rubric + image + texts call, for :meth:`JudgeCaller.key`'s
    ``identity``: cheaper to hash than the messages (no image bytes) and readable in a debugger.
    ``image``: the prepared image or the sha256 of its original bytes (all the key needs of it, known
    before the image is decoded: :meth:`ImageLoader.sha256`). ``rubric.reference_mode`` is "any"
    for rubrics the reference mode does not change."""
    return {
        "rubric_version": rubric.version,
        "reference_mode": rubric.reference_mode,
        "image_sha256": image if isinstance(image, str) else image.sha256,
        "max_image_side": max_image_side,
        **texts,
    }


# ----------------------------------------------------------------------------- results


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


@dataclass(frozen=True)
class CallAnswer:
    """What one endpoint call came to: ``parsed`` or ``failure``; ``content`` kept for a re-ask."""

    parsed: Any
    failure: JudgeFailure | None
    content: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def worth_reasking(self) -> bool:
        return self.failure is not None and self.failure.reason in ("invalid_json", "schema_violation")


def _fail(reason: FailureReason, detail: str, secret: str | None = None, **usage: Any) -> CallAnswer:
    return CallAnswer(None, JudgeFailure(reason, redact(detail, secret)[:_DETAIL_CHARS]), **usage)


def cached_answer(
    stored: dict[str, Any], schema: type[BaseModel] | None, check: Callable[[Any], None] | None = None
) -> Any | None:
    """A cached answer, validated again as a fresh one would be; None when it no longer validates
    (a newer schema or ``check``): the call is then made afresh."""
    try:
        if schema is None:
            value = stored.get("text")
            if not isinstance(value, str) or not value.strip():
                raise ValueError("not a text answer")
        else:
            value = schema.model_validate(stored["json"])
        if check is not None:
            check(value)
    except (KeyError, TypeError, ValueError, ValidationError):
        return None
    return value


# ----------------------------------------------------------------------------- the caller


class JudgeCaller:
    """Calls to the endpoint of a judge config (see the module docstring).

    ``config``: a :class:`JudgeConfig`, a YAML path or a mapping. ``cache``: a :class:`JudgeCache` to
    share (left open for its owner); by default the one ``config.cache_path`` names (none when that is
    null), closed with the caller. ``image_root``: where :attr:`images` resolves relative paths (and
    which paths may not leave). ``endpoint``: share an existing endpoint (its connections, limits and
    coalescing) instead of opening a new one; ``http_client``: an ``aiohttp.ClientSession`` to send
    through (its owner closes it). Use ``async with`` or call :meth:`aclose`.
    """

    def __init__(
        self,
        config: JudgeConfig | Path | str | dict[str, Any],
        *,
        cache: JudgeCache | None = None,
        image_root: Path | str | None = None,
        http_client: aiohttp.ClientSession | None = None,
        endpoint: Endpoint | None = None,
    ):
        cfg = config if isinstance(config, JudgeConfig) else load_judge_config(config)
        self.config = cfg
        self.endpoint = endpoint if endpoint is not None else Endpoint(cfg, session=http_client)
        self._owns_endpoint = endpoint is None
        self._owns_cache = cache is None
        if cache is None and cfg.cache_path is not None:
            cache = JudgeCache(cfg.cache_path)
        self.cache: JudgeCache | None = cache
        self.images = ImageLoader(cfg.max_image_side, root=image_root)
        self.stats = JudgeStats()

    def __repr__(self) -> str:  # never the key
        return f"JudgeCaller(base_url={self.config.base_url!r}, model={self.config.model!r})"

    # ----------------------------------------------------------------------------- keys and cache

    def key(
        self,
        kind: str,
        *,
        messages: list[dict[str, Any]] | None = None,
        identity: dict[str, Any] | None = None,
        schema: type[BaseModel] | None = None,
        temperature: float | None,
        max_tokens: int | None = None,
        trial: int | None = None,
        extra_body: dict[str, Any] | None = None,
    ) -> str:
        """The cache key of a call (:func:`~balcaprl.judge.cache.cache_key` with this config's endpoint
        and model). ``identity`` (what determines the messages, e.g. :func:`prompt_identity`) stands in
        for the messages' hash when a caller wants to look a call up before building its messages, or to
        skip hashing an image; give one of the two."""
        if (messages is None) == (identity is None):
            raise ValueError("give exactly one of `messages` and `identity`")
        cfg = self.config
        return cache_key(
            kind,
            endpoint=endpoint_identity(cfg.base_url),
            model=cfg.model,
            temperature=temperature,
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
        return None if not value else cached_answer(value, None)

    # ----------------------------------------------------------------------------- calls

    async def call_json(
        self,
        messages: list[dict[str, Any]],
        schema: type[BaseModel],
        *,
        kind: str,
        temperature: float | None,
        max_tokens: int | None = None,
        trial: int | None = None,
        identity: dict[str, Any] | None = None,
        check: Callable[[Any], None] | None = None,
        extra_body: dict[str, Any] | None = None,
        token_field: str = "max_completion_tokens",
    ) -> CallResult:
        """A structured answer validated against ``schema`` (strict json_schema ``response_format``
        named ``balcaprl_<kind>``). ``check(value)`` may raise ``ValueError`` for answers that
        validate but cannot be used; both are schema violations, re-asked once. ``temperature``:
        None omits it (the server's default). Counted as one request in :attr:`stats`."""
        result = await self.call(
            messages, kind=kind, schema=schema, check=check, temperature=temperature,
            max_tokens=max_tokens, trial=trial, identity=identity, extra_body=extra_body,
            token_field=token_field,
        )  # fmt: skip
        return self._counted(result)

    async def call_text(
        self,
        messages: list[dict[str, Any]],
        *,
        kind: str,
        temperature: float | None,
        max_tokens: int | None = None,
        trial: int | None = None,
        identity: dict[str, Any] | None = None,
        accept: Callable[[str], None] | None = None,
        extra_body: dict[str, Any] | None = None,
        truncated_ok: bool = False,
        token_field: str = "max_completion_tokens",
        max_retries: int | None = None,
        encode: Callable[[dict[str, Any]], bytes] | None = None,
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
            token_field=token_field, max_retries=max_retries, encode=encode,
        )  # fmt: skip
        return self._counted(result)

    async def call_texts(
        self,
        messages: list[dict[str, Any]],
        n: int,
        *,
        kind: str,
        temperature: float | None,
        max_tokens: int | None = None,
        trial: int | None = None,
        token_field: str = "max_completion_tokens",
        encode: Callable[[dict[str, Any]], bytes] | None = None,
    ) -> CallResult:
        """``n`` free-text samples in one request (``"n": n`` in the body, as a benchmark's official
        script asks for them): ``value`` is the list of the answer's choices' texts, stripped, a choice
        without text as ``""`` (a cut-off choice is kept); an endpoint that ignores ``n`` gives fewer.
        No re-ask. Counted as one request in :attr:`stats`."""
        cfg = self.config
        max_tokens = max_tokens or cfg.max_tokens
        key = self.key(kind, messages=messages, temperature=temperature, max_tokens=max_tokens, trial=trial,
                       extra_body={"n": n})  # fmt: skip

        async def compute() -> CallResult:
            stored = self.cache.get(key) if self.cache is not None else None
            texts = stored.get("texts") if isinstance(stored, dict) else None
            if isinstance(texts, list) and texts and all(isinstance(t, str) for t in texts):
                return CallResult(texts, None, key, cached=True)
            body: dict[str, Any] = {"model": cfg.model, "messages": messages, token_field: max_tokens}
            if temperature is not None:
                body["temperature"] = temperature
            body["n"] = n
            read = functools.partial(_choice_texts, secret=self.endpoint.api_key, where=cfg.base_url)
            answer = await self.endpoint.send(body, self.stats, read, None, encode)
            paid = {
                "calls": 1,
                "prompt_tokens": answer.prompt_tokens,
                "completion_tokens": answer.completion_tokens,
            }
            if answer.failure is not None:
                return CallResult(None, answer.failure, key, **paid)
            if self.cache is not None:
                self.cache.put(key, {"texts": answer.parsed, "kind": kind, "model": cfg.model})
            return CallResult(answer.parsed, None, key, **paid)

        result, shared = await self.endpoint.coalesce(key, compute)
        if shared:
            result = CallResult(result.value, result.failure, key, cached=result.cached, shared=True)
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
        temperature: float | None,
        schema: type[BaseModel] | None = None,
        check: Callable[[Any], None] | None = None,
        identity: dict[str, Any] | None = None,
        max_tokens: int | None = None,
        trial: int | None = None,
        extra_body: dict[str, Any] | None = None,
        truncated_ok: bool = False,
        stats: JudgeStats | None = None,
        token_field: str = "max_completion_tokens",
        max_retries: int | None = None,
        encode: Callable[[dict[str, Any]], bytes] | None = None,
    ) -> CallResult:
        """The one call path (see the module docstring): a ``schema`` instance, or with ``schema=None``
        the answer's text. The endpoint calls it makes are recorded in ``stats`` (default
        :attr:`stats`); the request itself is not counted (see :meth:`call_json`).

        ``messages`` may be a function that builds them, together with an ``identity``: it is called
        only when a call is made (a cache hit or a shared call never needs the messages).

        ``token_field``: the name the answer's token budget goes under; ``max_tokens`` where a
        benchmark's official request sends that older name (a server may read only one of them).
        ``max_retries``: this call's retries of a failed attempt (default: the config's); 0 where a
        benchmark's official script counts every HTTP error as one of its own tries. ``encode``: the
        body's bytes (default :func:`json_bytes`); a benchmark's official client's layout, where the
        request must be the official one byte for byte."""
        if callable(messages) and identity is None:
            raise ValueError("messages given as a function need an `identity` for the cache key")
        cfg = self.config
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
                value = cached_answer(stored, schema, check)
                if value is not None:
                    return CallResult(value, None, key, cached=True)
                log.warning("judge cache: a stored %s answer no longer validates; asking again", kind)
            conversation = messages() if callable(messages) else messages
            body = {"model": cfg.model, "messages": conversation, token_field: max_tokens}
            if schema is not None:
                body["response_format"] = json_response_format(schema, kind)
            if temperature is not None:
                body["temperature"] = temperature
            body.update(extra_body or {})
            read = functools.partial(
                classify, schema=schema, check=check, max_tokens=max_tokens, truncated_ok=truncated_ok,
                secret=self.endpoint.api_key, where=cfg.base_url,
            )  # fmt: skip
            answer = await self.endpoint.send(body, stats, read, max_retries, encode)
            calls, tokens = 1, [answer.prompt_tokens, answer.completion_tokens]
            # A structured answer that is broken is re-asked once; a free-text one only when `check`
            # rejected what it said (an empty text answer is a failure at once).
            if answer.worth_reasking and (schema is not None or answer.content is not None):
                stats.reasks += 1
                body = {**body, "messages": reask_messages(conversation, answer)}
                answer = await self.endpoint.send(body, stats, read, max_retries, encode)
                calls, tokens = 2, [tokens[0] + answer.prompt_tokens, tokens[1] + answer.completion_tokens]
            paid = {"calls": calls, "prompt_tokens": tokens[0], "completion_tokens": tokens[1]}
            if answer.failure is not None:
                log.debug(
                    "judge: %s call failed: %s (%s)", kind, answer.failure.reason, answer.failure.detail
                )
                return CallResult(None, answer.failure, key, **paid)
            if self.cache is not None:
                value = (
                    {"text": answer.parsed}
                    if schema is None
                    else {"json": answer.parsed.model_dump(mode="json")}
                )
                self.cache.put(key, {**value, "kind": kind, "model": cfg.model})
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


def reask_messages(messages: list[dict[str, Any]], answer: CallAnswer) -> list[dict[str, Any]]:
    """The conversation for the one re-ask: the rejected answer, then what was wrong with it."""
    assert answer.failure is not None
    extra: list[dict[str, Any]] = []
    if answer.content:
        extra.append({"role": "assistant", "content": answer.content[:8000]})
    extra.append(
        {
            "role": "user",
            "content": f"That answer cannot be used ({answer.failure.reason}: {answer.failure.detail}). "
            "Judge the same material again and reply with only the JSON object in the required format.",
        }
    )
    return [*messages, *extra]


# ----------------------------------------------------------------------------- the endpoint


def answer_byte_limit(max_tokens: int) -> int:
    """The most bytes an answer may have, read or decompressed: 64 KiB for the JSON around the text,
    and 64 bytes per completion token the call allows (a token is a few characters; JSON may escape
    each as ``\\uXXXX``). 320 KiB at the default 4,096 tokens: at 256 calls in flight, 80 MiB at most."""
    return 64 * 1024 + 64 * max_tokens


class AttemptFailed(Exception):
    """An attempt that ended without an answer to classify: its failure, whether another attempt may
    succeed (``retry``), and the wait the server asked for."""

    def __init__(
        self, answer: CallAnswer, *, retry: bool, retry_after_s: float | None = None, status: int = 0
    ):
        super().__init__(answer.failure)
        self.answer, self.retry, self.retry_after_s, self.status = answer, retry, retry_after_s, status


@dataclass
class _Runtime:
    """What belongs to one event loop: the HTTP session, the asyncio primitives, the limiters."""

    loop: asyncio.AbstractEventLoop
    session: aiohttp.ClientSession
    slots: Slots
    rpm: RateWindow | None
    tpm: RateWindow | None
    in_flight: dict[str, asyncio.Future] = field(default_factory=dict)
    completion_budget: CompletionBudget = field(default_factory=CompletionBudget)
    hedging: Hedging | None = None  # tail.py: when an attempt gets a duplicate (None: hedge off)


class Endpoint:
    """One OpenAI-compatible endpoint as a :class:`JudgeConfig` describes it: its API key, its HTTP
    session, the concurrency bound, the rate limiters and the calls in flight.

    Bound to whichever event loop uses it: a new loop gets a fresh session and asyncio primitives
    (both belong to one loop). ``session``: an ``aiohttp.ClientSession`` to send through instead of
    its own (its owner closes it).
    """

    def __init__(self, config: JudgeConfig, *, session: aiohttp.ClientSession | None = None):
        self.config = config
        self.api_key = config.resolve_api_key()
        self.url = config.base_url.rstrip("/") + "/chat/completions"
        self.headers = {"Authorization": f"Bearer {self.api_key}", "Accept-Encoding": "gzip, deflate"}
        # what the openai SDK sent from the environment, so switching from it changes nothing upstream
        for header, variable in (
            ("OpenAI-Organization", "OPENAI_ORG_ID"),
            ("OpenAI-Project", "OPENAI_PROJECT_ID"),
        ):
            if os.environ.get(variable):
                self.headers[header] = os.environ[variable]
        self._session = session
        self.state: _Runtime | None = None
        self.rejected: str | None = None  # the first 401/403/404 seen: no request starts after it
        self.streams: bool | None = None  # whether the server streams when asked (None: not seen yet)
        self._finalizer: weakref.finalize | None = None  # closes a session left open (see retire)

    def runtime(self) -> _Runtime:
        loop = asyncio.get_running_loop()
        state = self.state
        if state is not None and state.loop is loop:
            return state
        # First use, or a new event loop (asyncio.run called again): build fresh ones.
        cfg = self.config
        session = self._session
        if session is None:
            # No connection cap of aiohttp's own (its default is 100): the Slots are the bound.
            # auto_decompress off: answer_byte_limit must hold for decompressed bytes too (read_answer).
            connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
            session = aiohttp.ClientSession(
                connector=connector, auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None)
            )  # the attempt's own timeout is timeout_s (Endpoint.send)
            if self._finalizer is not None:
                self._finalizer()  # the previous loop's session
            self._finalizer = weakref.finalize(self, retire, loop, session)
        self.state = _Runtime(
            loop=loop,
            session=session,
            # concurrency: auto -- a bound that follows the rate limits and the observed latency
            slots=Slots(auto_bound(cfg) if cfg.concurrency_auto else cfg.concurrency),
            rpm=RateWindow(cfg.requests_per_minute) if cfg.requests_per_minute else None,
            tpm=RateWindow(cfg.tokens_per_minute) if cfg.tokens_per_minute else None,
            hedging=Hedging(cfg.hedge_quantile, cfg.hedge_floor_s, cfg.hedge_max_share)
            if cfg.hedge
            else None,
        )
        return self.state

    async def coalesce(self, key: str, compute: Callable[[], Awaitable[Any]]) -> tuple[Any, bool]:
        """``(value, shared)``: ``compute()``, unless a call with this key is in flight on this loop,
        whose value (or exception) is then shared."""
        in_flight = self.runtime().in_flight
        waiting = in_flight.get(key)
        if waiting is not None:
            return await asyncio.shield(waiting), True
        future = asyncio.get_running_loop().create_future()
        in_flight[key] = future
        try:
            value = await compute()
            future.set_result(value)
            return value, False
        except BaseException as error:
            future.set_exception(error)
            future.exception()  # mark it retrieved: only waiters (if any) re-raise it
            raise
        finally:
            del in_flight[key]

    def estimate_tokens(self, messages: list[dict[str, Any]]) -> int:
        """The prompt tokens the token limiter budgets for ``messages`` (every image at most
        ``max_image_side`` on each side, at the model's image rate: see :mod:`balcaprl.judge.tokens`)."""
        return approx_prompt_tokens(messages, self.config.max_image_side, self.config.model)

    async def send(
        self, body: dict[str, Any], stats: JudgeStats, read: Callable[[int, bytes], CallAnswer],
        max_retries: int | None = None,
        encode: Callable[[dict[str, Any]], bytes] | None = None,
    ) -> CallAnswer:  # fmt: skip
        """One call of a chat-completions ``body``: attempts, each admitted by the limits
        (:meth:`_admitted`), until one is final or ``max_retries`` retries (default: the config's)
        are spent, with the backoff between them outside the concurrency bound; ``read(status,
        body)`` classifies an answer (:func:`classify`). Recorded in ``stats`` (latency: retries
        included). ``encode``: how the body becomes bytes (default :func:`json_bytes`)."""
        runtime = self.runtime()
        cfg = self.config
        retries = cfg.max_retries if max_retries is None else max_retries
        # n answers in one (a benchmark's official `n`): n times the tokens and bytes of one
        max_tokens = (body.get("max_completion_tokens") or body["max_tokens"]) * int(body.get("n") or 1)
        # Streamed, so the first byte is the first token (tail.py); never a body whose bytes are a
        # benchmark's official request (``encode``), sent as its official client sends it, nor one
        # asking for n answers (tail.assemble_stream puts one choice back together).
        if cfg.stream and self.streams is not False and encode is None and int(body.get("n") or 1) == 1:
            body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        payload = (encode or json_bytes)(body)  # once, for every attempt
        # What a call really uses: its prompt at the model's image rate and a realistic answer
        # (reserving the whole max_tokens paced the client at a fraction of its budget).
        tokens = self.estimate_tokens(body["messages"]) + runtime.completion_budget.reserve(max_tokens)
        size = prompt_chars(body["messages"])  # what its answer's decode time grows with (tail.py)
        ticket = runtime.hedging.begin(size) if runtime.hedging is not None else None
        start = time.perf_counter()
        for retry in range(retries + 1):
            try:
                status, raw = await self._admitted(
                    runtime, payload, max_tokens, body, tokens, stats, ticket, size, first=retry == 0
                )
                answer = read(status, raw)
                break
            except AttemptFailed as failed:
                answer, wait = failed.answer, failed.retry_after_s
                if not failed.retry:
                    break
            except TimeoutError:
                answer = _fail("timeout", f"no answer within timeout_s ({cfg.timeout_s:g} s) per attempt")
                wait = None
            except aiohttp.ClientError as error:  # refused, reset, dropped mid-body
                detail = f"{type(error).__name__}: connection failed or dropped ({error})"
                answer, wait = _fail("server_error", detail, self.api_key), None
            if retry == retries or (wait is not None and wait > RETRY_AFTER_CAP_S):
                break
            await asyncio.sleep(backoff_s(retry, wait))  # holding no slot
        stats.record_call(time.perf_counter() - start, answer.prompt_tokens, answer.completion_tokens)
        runtime.completion_budget.observe(answer.completion_tokens)
        return answer

    def _refuse_if_rejected(self) -> None:
        if self.rejected is not None:
            raise JudgeConfigError(self.rejected)

    async def _admit(self, runtime: _Runtime, tokens: int) -> None:
        """Wait until the rate limits admit one more request of ``tokens`` budgeted tokens."""
        if runtime.rpm is not None:
            await runtime.rpm.acquire(1)
        if runtime.tpm is not None:
            await runtime.tpm.acquire(tokens)

    def _spare(self, runtime: _Runtime, tokens: int) -> Callable[[], None] | None:
        """A hedge admitted now, or None: a free slot and room in both rate limits (a duplicate never
        waits: one that must wait would only take the budget of first attempts)."""
        slots = runtime.slots
        limits = [(w, n) for w, n in ((runtime.rpm, 1), (runtime.tpm, tokens)) if w is not None]
        if self.rejected is not None or slots.in_use >= slots.allowed:
            return None
        if not all(window.has_room(amount) for window, amount in limits):
            return None
        for window, amount in limits:
            window.take(amount)
        slots.in_use += 1

        def release() -> None:
            slots.in_use -= 1

        return release

    async def _admitted(
        self,
        runtime: _Runtime,
        payload: bytes,
        max_tokens: int,
        body: dict[str, Any],
        tokens: int,
        stats: JudgeStats,
        ticket: Any,
        size: int,
        *,
        first: bool,
    ) -> tuple[int, bytes]:
        """One attempt: a slot of the concurrency bound, then the rate limits (so a request starts as
        soon as it is admitted, and no window holds more starts than its limit), then the exchange."""
        cfg = self.config
        slots = runtime.slots
        if cfg.concurrency_auto:
            rpm, tpm = sizing_limits(cfg)
            slots.limit = auto_concurrency(rpm, tpm, tokens, slots.latency_s(), auto_bound(cfg))
        self._refuse_if_rejected()
        async with slots:
            self._refuse_if_rejected()
            await self._admit(runtime, tokens)
            started = time.perf_counter()
            try:
                result = await self._attempt_hedged(
                    runtime,
                    payload,
                    max_tokens,
                    body["messages"],
                    stats,
                    tokens,
                    ticket,
                    size,
                    bool(body.get("stream")),
                )
            except AttemptFailed as failed:
                slots.timed_out(
                    failed.answer.failure is not None and failed.answer.failure.reason == "timeout"
                )
                raise
            except TimeoutError:
                slots.timed_out(True)
                raise
            slots.timed_out(False)
            slots.answered()
            if first:  # auto's latency: the endpoint's, not a retry's wait
                slots.observe(time.perf_counter() - started)
            return result

    async def _attempt_hedged(
        self,
        runtime: _Runtime,
        payload: bytes,
        max_tokens: int,
        messages: list[dict[str, Any]],
        stats: JudgeStats,
        tokens: int,
        ticket: Any,
        size: int,
        asks_stream: bool,
    ) -> tuple[int, bytes]:
        """One attempt, each copy under ``timeout_s`` as a whole (it holds against a trickle), with a
        duplicate when it stalls (:func:`~balcaprl.judge.tail.first_answer`), itself admitted by the
        limits (:meth:`_spare`)."""

        async def deadlined(on_first_byte: Callable[[], None]) -> tuple[int, bytes]:
            try:
                async with asyncio.timeout(self.config.timeout_s):
                    return await self.attempt(
                        runtime.session,
                        payload,
                        max_tokens,
                        on_first_byte=on_first_byte,
                        asks_stream=asks_stream,
                    )
            except AttemptFailed as failed:
                # A 429 to either copy is the endpoint's word on the load (a losing copy's was lost).
                if failed.status == 429:
                    runtime.slots.throttled()
                raise

        def hedged(won: bool) -> None:
            stats.record_hedge(won, self.estimate_tokens(messages))

        return await first_answer(
            deadlined,
            runtime.hedging,
            hedged,
            spare=lambda: self._spare(runtime, tokens),
            ticket=ticket,
            size=size,
        )

    async def attempt(
        self,
        session: aiohttp.ClientSession,
        payload: bytes,
        max_tokens: int,
        on_first_byte: Callable[[], None] = lambda: None,
        asks_stream: bool = False,
    ) -> tuple[int, bytes]:
        """One HTTP exchange: ``(status, body)``, the body read up to its limit (an error's
        to 16 KiB). Raises ``aiohttp.ClientError`` (the connection), ``TimeoutError``, or
        :class:`AttemptFailed` (an oversized or undecodable body; a status worth another attempt; no
        first byte within ``first_byte_timeout_s``, or a silence longer than ``chunk_gap_timeout_s``).
        A streamed answer comes back as the chat completion it stands for."""
        cfg = self.config
        headers = {**self.headers, "Content-Type": "application/json"}
        response = None
        self._refuse_if_rejected()  # the last check before a request starts (hedges included)
        # The first-byte limit where the first byte is the first token (a server seen to stream), or
        # where streaming is off by choice; never for a server that answers streamed requests whole.
        limited = self.streams if asks_stream else not cfg.stream
        first_byte_s = cfg.first_byte_timeout_s if limited else None
        try:
            async with asyncio.timeout(first_byte_s):  # None: no limit of its own
                response = await session.post(self.url, data=payload, headers=headers)
                if response.status in (401, 403, 404) and self.rejected is None:
                    self.rejected = rejection(response.status, cfg.base_url)
                first = await response.content.readany()
        except BaseException as error:  # cancelled (a hedge won), timed out, dropped: free the connection
            if response is not None:
                response.close()
            if not isinstance(error, TimeoutError):
                raise
            raise AttemptFailed(
                _fail("timeout", f"no first byte within first_byte_timeout_s ({first_byte_s:g} s)"),
                retry=True,
            ) from None
        on_first_byte()
        async with response:
            status = response.status
            streamed = response.headers.get("Content-Type", "").startswith("text/event-stream")
            if status == 200 and asks_stream:
                self.streams = streamed  # a server that answers a streamed request whole: ask it unstreamed
            # A stream repeats its envelope for every token: a few hundred bytes a token, not 64.
            limit = (
                answer_byte_limit(max_tokens * (8 if streamed else 1)) if status < 400 else _ERROR_BODY_BYTES
            )
            raw = await read_answer(
                response, limit, truncate=status >= 400, first=first, gap_s=cfg.chunk_gap_timeout_s
            )
            if streamed and status < 400:
                raw = assemble_stream(raw)
            if status >= 400 and _should_retry(status, response.headers):
                failure = status_failure(status, raw, self.api_key, self.config.base_url)
                wait = _retry_after_s(response.headers)
                raise AttemptFailed(failure, retry=True, retry_after_s=wait, status=status)
            return status, raw

    def rewards_wanted_at(self, when: float | None) -> None:
        """The trainer's deadline for this loop's calls (``time.perf_counter``; None: none now), for
        the hedging's critical path (:meth:`~balcaprl.judge.tail.Hedging.wanted_by`). On the loop."""
        hedging = self.runtime().hedging
        if hedging is not None:
            hedging.wanted_by(when)

    async def aclose(self) -> None:
        if self._finalizer is not None:
            self._finalizer.detach()  # closed here, not by the finalizer
            self._finalizer = None
        state, self.state = self.state, None
        if state is None or self._session is not None:
            return
        # On its own loop, which may be another one (a trainer's reward loop, closed from the main
        # thread): a session closed elsewhere logs "Unclosed client session".
        pending = retire(state.loop, state.session)
        if pending is not None and state.loop.is_running():
            await asyncio.wrap_future(pending)


def _final(reason: FailureReason, detail: str) -> AttemptFailed:
    return AttemptFailed(_fail(reason, detail), retry=False)


async def _chunks(response: aiohttp.ClientResponse, first: bytes, gap_s: float | None):
    """The body's chunks as they arrive (``first``: one already read), each within ``gap_s`` of the
    one before (:class:`AttemptFailed` ``timeout``, retried, past it)."""
    chunk = first
    while chunk:
        yield chunk
        try:
            async with asyncio.timeout(gap_s):
                chunk = await response.content.readany()
        except TimeoutError:
            failure = _fail("timeout", f"the answer stopped for more than chunk_gap_timeout_s ({gap_s:g} s)")
            raise AttemptFailed(failure, retry=True) from None


async def read_answer(
    response: aiohttp.ClientResponse,
    limit: int,
    *,
    truncate: bool = False,
    first: bytes | None = None,
    gap_s: float | None = None,
) -> bytes:
    """The body, decompressed (gzip or deflate), in chunks: at most ``limit`` bytes read and at most
    ``limit`` bytes decompressed. Past either, an ``oversized_answer`` failure (:class:`AttemptFailed`,
    not retried) -- or, with ``truncate``, the first ``limit`` bytes. ``first``: the body's first
    chunk, already read; ``gap_s``: the longest wait for the next chunk (see :func:`_chunks`)."""
    declared = response.content_length
    if declared is not None and declared > limit and not truncate:
        raise _final(
            "oversized_answer", f"the answer declares {declared:,} bytes; a judge answer may have {limit:,}"
        )
    encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in ("identity", "", "gzip", "x-gzip", "deflate"):
        raise _final("invalid_json", f"the answer is in content-encoding {encoding!r}, not one asked for")
    # wbits 47: a gzip or a zlib header, told apart by the decompressor itself
    inflate = None if encoding in ("identity", "") else zlib.decompressobj(wbits=zlib.MAX_WBITS | 32)
    body, read = bytearray(), 0
    if first is None:
        first = await response.content.readany()
    async for chunk in _chunks(response, first, gap_s):
        read += len(chunk)
        if inflate is not None:
            try:
                chunk = inflate.decompress(chunk, limit + 1 - len(body))
            except zlib.error as error:
                raise _final("invalid_json", f"the answer's {encoding} body is corrupt: {error}") from None
        body += chunk
        if len(body) > limit or read > limit:
            if truncate:
                return bytes(body[:limit])
            what = "read" if read > limit else "decompressed to"
            raise _final(
                "oversized_answer",
                f"the answer {what} more than {limit:,} bytes; a judge answer may have {limit:,}",
            )
    return bytes(body)


def _should_retry(status: int, headers: Mapping[str, str]) -> bool:
    """What the openai SDK retries: the server's ``x-should-retry`` first, then 408, 409, 429, 5xx."""
    says = headers.get("x-should-retry")
    if says in ("true", "false"):
        return says == "true"
    return status in (408, 409, 429) or status >= 500


def _retry_after_s(headers: Mapping[str, str]) -> float | None:
    """The wait a server asks for: ``retry-after-ms``, ``retry-after`` in seconds or as an HTTP date."""
    for header, divisor in (("retry-after-ms", 1000), ("retry-after", 1)):
        try:
            return float(headers[header]) / divisor
        except (KeyError, ValueError):
            continue
    try:
        return email.utils.parsedate_to_datetime(headers["retry-after"]).timestamp() - time.time()
    except (KeyError, TypeError, ValueError, IndexError):
        return None


def backoff_s(retry: int, retry_after_s: float | None) -> float:
    """The wait before retry ``retry + 1``: the server's ``retry-after`` when it gives a usable one,
    else 0.5 s doubling per retry up to 8 s, less a random 0-25% (the openai SDK's schedule)."""
    if retry_after_s is not None and math.isfinite(retry_after_s) and 0 < retry_after_s <= RETRY_AFTER_CAP_S:
        return retry_after_s
    return min(_BACKOFF_FIRST_S * 2.0**retry, _BACKOFF_MAX_S) * (1 - 0.25 * random.random())


# ----------------------------------------------------------------------------- classification


def _error_message(raw: bytes) -> str:
    """The server's own message of an error body (OpenAI's ``{"error": {"message"}}``), else its text."""
    try:
        data = json.loads(raw)
        message = data["error"]["message"] if isinstance(data.get("error"), dict) else data["error"]
        return str(message)
    except (ValueError, TypeError, KeyError, AttributeError):
        return raw.decode("utf-8", "replace")


def rejection(status: int, where: str) -> str:
    """The one-line error of an endpoint that rejects the configuration (401/403/404)."""
    return (
        f"the judge endpoint {where} rejected the request with HTTP {status}: "
        "check base_url, model and the API key variable named by api_key_env"
    )


def status_failure(status: int, raw: bytes, secret: str | None, where: str) -> CallAnswer:
    """The failure an HTTP error status stands for (after retries, where it is retried)."""
    message = f"HTTP {status}: {_error_message(raw)}"
    if status in (401, 403, 404):
        raise JudgeConfigError(rejection(status, where))
    if status == 429:
        return _fail("rate_limited", f"still rate limited: {message}", secret)
    if status == 408:
        return _fail("timeout", message, secret)
    if status >= 500 or status == 409:
        return _fail("server_error", message, secret)
    return _fail("bad_input", f"the server rejected the request: {message}", secret)


_NO_CHOICE: Any = object()


def _completion_fields(raw: bytes) -> tuple[Any, str | None, str | None, dict[str, int]] | None:
    """``(content, refusal, finish_reason, token usage)`` of a chat-completion body; None when it is
    not one; ``content`` is ``_NO_CHOICE`` without choices. Fields of the wrong type read as absent."""
    try:
        data = json.loads(raw)  # ValueError: invalid JSON or invalid UTF-8
        usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}  # AttributeError: no dict
    except (ValueError, AttributeError):
        return None
    count = {k: usage.get(k) for k in ("prompt_tokens", "completion_tokens")}
    tokens = {k: v if type(v) is int and v >= 0 else 0 for k, v in count.items()}
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return _NO_CHOICE, None, None, tokens
    message = choices[0].get("message") if isinstance(choices[0].get("message"), dict) else {}
    fields = (message.get("content"), message.get("refusal"), choices[0].get("finish_reason"))
    return (*(v if isinstance(v, str) else None for v in fields), tokens)


def _choice_texts(status: int, raw: bytes, *, secret: str | None, where: str) -> CallAnswer:
    """A chat completion with several choices (``n``): ``parsed`` is each choice's text, stripped
    (``""`` for a choice without text); a body without choices is ``invalid_json``."""
    if status >= 400:
        return status_failure(status, raw, secret, where)
    fields = _completion_fields(raw)
    if fields is None or fields[0] is _NO_CHOICE:
        return _fail("invalid_json", "the answer has no choices", secret, **(fields[3] if fields else {}))
    choices = json.loads(raw)["choices"]
    texts = []
    for choice in choices:
        message = choice.get("message") if isinstance(choice, dict) else None
        content = message.get("content") if isinstance(message, dict) else None
        texts.append(content.strip() if isinstance(content, str) else "")
    return CallAnswer(texts, None, None, **fields[3])


def _schema_failure(error: ValidationError) -> tuple[FailureReason, str]:
    """A schema's length bounds (:mod:`balcaprl.judge.schemas`) broken: ``oversized_answer``, not worth
    a re-ask; anything else: ``schema_violation``."""
    problems = error.errors()
    detail = "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or '<answer>'}: {e['msg']}" for e in problems[:5]
    )
    too_long = any(e["type"] in ("too_long", "string_too_long") for e in problems)
    return ("oversized_answer" if too_long else "schema_violation"), detail[:_DETAIL_CHARS]


def classify(
    status: int,
    raw: bytes,
    *,
    schema: type[BaseModel] | None,
    check: Callable[[Any], None] | None,
    max_tokens: int,
    truncated_ok: bool,
    secret: str | None,
    where: str,
) -> CallAnswer:
    """What an HTTP answer comes to. With ``schema`` it must be a JSON object that validates against
    it (``parsed`` is the model instance); without, it is free text (``parsed``: the stripped string).
    ``check`` may raise ``ValueError`` for answers that parse but are still unusable (a schema
    violation too, worth one re-ask, like invalid JSON). ``truncated_ok``: a free-text answer cut off
    at ``max_tokens`` is kept (e.g. a letter followed by an explanation nobody asked for) instead of
    failing as ``truncated_output``."""
    if status >= 400:
        return status_failure(status, raw, secret, where)
    fields = _completion_fields(raw)
    if fields is None:
        return _fail("invalid_json", "the answer is not a chat completion", secret)
    content, refusal, finish_reason, tokens = fields
    if content is _NO_CHOICE:
        return _fail("invalid_json", "the answer has no choices", secret, **tokens)
    keep_cut = truncated_ok and schema is None and bool(content and content.strip())
    if finish_reason == "length" and not keep_cut:
        return _fail(
            "truncated_output", f"the answer hit max_tokens ({max_tokens}) and was cut off", secret, **tokens
        )
    if finish_reason == "content_filter":
        return _fail("refused", "the answer was stopped by the server's content filter", secret, **tokens)
    if refusal:
        return _fail("refused", f"the judge refused: {refusal}", secret, **tokens)
    if not content or not content.strip():
        return _fail("invalid_json", "the answer is empty", secret, **tokens)
    if schema is None:
        parsed: Any = content.strip()
    else:
        try:
            data = json.loads(content)
        except json.JSONDecodeError as error:
            return CallAnswer(None, JudgeFailure("invalid_json", f"not JSON: {error}"), content, **tokens)
        try:
            parsed = schema.model_validate(data)
        except ValidationError as error:
            reason, detail = _schema_failure(error)
            return CallAnswer(None, JudgeFailure(reason, detail), content, **tokens)
    if check is not None:
        try:
            check(parsed)
        except ValueError as error:
            return CallAnswer(
                None, JudgeFailure("schema_violation", str(error)[:_DETAIL_CHARS]), content, **tokens
            )
    return CallAnswer(parsed, None, content, **tokens)


# ----------------------------------------------------------------------------- closing sessions
# An aiohttp session belongs to one event loop, and one garbage-collected unclosed logs an error
# ("Unclosed client session"), e.g. after `asyncio.run(judge.judge_batch(...))` without `aclose`, or
# when the judge moves to a new loop. `retire` closes such a session: at once when its loop has ended
# (nothing is left to wait for: the loop's connections ended with it), else on its loop.


def _run_to_end(coroutine: Coroutine[Any, Any, None]) -> None:
    """Run a coroutine that has nothing to wait for, without a loop; give up if it does wait."""
    try:
        coroutine.send(None)
    except StopIteration:
        return
    coroutine.close()


def retire(
    loop: asyncio.AbstractEventLoop, session: aiohttp.ClientSession
) -> concurrent.futures.Future | None:
    """Close ``session`` of ``loop`` from anywhere (a new loop, a finalizer, exit); returns the pending
    close when it was scheduled on ``loop``, None when it is already done."""
    if loop.is_closed():
        _run_to_end(session.close())
        return None
    return asyncio.run_coroutine_threadsafe(session.close(), loop)
