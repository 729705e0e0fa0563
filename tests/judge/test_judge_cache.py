"""The sqlite verdict cache: JSON values, WAL, several processes at once, and kill -9 mid-write."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time

import balcaprl.judge.cache as cache_module
from balcaprl.judge.cache import JudgeCache, cache_key

# The writer loads cache.py by file path: it needs only the stdlib, and skipping the package's heavy
# imports (torch, openai) keeps four concurrent processes fast on a 2-core machine.
WRITER = textwrap.dedent(
    """
    import importlib.util, sys
    spec = importlib.util.spec_from_file_location("judge_cache", sys.argv[5])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    path, name, start, count = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    cache = module.JudgeCache(path)
    i = start
    while count < 0 or i < start + count:
        # a large value makes each write span many pages, so a kill lands mid-transaction
        cache.put(f"key-{i}", {"writer": name, "i": i, "payload": "x" * 20000})
        if i % 10 == 0:
            print(i, flush=True)
        i += 1
    """
)


def spawn(path, name, start, count):
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), name, str(start), str(count), cache_module.__file__],
        stdout=subprocess.PIPE,
        text=True,
    )


def test_values_are_json_and_wal_is_on(tmp_path):
    path = tmp_path / "c.sqlite"
    with JudgeCache(path) as cache:
        cache.put("k", {"verdict": {"clarity": 8}, "text": "café"})
        assert cache.get("k") == {"verdict": {"clarity": 8}, "text": "café"}
        assert cache.get("missing") is None
        cache.put("k", {"replaced": True})
        assert cache.get("k") == {"replaced": True} and len(cache) == 1
    raw = sqlite3.connect(path)
    assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    (value,) = raw.execute("SELECT value FROM judge_cache WHERE key = 'k'").fetchone()
    assert json.loads(value) == {"replaced": True}  # plain JSON text, not a pickle
    raw.close()


def test_unreadable_row_is_a_miss(tmp_path):
    path = tmp_path / "c.sqlite"
    JudgeCache(path).close()
    raw = sqlite3.connect(path)
    raw.execute("INSERT INTO judge_cache VALUES ('bad', 'not json {', 0)")
    raw.commit()
    raw.close()
    with JudgeCache(path) as cache:
        assert cache.get("bad") is None


BASE = {
    "endpoint": "http://127.0.0.1:8000/v1",
    "model": "m",
    "temperature": 0.0,
    "max_tokens": 100,
    "content": {"caption": "c", "rubric_version": "v1"},
}


def test_get_many_reads_what_get_reads_in_chunks_of_keys(tmp_path, monkeypatch):
    monkeypatch.setattr(cache_module, "_KEYS_PER_QUERY", 3)  # several queries for the keys below
    with JudgeCache(tmp_path / "c.sqlite") as cache:
        for i in range(8):
            cache.put(f"k{i}", {"i": i})
        cache._db.execute("INSERT INTO judge_cache VALUES ('bad', 'not json {', 0)")
        cache._db.execute("INSERT INTO judge_cache VALUES ('list', '[1, 2]', 0)")
        keys = ["k7", "missing", "k0", "bad", "k0", "list", *(f"k{i}" for i in range(1, 7))]
        want = {key: cache.get(key) for key in keys if cache.get(key) is not None}
        assert cache.get_many(keys) == want and len(want) == 8
        assert cache.get_many([]) == {}


def test_cache_key_is_canonical_and_sensitive():
    a = cache_key("verdict", **BASE)
    assert len(a) == 64 and int(a, 16) >= 0
    # the order of the content's fields does not matter
    assert a == cache_key("verdict", **{**BASE, "content": {"rubric_version": "v1", "caption": "c"}})
    # every part of the identity does
    changed = [
        cache_key("coverage", **BASE),
        cache_key("verdict", **{**BASE, "endpoint": "http://127.0.0.1:8001/v1"}),
        cache_key("verdict", **{**BASE, "model": "m2"}),
        cache_key("verdict", **{**BASE, "temperature": None}),
        cache_key("verdict", **{**BASE, "max_tokens": 101}),
        cache_key("verdict", **{**BASE, "content": {"caption": "c ", "rubric_version": "v1"}}),
        cache_key("verdict", **{**BASE, "content": {"caption": "c", "rubric_version": "v2"}}),
        cache_key("verdict", **BASE, schema="abc"),
        cache_key("verdict", **BASE, trial=0),
        cache_key("verdict", **BASE, extra_body={"top_p": 0.9}),
    ]
    assert len({a, *changed}) == len(changed) + 1
    # the content cannot impersonate a field of the key: it is kept apart from them
    assert cache_key("verdict", **{**BASE, "content": {"model": "m2"}}) != cache_key(
        "verdict", **{**BASE, "model": "m2", "content": {}}
    )


def test_several_processes_write_at_once(tmp_path):
    path = tmp_path / "c.sqlite"
    writers = [spawn(path, f"w{n}", n * 1000, 300) for n in range(3)]
    # and one overlapping writer on the same keys as the first
    writers.append(spawn(path, "overlap", 0, 300))
    for process in writers:
        assert process.wait(timeout=60) == 0
        process.stdout.close()
    with JudgeCache(path) as cache:
        assert len(cache) == 3 * 300
        for n in range(3):
            for i in range(n * 1000, n * 1000 + 300):
                value = cache.get(f"key-{i}")
                assert value is not None and value["i"] == i
                assert value["writer"] in ({f"w{n}", "overlap"} if n == 0 else {f"w{n}"})


class _LockedWhileOpening(sqlite3.Connection):
    """A connection that answers "database is locked" at once to the switch to WAL, ``refusals`` times:
    what SQLite does to some of several processes opening one new file together (found under load by
    the test above, 600 of 900 rows stored: a rank took the lock for a read-only file)."""

    refusals = 0

    def execute(self, sql, *args):
        if sql.startswith("PRAGMA journal_mode") and _LockedWhileOpening.refusals > 0:
            _LockedWhileOpening.refusals -= 1
            error = sqlite3.OperationalError("database is locked")
            error.sqlite_errorcode = sqlite3.SQLITE_BUSY
            raise error
        return super().execute(sql, *args)


def _open_against_a_lock(monkeypatch, path, refusals, busy_timeout_s):
    real_connect = sqlite3.connect
    monkeypatch.setattr(
        sqlite3, "connect", lambda *a, **k: real_connect(*a, factory=_LockedWhileOpening, **k)
    )
    monkeypatch.setattr(_LockedWhileOpening, "refusals", refusals)
    return JudgeCache(path, busy_timeout_s=busy_timeout_s)


def test_a_lock_met_while_opening_is_waited_out_not_taken_for_a_read_only_file(tmp_path, monkeypatch):
    path = tmp_path / "c.sqlite"
    JudgeCache(path).close()  # the table exists: another process created it
    with _open_against_a_lock(monkeypatch, path, refusals=3, busy_timeout_s=30) as cache:
        assert _LockedWhileOpening.refusals == 0  # all three were met, and waited out
        assert cache.write_failure is None
        assert cache.put("k", {"v": 1}) is True and cache.get("k") == {"v": 1}


def test_a_lock_held_past_the_busy_timeout_still_ends_in_reading_only(tmp_path, monkeypatch, caplog):
    path = tmp_path / "c.sqlite"
    JudgeCache(path).close()
    with _open_against_a_lock(monkeypatch, path, refusals=10**6, busy_timeout_s=0.05) as cache:
        assert cache.write_failure == "OperationalError: database is locked"
        assert cache.put("k", {"v": 1}) is False and cache.unwritten == 1
    assert "not being written" in caplog.text


def test_kill_9_mid_write_leaves_a_consistent_cache(tmp_path):
    path = tmp_path / "c.sqlite"
    for round_ in range(3):  # three kills at arbitrary points of the write loop
        process = spawn(path, "doomed", round_ * 100_000, -1)  # writes until killed
        last = round_ * 100_000
        deadline = time.monotonic() + 30
        while last < round_ * 100_000 + 50 and time.monotonic() < deadline:
            last = int(process.stdout.readline())
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)
        process.stdout.close()
        assert process.returncode == -signal.SIGKILL
        with JudgeCache(path) as cache:
            raw = sqlite3.connect(path)
            assert raw.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
            keys = [k for (k,) in raw.execute("SELECT key FROM judge_cache") if k.startswith("key-")]
            written = sorted(int(k[4:]) for k in keys if int(k[4:]) >= round_ * 100_000)
            # everything reported written survived, and the rows form an unbroken run from the start
            assert written == list(range(round_ * 100_000, round_ * 100_000 + len(written)))
            assert written[-1] >= last
            for i in written:  # and every row that exists is whole
                assert cache.get(f"key-{i}") == {"writer": "doomed", "i": i, "payload": "x" * 20000}
            raw.close()
            cache.put(f"after-{round_}", {"ok": True})  # and the file is still writable
            assert cache.get(f"after-{round_}") == {"ok": True}
