"""Verdicts you can trust (issue 23): a verdict is reused only for the judge that gave it, a paid answer
is never lost to the cache, a damaged cache is named before any call, and a rejected key stops the run.

Real HTTP against loopback judges (``judge_server``); the judges under one model name differ only in
their linguistic scores, so whose verdict a row carries can be read off its numbers.
"""

from __future__ import annotations

import json
import logging
import sqlite3

import pytest
import yaml
from judge_testkit import CAPTION, REFERENCE, png_bytes
from typer.testing import CliRunner

import balcaprl.judge.cache as cache_module
from balcaprl.cli import app
from balcaprl.judge.cache import JudgeCache, cache_key, endpoint_identity
from balcaprl.testing.judge_server import JudgeServer
from balcaprl.testing.revocation import RevokedKey
from balcaprl.testing.scripted_judge import ScriptedJudge

IMAGES = ("a.png", "b.png", "c.png", "d.png")
FULL = "A red door on the left, a black cat sits on the step."
# the scripted judge's linguistic score is (clarity-1 + fluency-1 + coherency-1) / 27
LOUD = {"clarity": 8, "fluency": 9, "coherency": 7}  # 21/27
QUIET = {"clarity": 2, "fluency": 3, "coherency": 2}  # 4/27


@pytest.fixture
def workspace(tmp_path):
    images = tmp_path / "images"
    images.mkdir()
    for n, name in enumerate(IMAGES):
        (images / name).write_bytes(png_bytes(colour=(40 * n, 0, 0)))
    captions = tmp_path / "captions.jsonl"
    lines = [{"image": name, "caption": CAPTION if n % 2 else FULL} for n, name in enumerate(IMAGES)]
    captions.write_text("".join(json.dumps(line) + "\n" for line in lines))
    references = tmp_path / "references.json"
    references.write_text(json.dumps(dict.fromkeys(IMAGES, REFERENCE)))
    return tmp_path, images, captions, references


def judge_yaml(tmp_path, name: str, server: JudgeServer, **settings) -> str:
    path = tmp_path / f"{name}.yaml"
    values = {"base_url": server.base_url, "model": "judge", "api_key_env": None, "max_retries": 0,
              "cache_path": str(tmp_path / "cache.sqlite"), **settings}  # fmt: skip
    path.write_text(yaml.safe_dump(values))
    return str(path)


def score(workspace, judge: str, out: str, *extra: str):
    tmp, images, captions, references = workspace
    args = ["score", "--images", str(images), "--captions", str(captions), "--references", str(references),
            "--judge", judge, "--out", str(tmp / out), "--no-progress", *extra]  # fmt: skip
    return CliRunner(env={"COLUMNS": "60"}).invoke(app, args)


def linguistic(workspace, out: str) -> list[float]:
    rows = (workspace[0] / out / "scores.jsonl").read_text().splitlines()
    return [json.loads(line)["linguistic"] for line in rows]


def one_line(text: str) -> str:
    return " ".join(text.split())


# -------------------------------------------------------------------- 1. whose verdict it is


def test_endpoint_identity_tells_servers_apart_and_keeps_no_credentials():
    same = [
        "http://127.0.0.1:8000/v1",
        "HTTP://127.0.0.1:8000/v1/",
        "http://user:hunter2@127.0.0.1:8000/v1",
        "http://127.0.0.1:8000/v1?api_key=hunter2",
        "http://127.0.0.1:8000/v1#frag",
    ]
    assert {endpoint_identity(url) for url in same} == {"http://127.0.0.1:8000/v1"}
    assert endpoint_identity("https://API.example.com:443/v1") == "https://api.example.com/v1"
    assert endpoint_identity("https://x.openai.azure.com/v1?api-version=2024-06-01&sig=abc") == (
        "https://x.openai.azure.com/v1?api-version=2024-06-01"
    )
    different = ["http://127.0.0.1:8001/v1", "http://127.0.0.2:8000/v1", "http://127.0.0.1:8000/v2",
                 "https://127.0.0.1:8000/v1", "http://[::1]:8000/v1"]  # fmt: skip
    identities = {endpoint_identity(url) for url in [same[0], *different]}
    assert len(identities) == len(different) + 1
    assert "hunter2" not in "".join(endpoint_identity(url) for url in same)


def test_the_cache_key_names_the_endpoint():
    base = {"model": "judge", "temperature": 0.0, "max_tokens": 100, "content": {"caption": "c"}}
    a = cache_key("verdict", endpoint="http://127.0.0.1:8000/v1", **base)
    assert a != cache_key("verdict", endpoint="http://127.0.0.1:8001/v1", **base)
    assert a == cache_key("verdict", endpoint=endpoint_identity("http://u:p@127.0.0.1:8000/v1/"), **base)


def test_two_judges_under_one_model_name_each_give_their_own_verdicts(workspace, judge_server):
    """The vLLM recipe's `--served-model-name judge` twice, one cache: no borrowed verdicts."""
    tmp = workspace[0]
    loud, quiet = judge_server(judge=ScriptedJudge(**LOUD)), judge_server(judge=ScriptedJudge(**QUIET))
    first = score(workspace, judge_yaml(tmp, "loud", loud), "loud")
    assert first.exit_code == 0, first.output
    assert loud.counters.total == len(IMAGES)
    second = score(workspace, judge_yaml(tmp, "quiet", quiet), "quiet")
    assert second.exit_code == 0, second.output
    assert quiet.counters.total == len(IMAGES)  # asked, not borrowed from the loud judge's cache rows
    assert linguistic(workspace, "loud") == pytest.approx([21 / 27] * len(IMAGES))
    assert linguistic(workspace, "quiet") == pytest.approx([4 / 27] * len(IMAGES))
    # the console says where the answers came from: first all judged, then (same judge again) all cached
    assert f"answers: {len(IMAGES)} judged by {len(IMAGES)} calls, 0 from the judge cache" in one_line(
        second.output
    )
    again = score(workspace, judge_yaml(tmp, "quiet", quiet), "quiet-again")
    assert quiet.counters.total == len(IMAGES)
    assert f"answers: 0 judged by 0 calls, {len(IMAGES)} from the judge cache" in one_line(again.output)
    assert linguistic(workspace, "quiet-again") == linguistic(workspace, "quiet")


def test_resume_takes_no_rows_recorded_by_another_judge(workspace, judge_server):
    tmp = workspace[0]
    loud, quiet = judge_server(judge=ScriptedJudge(**LOUD)), judge_server(judge=ScriptedJudge(**QUIET))
    assert score(workspace, judge_yaml(tmp, "loud", loud, cache_path=None), "out").exit_code == 0
    result = score(workspace, judge_yaml(tmp, "quiet", quiet, cache_path=None), "out", "--resume")
    assert result.exit_code == 0, result.output
    assert "resumed:" not in result.output and quiet.counters.total == len(IMAGES)
    assert linguistic(workspace, "out") == pytest.approx([4 / 27] * len(IMAGES))


# -------------------------------------------------------------------- 3. the cache never costs an answer


def test_a_full_disk_stops_the_writes_not_the_answer(tmp_path, caplog):
    """A real sqlite 'database or disk is full' (the file may not grow a page): put says so, once."""
    with JudgeCache(tmp_path / "c.sqlite") as cache:
        cache.put("small", {"v": 1})
        (pages,) = cache._db.execute("PRAGMA page_count").fetchone()
        cache._db.execute(f"PRAGMA max_page_count = {pages}")
        with caplog.at_level(logging.WARNING, logger=cache_module.__name__):
            assert cache.put("big", {"v": "x" * 20000}) is False
            assert cache.put("small2", {"v": 2}) is False  # not tried again: no second warning
        assert "database or disk is full" in cache.write_failure and cache.unwritten == 2
        assert cache.get("small") == {"v": 1} and cache.get("big") is None  # reads go on
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "is not being written" in warnings[0] and "c.sqlite" in warnings[0]


class FullDisk:
    """A sqlite connection whose every write fails as a full disk does."""

    def __init__(self, db: sqlite3.Connection):
        self.db = db

    def execute(self, sql: str, *args):
        if sql.lstrip().upper().startswith("INSERT"):
            raise sqlite3.OperationalError("database or disk is full")
        return self.db.execute(sql, *args)

    def close(self) -> None:
        self.db.close()


def test_score_keeps_every_paid_answer_when_the_cache_cannot_be_written(
    workspace, judge_server, monkeypatch, caplog
):
    tmp = workspace[0]
    server = judge_server(judge=ScriptedJudge(**LOUD))
    connect = sqlite3.connect
    monkeypatch.setattr(cache_module.sqlite3, "connect", lambda *a, **k: FullDisk(connect(*a, **k)))
    with caplog.at_level(logging.WARNING):
        result = score(workspace, judge_yaml(tmp, "loud", server), "out")
    assert result.exit_code == 0, result.output  # every caption scored: nobody blamed the server
    assert linguistic(workspace, "out") == pytest.approx([21 / 27] * len(IMAGES))
    summary = json.loads((tmp / "out" / "summary.json").read_text())
    assert summary["failures"] == {} and summary["accounting"]["calls"] == len(IMAGES)
    record = (tmp / "out" / ".score" / "record.jsonl").read_text().splitlines()
    assert sum('"verdict"' in line for line in record) == len(IMAGES)  # and in the record, for --resume
    said = [r.getMessage() for r in caplog.records if "not being written" in r.getMessage()]
    assert len(said) == 1 and "database or disk is full" in said[0]
    # the record alone resumes the run: nothing is paid twice, though the cache holds nothing
    monkeypatch.undo()
    again = score(workspace, judge_yaml(tmp, "loud", server), "out", "--resume")
    assert again.exit_code == 0 and server.counters.total == len(IMAGES)


def damaged_cache(path) -> None:
    """A cache whose table and key index pages are overwritten: every lookup hits the damage."""
    with JudgeCache(path) as cache:
        for i in range(40):
            cache.put(f"k{i}", {"v": "x" * 3000})
    with open(path, "r+b") as file:
        file.seek(4096)  # pages 2 and 3: the table's root and its primary-key index
        file.write(b"\xa5" * 8192)


@pytest.mark.parametrize("damage", ["pages", "garbage"])
def test_a_damaged_cache_is_named_before_any_call(workspace, judge_server, damage):
    tmp = workspace[0]
    server = judge_server()
    path = tmp / "cache.sqlite"
    if damage == "pages":
        damaged_cache(path)
    else:
        path.write_bytes(b"not a database, just bytes\n" * 500)
    result = score(workspace, judge_yaml(tmp, "loud", server), "out")
    assert result.exit_code == 2, result.output
    assert server.counters.total == 0  # nothing paid
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: judge cache ") and str(path) in lines[0]
    assert "is corrupted" in lines[0] and "Traceback" not in result.output


# -------------------------------------------------------------------- 4. a rejected key stops the run


def test_score_stops_at_a_revoked_key_in_one_line_and_keeps_what_was_paid(workspace):
    tmp = workspace[0]
    with JudgeServer(ScriptedJudge(**LOUD), RevokedKey(after=2)) as server:
        result = score(workspace, judge_yaml(tmp, "loud", server, concurrency=1, cache_path=None), "out")
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "HTTP 401" in lines[0] and lines[0].startswith("error: ")
    record = (tmp / "out" / ".score" / "record.jsonl").read_text().splitlines()
    assert sum('"verdict"' in line for line in record) == 2  # the two paid answers are kept


def test_a_wrong_key_from_the_start_is_one_line(workspace, monkeypatch):
    tmp = workspace[0]
    monkeypatch.setenv("TRUST_JUDGE_KEY", "wrong")
    with JudgeServer(ScriptedJudge(), api_key="right") as server:
        result = score(workspace, judge_yaml(tmp, "j", server, api_key_env="TRUST_JUDGE_KEY"), "out")
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "HTTP 401" in lines[0] and "wrong" not in lines[0]
