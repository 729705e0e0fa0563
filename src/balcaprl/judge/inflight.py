"""Coalescing of identical requests in flight: the first caller computes, the others await its result.

Why: the G rollouts of a prompt often contain identical captions (short or collapsed policies), TRL
calls each reward function separately on the same completions, and in cached-reference mode all G
rollouts need the same reference decomposition at the same moment. One call serves them all.
Bound to one event loop (it holds asyncio futures).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["InFlight"]


class InFlight:
    """``await inflight.run(key, compute)`` -> ``(value, shared)``; ``shared`` is True for a caller
    that got another caller's result. An exception reaches every caller of that key."""

    def __init__(self) -> None:
        self._futures: dict[str, asyncio.Future] = {}

    def __len__(self) -> int:
        return len(self._futures)

    async def run(self, key: str, compute: Callable[[], Awaitable[Any]]) -> tuple[Any, bool]:
        waiting = self._futures.get(key)
        if waiting is not None:
            return await asyncio.shield(waiting), True
        future = asyncio.get_running_loop().create_future()
        self._futures[key] = future
        try:
            value = await compute()
            future.set_result(value)
            return value, False
        except BaseException as error:
            future.set_exception(error)
            future.exception()  # mark it retrieved: only waiters (if any) re-raise it
            raise
        finally:
            del self._futures[key]
