"""One configured OpenAI-compatible endpoint: the SDK clients, the concurrency bound, the rate limits.

:class:`Endpoint` holds what a :class:`~balcaprl.judge.config.JudgeConfig` describes -- the API key,
the SDK clients (their retries, backoff and timeouts), the concurrency semaphore, the request/token
rate limiters and the coalescing of identical calls in flight -- and makes single calls under them
(:meth:`Endpoint.send`). Everything bound to an event loop is rebuilt when a new loop uses it.
Every call of the package goes through one (via :class:`~balcaprl.judge.calls.JudgeCaller`).
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import openai
from aiolimiter import AsyncLimiter
from pydantic import BaseModel

from balcaprl.judge.accounting import JudgeStats
from balcaprl.judge.config import JudgeConfig
from balcaprl.judge.connections import http_client, retire
from balcaprl.judge.inflight import InFlight
from balcaprl.judge.tokens import CompletionBudget, approx_prompt_tokens
from balcaprl.judge.transport import CallAnswer, call_endpoint

__all__ = ["Endpoint"]

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
    completion_budget: CompletionBudget = field(default_factory=CompletionBudget)

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

    async def coalesce(self, key: str, compute: Callable[[], Awaitable[Any]]) -> tuple[Any, bool]:
        """``(value, shared)``: ``compute()``, unless a call with this key is in flight on this loop,
        whose value is then shared (see :mod:`balcaprl.judge.inflight`)."""
        return await self.runtime().inflight.run(key, compute)

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
            # What a call really uses: its prompt at the model's image rate and a realistic answer
            # (reserving the whole max_tokens paced the client at a fraction of its budget).
            reserve = runtime.completion_budget.reserve(max_tokens)
            await runtime.tpm.acquire(min(self.estimate_tokens(messages) + reserve, cfg.tokens_per_minute))
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
        runtime.completion_budget.observe(answer.completion_tokens)
        return answer

    def estimate_tokens(self, messages: list[dict[str, Any]]) -> int:
        """The prompt tokens the token limiter budgets for ``messages`` (every image at most
        ``max_image_side`` on each side, at the model's image rate: see :mod:`balcaprl.judge.tokens`)."""
        return approx_prompt_tokens(messages, self.config.max_image_side, self.config.model)

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
