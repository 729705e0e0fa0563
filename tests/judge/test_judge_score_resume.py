"""`balcaprl score` killed mid-run (SIGKILL, a real subprocess, real HTTP): nothing paid is lost.

The re-run pays exactly for the captions the killed run had not finished, also with --no-cache (the
record in OUT is the memory), and writes byte for byte the files of an uninterrupted run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from judge_testkit import png_bytes
from typer.testing import CliRunner

from balcaprl.cli import app
from balcaprl.testing.scripted_judge import ScriptedJudge

N = 16
CONCURRENCY = 2
REFERENCE = "A red door on the left. A black cat sits on the step. A green bench under a tree."


@pytest.fixture
def inputs(tmp_path, judge_server):
    server = judge_server(judge=ScriptedJudge(latency_s=0.25))
    images = tmp_path / "images"
    images.mkdir()
    captions, references = [], {}
    for i in range(N):
        name = f"{i:02d}.png"
        (images / name).write_bytes(png_bytes(colour=(10 * i, 40, 90)))
        # a different number of covered reference clauses per caption, so the rows differ
        covered = ["a red door on the left", "a black cat sits on the step", "a green bench under a tree"][
            : i % 4
        ]
        captions.append({"image": name, "caption": ", ".join([*covered, f"a sign with the number {i}"])})
        references[name] = REFERENCE
    (tmp_path / "captions.jsonl").write_text("".join(json.dumps(c) + "\n" for c in captions))
    (tmp_path / "references.json").write_text(json.dumps(references))
    judge = {"base_url": server.base_url, "model": "scripted", "api_key_env": None, "cache_path": None,
             "concurrency": CONCURRENCY, "max_retries": 0, "timeout_s": 10}  # fmt: skip
    (tmp_path / "judge.yaml").write_text(yaml.safe_dump(judge))
    return server, tmp_path


def args(tmp: Path, out: Path, *extra: str) -> list[str]:
    return ["score", "--images", str(tmp / "images"), "--captions", str(tmp / "captions.jsonl"),
            "--references", str(tmp / "references.json"), "--judge", str(tmp / "judge.yaml"),
            "--out", str(out), "--no-cache", "--no-progress", *extra]  # fmt: skip


def recorded(out: Path) -> int:
    path = out / ".score" / "record.jsonl"
    return sum('"key"' in line for line in path.read_text().splitlines()) if path.exists() else 0


def without_accounting(path: Path) -> dict:
    summary = json.loads(path.read_text())
    summary.pop("accounting")  # what the run that wrote the file paid: differs by design
    return summary


def test_a_killed_run_resumes_paying_only_for_what_was_unfinished(inputs):
    server, tmp = inputs
    runner = CliRunner(env={"COLUMNS": "120"})
    straight = runner.invoke(app, args(tmp, tmp / "straight"))
    assert straight.exit_code == 0, straight.output
    assert server.counters.total == N  # one verdict call per caption

    out = tmp / "killed"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2] / "src"), *sys.path])}
    process = subprocess.Popen(
        [sys.executable, "-m", "balcaprl.cli", *args(tmp, out)], env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while recorded(out) < N // 3:  # killed about a third of the way in
            assert process.poll() is None, "the run ended before it could be killed"
            assert time.monotonic() < deadline, "the run made no progress"
            time.sleep(0.02)
        process.send_signal(signal.SIGKILL)
    finally:
        process.wait(timeout=30)
    assert process.returncode == -signal.SIGKILL
    done = recorded(out)
    paid_before = server.counters.total - N
    assert N // 3 <= done < N and done <= paid_before <= done + CONCURRENCY  # only calls in flight lost
    assert not (out / "scores.jsonl").exists()  # final files come at the end, atomically

    refused = runner.invoke(app, args(tmp, out))
    assert refused.exit_code == 2 and "pass --resume to continue them" in " ".join(refused.output.split())

    before = server.counters.total
    resumed = runner.invoke(app, args(tmp, out, "--resume"))
    assert resumed.exit_code == 0, resumed.output
    assert server.counters.total - before == N - done  # exactly the unfinished captions, no cache at all
    assert f"resumed: {done} captions scored by an earlier run" in resumed.output
    for name in ("scores.jsonl", "verdicts.jsonl"):  # resumed rows keep their verdicts too
        assert (out / name).read_bytes() == (tmp / "straight" / name).read_bytes(), name
    assert without_accounting(out / "summary.json") == without_accounting(tmp / "straight" / "summary.json")
    assert json.loads((out / "summary.json").read_text())["accounting"]["resumed_from_record"] == done

    # a finished folder resumed again pays nothing; --overwrite judges everything again
    again = runner.invoke(app, args(tmp, out, "--resume"))
    assert again.exit_code == 0 and server.counters.total - before == N - done
    replaced = runner.invoke(app, args(tmp, out, "--overwrite"))
    assert replaced.exit_code == 0, replaced.output
    assert server.counters.total - before == 2 * N - done
    for name in ("scores.jsonl", "verdicts.jsonl"):  # resumed rows keep their verdicts too
        assert (out / name).read_bytes() == (tmp / "straight" / name).read_bytes(), name
    assert sorted(p.name for p in tmp.iterdir() if p.name.startswith(".killed")) == []


def test_an_unwritable_out_is_found_before_any_call(inputs):
    server, tmp = inputs
    blocker = tmp / "a-file"
    blocker.write_text("not a folder")
    for out in (blocker, blocker / "inside"):
        result = CliRunner(env={"COLUMNS": "120"}).invoke(app, args(tmp, out))
        assert result.exit_code == 2, result.output
        assert "Traceback" not in result.output
    assert server.counters.total == 0  # nothing paid for results that could not be written
