"""A blocking facade over any async :class:`Judge`, for callers without an event loop.

Why a dedicated loop thread instead of ``asyncio.run`` per call: the judge's HTTP connection pool and
its asyncio primitives belong to one event loop; a fresh loop per batch would rebuild them every
step (new TLS handshakes) and cannot work at all inside an already running loop (Jupyter, some
trainers). The facade owns one loop on a daemon thread and submits each batch to it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Sequence
from typing import Any

from balcaprl.judge.protocol import Judge, JudgeOutcome, JudgeRequest


class SyncJudge:
    """``SyncJudge(judge).judge_batch(requests)`` blocks and returns the outcomes.

    Thread-safe: several threads may submit batches; they run concurrently on the one loop (and share
    the judge's coalescing and limits). Close it (or use ``with``) to stop the loop thread.
    """

    def __init__(self, judge: Judge):
        self.judge = judge
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="balcaprl-sync-judge", daemon=True
        )
        self._thread.start()

    def _check_open(self) -> None:
        if self._loop.is_closed():
            raise RuntimeError("this SyncJudge is closed; create a new one")

    def _run(self, coroutine: Any, timeout: float | None) -> Any:
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()  # do not leave the batch running on the loop after giving up on it
            raise TimeoutError(
                f"the judge batch did not finish within {timeout} s; it was cancelled"
            ) from None

    def judge_batch(
        self, requests: Sequence[JudgeRequest], timeout: float | None = None
    ) -> list[JudgeOutcome]:
        """One outcome per request, in order. ``timeout`` (seconds) bounds the whole batch."""
        self._check_open()
        return self._run(self.judge.judge_batch(list(requests)), timeout)

    def judge_batch_with_stats(self, requests: Sequence[JudgeRequest], timeout: float | None = None) -> Any:
        """Outcomes and accounting, for judges that offer ``judge_batch_with_stats``."""
        self._check_open()
        method = getattr(self.judge, "judge_batch_with_stats", None)
        if method is None:
            raise TypeError(f"{type(self.judge).__name__} has no judge_batch_with_stats; use judge_batch")
        return self._run(method(list(requests)), timeout)

    def close(self) -> None:
        """Close the judge (if it has ``aclose``) and stop the loop thread."""
        if self._loop.is_closed():
            return
        aclose = getattr(self.judge, "aclose", None)
        if aclose is not None:
            self._run(aclose(), timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop.close()

    def __enter__(self) -> SyncJudge:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
