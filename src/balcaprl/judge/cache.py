"""The judge cache: stdlib sqlite3 in WAL mode, JSON values, sha256 keys (:func:`cache_key`).

Why sqlite: one file, safe for several processes (trainer ranks, a `balcaprl score` next to a
training run) thanks to its locking, and atomic per transaction, so a process killed with `kill -9`
mid-write leaves either the whole row or nothing. WAL lets readers proceed while one process writes.
``synchronous=NORMAL`` keeps commits cheap; in WAL mode it is still durable across process crashes
and can only lose the last commits on a power cut (a lost verdict is simply judged again).

Why JSON and not pickle: a cache file may be shared or downloaded; unpickling it would run code.
Only successful answers are stored; failures are never cached, so a retry can succeed later.

Whose answer: a key names the endpoint (:func:`endpoint_identity`) as well as the model, because
servers name their models freely -- two vLLM servers started with ``--served-model-name judge``
are two judges, and neither may answer for the other.

When the file fails us (docs/robustness.md): a file that is not a sound sqlite database is refused
when it is opened, in one line naming it, before any call is paid (``PRAGMA quick_check``: reads
the whole file once, about 0.15 s per 200 MB from the page cache). A write that fails later (disk
full, read-only, locked past the busy timeout) never fails the answer it was storing: the answer
goes on to the caller's results, one warning says the cache is no longer written, and it is not
tried again in this process (a locked file would otherwise stall every call for the busy timeout).
A read that fails is a miss, with one warning too.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import re
import sqlite3
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

from balcaprl.errors import OutputError

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS judge_cache (
    key     TEXT PRIMARY KEY,
    value   TEXT NOT NULL,
    created REAL NOT NULL
)
"""


_KEY_SCHEME = 3  # bumped whenever the layout below changes (3: the endpoint joined the key)
_KEYS_PER_QUERY = 500  # under SQLite's oldest bound on parameters per statement (999)

# Query parameters that may carry a credential (``?api_key=``, ``?sig=``, Azure's ``?code=``): never
# part of an identity that is hashed into every key and would change whenever the secret rotates.
_SECRET_PARAMETER = re.compile(r"key|token|secret|pass|pwd|auth|sig|credential|session|code", re.I)
_DEFAULT_PORTS = {"http": 80, "https": 443}


@functools.lru_cache(maxsize=64)  # once per config, not once per call
def endpoint_identity(base_url: str) -> str:
    """Which server a judge config talks to, as it goes into :func:`cache_key`: the base URL with its
    scheme and host in lower case, the default port and a trailing slash dropped, and no credentials
    (user and password, query parameters named like secrets, the fragment). Equal for spellings of
    one URL; different for two servers (hosts, ports or paths)."""
    parts = urlsplit(base_url.strip())
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    if ":" in host:  # an IPv6 literal keeps its brackets
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:  # not a number: keep what was written, less any credentials
        port = parts.netloc.rpartition("@")[2].rpartition(":")[2] or None
    if port is not None and port != _DEFAULT_PORTS.get(scheme):
        host = f"{host}:{port}"
    query = sorted(
        (name, value)
        for name, value in parse_qsl(parts.query, keep_blank_values=True)
        if not _SECRET_PARAMETER.search(name)
    )
    path = parts.path.rstrip("/")
    return f"{scheme}://{host}{path}" + (f"?{urlencode(query)}" if query else "")


def cache_key(
    kind: str,
    *,
    endpoint: str,
    model: str,
    temperature: float | None,
    max_tokens: int,
    content: Mapping[str, Any],
    schema: str | None = None,
    trial: int | None = None,
    extra_body: Mapping[str, Any] | None = None,
) -> str:
    """The key of one judge call: sha256 of the canonical JSON of everything that decides its answer.

    Every call goes through here, the verdict judge's and generic ones alike. ``endpoint`` is the
    server's :func:`endpoint_identity` (with ``model``, it says which judge answered). ``kind`` names the step
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
        "endpoint": endpoint,
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

    Opening refuses a file that is not a sound database (:class:`OutputError`, one line). After that
    nothing it does raises for the file's sake: a failed write is a warning and the end of writing
    (:attr:`write_failure`, :attr:`unwritten`), a failed read a miss. Use as a context manager or
    call :meth:`close`.
    """

    def __init__(self, path: Path | str, busy_timeout_s: float = 60.0):
        self.path = Path(path).expanduser()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(
                self.path, timeout=busy_timeout_s, check_same_thread=False, isolation_level=None
            )
        except (sqlite3.Error, OSError) as error:  # OutputError is an OSError shown as one line
            raise self._unusable(f"cannot be opened ({error})") from None
        self._lock = threading.Lock()
        self.write_failure: str | None = None  # why the cache stopped being written, once it has
        self.unwritten = 0  # answers not stored since then
        self._read_failure: str | None = None
        try:
            self._check_sound()
            self._set_up(busy_timeout_s)
        except sqlite3.OperationalError as error:
            if _is_corruption(error):
                self._db.close()
                raise self._corrupt(str(error)) from None
            if not self._has_table():  # nothing to read either: say so now, before any call
                self._db.close()
                raise self._unusable(f"cannot be opened ({error})") from None
            # a read-only file or a full disk: read what is there, write nothing
            self.write_failure = f"{type(error).__name__}: {error}"
            self._warn_not_written()
        except sqlite3.DatabaseError as error:
            self._db.close()
            raise self._corrupt(str(error)) from None
        except OutputError:
            self._db.close()
            raise

    def _set_up(self, busy_timeout_s: float) -> None:
        """WAL mode and the table, waiting while another process holds the file. Switching to WAL
        takes an exclusive lock, and when several processes open a new file at once SQLite answers
        some of them "database is locked" at once instead of calling the busy handler (it would
        deadlock); taken for a read-only file, that made a trainer rank stop writing the cache for
        the whole run. A lock is waited out here, up to the busy timeout like any other."""
        deadline = time.monotonic() + busy_timeout_s
        pause = 0.005
        while True:
            try:
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA synchronous=NORMAL")
                self._db.execute(_SCHEMA)
                return
            except sqlite3.OperationalError as error:
                if not _is_lock(error) or time.monotonic() + pause > deadline:
                    raise
            time.sleep(pause)
            pause = min(2 * pause, 0.25)

    def _unusable(self, why: str) -> OutputError:
        return OutputError(
            f"judge cache {self.path} {why}; fix the path or permissions, "
            "or disable the cache (cache_path: null / --no-cache)"
        )

    def _corrupt(self, why: str) -> OutputError:
        return OutputError(
            f"judge cache {self.path} is corrupted ({why}); nothing was judged. Move it aside "
            f"(mv {self.path} {self.path}.corrupt) to start a new cache, or use another cache_path / --cache "
            "or --no-cache"
        )

    def _check_sound(self) -> None:
        """Refuse a damaged file before any call is paid (a page torn by a disk or a copy, garbage)."""
        problems = [row[0] for row in self._db.execute("PRAGMA quick_check(3)").fetchall()]
        if problems != ["ok"]:
            said = " ".join("; ".join(str(p) for p in problems).split())  # sqlite's lines, on one
            raise self._corrupt(said[:200])

    def get(self, key: str) -> dict[str, Any] | None:
        """The stored object, or None when absent (or unreadable, which is logged and treated as absent)."""
        try:
            with self._lock:
                row = self._db.execute("SELECT value FROM judge_cache WHERE key = ?", (key,)).fetchone()
        except sqlite3.Error as error:
            self._failed_read(error)
            return None
        return None if row is None else self._value(key, row[0])

    def get_many(self, keys: Sequence[str]) -> dict[str, dict[str, Any]]:
        """The stored objects of those ``keys`` that have one (as :meth:`get`), in one query per
        ``_KEYS_PER_QUERY`` keys: a warm run reads a whole span at once instead of a row per call."""
        unique = list(dict.fromkeys(keys))
        rows: list[tuple[str, str]] = []
        try:
            with self._lock:
                for start in range(0, len(unique), _KEYS_PER_QUERY):
                    chunk = unique[start : start + _KEYS_PER_QUERY]
                    marks = ",".join("?" * len(chunk))
                    query = f"SELECT key, value FROM judge_cache WHERE key IN ({marks})"  # noqa: S608 (marks only)
                    rows.extend(self._db.execute(query, chunk).fetchall())
        except sqlite3.Error as error:
            self._failed_read(error)
            return {}
        found = {key: self._value(key, text) for key, text in rows}
        return {key: value for key, value in found.items() if value is not None}

    def _failed_read(self, error: sqlite3.Error) -> None:
        if self._read_failure is None:  # said once: every read after it would say the same
            self._read_failure = f"{type(error).__name__}: {error}"
            log.warning(
                "warning: judge cache %s cannot be read (%s); answers are asked for afresh",
                self.path,
                self._read_failure,
            )

    def _value(self, key: str, text: str) -> dict[str, Any] | None:
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            log.warning("judge cache %s: row %s is not valid JSON; ignoring it", self.path, key[:12])
            return None
        return value if isinstance(value, dict) else None

    def put(self, key: str, value: dict[str, Any]) -> bool:
        """Store ``value`` (JSON-serialisable) under ``key``, replacing any older value, atomically.

        False when it was not stored: this write failed, or an earlier one did (see the class)."""
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
        with self._lock:
            if self.write_failure is not None:
                self.unwritten += 1
                return False
            try:
                self._db.execute(
                    "INSERT OR REPLACE INTO judge_cache (key, value, created) VALUES (?, ?, ?)",
                    (key, text, time.time()),
                )
                return True
            except sqlite3.Error as error:  # disk full, read-only, locked: the answer is still good
                self.unwritten += 1
                self.write_failure = f"{type(error).__name__}: {error}"
        self._warn_not_written()
        return False

    def _warn_not_written(self) -> None:
        log.warning(
            "warning: judge cache %s is not being written from here on (%s); answers still reach the "
            "results, but a later run will pay for them again",
            self.path,
            self.write_failure,
        )

    def _has_table(self) -> bool:
        try:
            self._db.execute("SELECT 1 FROM judge_cache LIMIT 1").fetchall()
            return True
        except sqlite3.Error:
            return False

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


def _is_corruption(error: sqlite3.OperationalError) -> bool:
    """sqlite reports some damage as an OperationalError (e.g. a malformed schema)."""
    return "malformed" in str(error) or "not a database" in str(error)


def _is_lock(error: sqlite3.OperationalError) -> bool:
    """SQLITE_BUSY or SQLITE_LOCKED (extended codes included): another connection holds the file."""
    code = getattr(error, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    return "locked" in str(error) or "busy" in str(error)
