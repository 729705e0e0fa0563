"""The judge cache: stdlib sqlite3 in WAL mode, JSON values, sha256 keys (:func:`cache_key`).

Why sqlite: one file, safe for several processes (trainer ranks, a `balcaprl score` next to a
training run) thanks to its locking, and atomic per transaction, so a process killed with `kill -9`
mid-write leaves either the whole row or nothing. WAL lets readers proceed while one process writes.
``synchronous=NORMAL`` keeps commits cheap; in WAL mode it is still durable across process crashes
and can only lose the last commits on a power cut (a lost verdict is simply judged again).

Why JSON and not pickle: a cache file may be shared or downloaded; unpickling it would run code.
Only successful answers are stored; failures are never cached, so a retry can succeed later.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sqlite3
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from balcaprl.errors import OutputError

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS judge_cache (
    key     TEXT PRIMARY KEY,
    value   TEXT NOT NULL,
    created REAL NOT NULL
)
"""


_KEY_SCHEME = 2  # bumped whenever the layout below changes
_KEYS_PER_QUERY = 500  # under SQLite's oldest bound on parameters per statement (999)


def cache_key(
    kind: str,
    *,
    model: str,
    temperature: float | None,
    max_tokens: int,
    content: Mapping[str, Any],
    schema: str | None = None,
    trial: int | None = None,
    extra_body: Mapping[str, Any] | None = None,
) -> str:
    """The key of one judge call: sha256 of the canonical JSON of everything that decides its answer.

    Every call goes through here, the verdict judge's and generic ones alike. ``kind`` names the step
    (``verdict``, ``coverage``, ``reference_assertions``, ``recaption``, ``dcscore_match``...);
    ``content`` is what the messages say, given explicitly — rubric version, reference mode where it
    matters, image sha256, ``max_image_side``, the texts — or as ``{"messages_sha256": ...}`` when a
    caller has nothing better; ``schema`` identifies the answer's JSON schema (None: free text);
    ``trial`` tells repeated samples of one question apart.

    Keys made by earlier versions of this scheme are never produced again: a cache file written by
    them is simply not hit (its rows stay, unused), and the calls are made afresh.
    """
    parts: dict[str, Any] = {
        "scheme": _KEY_SCHEME,
        "kind": kind,
        "model": model,
        "temperature": temperature,
        "max_tokens": max_tokens,
        "content": content,
    }
    if schema is not None:
        parts["schema"] = schema
    if trial is not None:
        parts["trial"] = trial
    if extra_body:
        parts["extra_body"] = extra_body
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
        except (sqlite3.Error, OSError) as error:  # OutputError is an OSError shown as one line
            raise OutputError(
                f"judge cache {self.path} cannot be opened ({error}); fix the path or permissions, "
                "or disable the cache (cache_path: null / --no-cache)"
            ) from None
        self._lock = threading.Lock()

    def get(self, key: str) -> dict[str, Any] | None:
        """The stored object, or None when absent (or unreadable, which is logged and treated as absent)."""
        with self._lock:
            row = self._db.execute("SELECT value FROM judge_cache WHERE key = ?", (key,)).fetchone()
        return None if row is None else self._value(key, row[0])

    def get_many(self, keys: Sequence[str]) -> dict[str, dict[str, Any]]:
        """The stored objects of those ``keys`` that have one (as :meth:`get`), in one query per
        ``_KEYS_PER_QUERY`` keys: a warm run reads a whole span at once instead of a row per call."""
        unique = list(dict.fromkeys(keys))
        rows: list[tuple[str, str]] = []
        with self._lock:
            for start in range(0, len(unique), _KEYS_PER_QUERY):
                chunk = unique[start : start + _KEYS_PER_QUERY]
                marks = ",".join("?" * len(chunk))
                query = f"SELECT key, value FROM judge_cache WHERE key IN ({marks})"  # noqa: S608 (marks only)
                rows.extend(self._db.execute(query, chunk).fetchall())
        found = {key: self._value(key, text) for key, text in rows}
        return {key: value for key, value in found.items() if value is not None}

    def _value(self, key: str, text: str) -> dict[str, Any] | None:
        try:
            value = json.loads(text)
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
