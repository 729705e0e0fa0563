"""The verdict cache: stdlib sqlite3 in WAL mode, JSON values, sha256 keys.

Why sqlite: one file, safe for several processes (trainer ranks, a `balcaprl score` next to a
training run) thanks to its locking, and atomic per transaction, so a process killed with `kill -9`
mid-write leaves either the whole row or nothing. WAL lets readers proceed while one process writes.
``synchronous=NORMAL`` keeps commits cheap; in WAL mode it is still durable across process crashes
and can only lose the last commits on a power cut (a lost verdict is simply judged again).

Why JSON and not pickle: a cache file may be shared or downloaded; unpickling it would run code.
Only successful verdicts are stored; failures are never cached, so a retry can succeed later.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["JudgeCache", "cache_key"]

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS judge_cache (
    key     TEXT PRIMARY KEY,
    value   TEXT NOT NULL,
    created REAL NOT NULL
)
"""


def cache_key(**parts: Any) -> str:
    """sha256 of the canonical JSON of ``parts`` (model, rubric version, image hash, texts, sampling...)."""
    canonical = json.dumps(parts, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


class JudgeCache:
    """A key -> JSON-object store in one sqlite file. Thread-safe; safe across processes.

    Use as a context manager or call :meth:`close`.
    """

    def __init__(self, path: Path | str, busy_timeout_s: float = 60.0):
        self.path = Path(path).expanduser()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(
                self.path, timeout=busy_timeout_s, check_same_thread=False, isolation_level=None
            )
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute(_SCHEMA)
        except sqlite3.Error as error:
            raise OSError(
                f"judge cache {self.path} cannot be opened ({error}); fix the path or permissions, "
                "or disable the cache (cache_path: null / --no-cache)"
            ) from None
        self._lock = threading.Lock()

    def get(self, key: str) -> dict[str, Any] | None:
        """The stored object, or None when absent (or unreadable, which is logged and treated as absent)."""
        with self._lock:
            row = self._db.execute("SELECT value FROM judge_cache WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        try:
            value = json.loads(row[0])
        except json.JSONDecodeError:
            log.warning("judge cache %s: row %s is not valid JSON; ignoring it", self.path, key[:12])
            return None
        return value if isinstance(value, dict) else None

    def put(self, key: str, value: dict[str, Any]) -> None:
        """Store ``value`` (JSON-serialisable) under ``key``, replacing any older value, atomically."""
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO judge_cache (key, value, created) VALUES (?, ?, ?)",
                (key, text, time.time()),
            )

    def __len__(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM judge_cache").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> JudgeCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
