"""The SDK's HTTP clients: which transport (``JudgeConfig.http_backend``), and closing them.

Why aiohttp is the default: at 128+ calls in flight the client's CPU per call bounds the judge's
throughput (the calls of a wave come back together and are handled one after another), and openai's
aiohttp transport costs about a third less CPU per call than its httpx one (benchmarks/bench_judge.py).
Both go through the same ``AsyncOpenAI`` (its retries, backoff and timeouts).

Why closing needs care: an aiohttp session belongs to one event loop, and one garbage-collected
unclosed logs an error ("Unclosed client session"), e.g. after ``asyncio.run(judge.judge_batch(...))``
without ``aclose``, or when the judge moves to a new loop. :func:`retire` closes such clients: at once
when their loop has ended (nothing is left to wait for: the loop's connections ended with it), else
on their loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Coroutine
from functools import cache
from typing import Any

import httpx2
import openai

from balcaprl.judge.config import JudgeConfigError

__all__ = ["http_client", "retire"]


@cache
def _shared_ssl_context() -> Any:
    return httpx2.create_ssl_context()


def http_client(backend: str) -> httpx2.AsyncClient:
    """One SDK HTTP client on ``backend`` ("httpx" or "aiohttp") with the SDK's defaults. Our own
    rather than the SDK's: they share one TLS context (building one costs ~60 ms), and unlike the SDK's
    wrapper they do not try to close themselves on whatever loop is running when garbage-collected
    (which fails loudly after a loop change)."""
    if backend == "aiohttp":
        try:
            import aiohttp  # noqa: F401  (the SDK's own check fails only on first use, less clearly)
        except ImportError:
            raise JudgeConfigError(
                "http_backend 'aiohttp' needs the aiohttp package: pip install 'openai[aiohttp]' "
                "(or set http_backend: httpx)"
            ) from None
        return openai.DefaultAioHttpClient(verify=_shared_ssl_context())
    return openai.DefaultAsyncHttpxClient(verify=_shared_ssl_context())


async def _close_all(clients: list[openai.AsyncOpenAI]) -> None:
    for client in clients:
        await client.close()


def _run_to_end(coroutine: Coroutine[Any, Any, None]) -> None:
    """Run a coroutine that has nothing to wait for, without a loop; give up if it does wait."""
    try:
        coroutine.send(None)
    except StopIteration:
        return
    coroutine.close()


def retire(
    loop: asyncio.AbstractEventLoop, clients: list[openai.AsyncOpenAI]
) -> concurrent.futures.Future | None:
    """Close aiohttp-backed ``clients`` of ``loop`` from anywhere (a new loop, a finalizer, exit);
    returns the pending close when it was scheduled on ``loop``, None when it is already done."""
    if loop.is_closed():
        _run_to_end(_close_all(clients))
        return None
    return asyncio.run_coroutine_threadsafe(_close_all(clients), loop)
