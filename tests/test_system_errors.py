"""What the system refuses mid-run (a full disk, a folder made read-only) is one line that names the
path, never a traceback: ``error: <path>: <reason>; ...``, status 1 (docs/robustness.md), and what was
finished is kept. A full disk is made by an ``fsync`` that fails with ENOSPC, as a real one does (an
open file's write reports no path of its own)."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
import yaml
from PIL import Image
from typer.testing import CliRunner

from balcaprl.cli import app
from balcaprl.testing.judge_server import JudgeServer
from balcaprl.testing.scripted_judge import ScriptedJudge

FULL = "No space left on device; free some space (or choose another place); what was finished is kept"


def disk_full(monkeypatch: pytest.MonkeyPatch) -> None:
    def fsync(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", fsync)


def one_line_error(result) -> str:
    """The error line: the last of the output (progress lines may come before it), said once."""
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert "Traceback" not in result.output and [line for line in lines if "error" in line] == lines[-1:], (
        lines
    )
    assert lines[-1].startswith("error: ")
    return lines[-1]


@pytest.fixture()
def ws(tmp_path: Path):
    (tmp_path / "images").mkdir()
    for i in range(2):
        Image.new("RGB", (16, 16), (90 * i, 10, 10)).save(tmp_path / "images" / f"{i}.png")
    (tmp_path / "captions.jsonl").write_text(
        "".join(json.dumps({"image": f"{i}.png", "caption": "A red door."}) + "\n" for i in range(2))
    )
    (tmp_path / "references.json").write_text(json.dumps({f"{i}.png": "A red door." for i in range(2)}))
    with JudgeServer(ScriptedJudge()) as server:
        (tmp_path / "judge.yaml").write_text(yaml.safe_dump(
            {"base_url": server.base_url, "model": "m", "api_key_env": None, "cache_path": None}
        ))  # fmt: skip
        yield tmp_path


def score(ws: Path, *extra: str):
    args = ["score", "--images", str(ws / "images"), "--captions", str(ws / "captions.jsonl"), "--references",
            str(ws / "references.json"), "--judge", str(ws / "judge.yaml"), "--out", str(ws / "out"),
            "--no-progress", *extra]  # fmt: skip
    return CliRunner().invoke(app, args, env={"COLUMNS": "60"})


def test_score_on_a_full_disk(ws: Path, monkeypatch):
    disk_full(monkeypatch)
    line = one_line_error(score(ws))
    assert (
        line
        == f"error: {ws / 'out' / '.score' / 'record.jsonl'}: {FULL}: run the same command again (with --resume where it has one) to go on"
    )


def test_overwrite_on_a_full_disk_keeps_the_old_results(ws: Path, monkeypatch):
    assert score(ws).exit_code == 0
    before = (ws / "out" / "scores.jsonl").read_bytes()
    disk_full(monkeypatch)
    line = one_line_error(score(ws, "--overwrite"))
    assert line.startswith(f"error: {ws / '.out.overwrite'}/") and FULL in line
    assert (ws / "out" / "scores.jsonl").read_bytes() == before  # the replacement never swapped in


def test_inspect_on_a_full_disk(ws: Path, monkeypatch):
    assert score(ws).exit_code == 0
    disk_full(monkeypatch)
    page = ws / "page.html"
    result = CliRunner().invoke(app, ["inspect", str(ws / "out"), "--out", str(page)], env={"COLUMNS": "60"})
    assert one_line_error(result).startswith(f"error: {page}: {FULL}")
    assert not page.exists() and not list(ws.glob(".page.html.*"))  # no half-written page


def test_caption_into_a_folder_made_read_only_mid_run(ws: Path, monkeypatch, tmp_path):
    """The folder is writable when the run starts (the probe passes), then refuses the final file."""
    from balcaprl.evaluate import captioning
    from balcaprl.synthetic.policy import create_policy

    policy = create_policy(tmp_path / "policy")
    refuse = captioning.atomic_write_text

    def read_only(path, text):
        if Path(path).suffix == ".jsonl":
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return refuse(path, text)

    monkeypatch.setattr(captioning, "atomic_write_text", read_only)
    out = ws / "caps" / "c.jsonl"
    result = CliRunner().invoke(app, ["caption", "--model", str(policy), "--images", str(ws / "images"), "--out",
                                      str(out), "--no-progress", "--max-new-tokens", "4"], env={"COLUMNS": "60"})  # fmt: skip
    assert one_line_error(result).startswith(
        f"error: {out}: Permission denied; check the permissions (or choose another place); what was finished is kept"
    )
    assert len((ws / "caps" / "c.jsonl.part").read_text().splitlines()) == 2  # the captions are kept


def test_debug_lets_the_error_through(ws: Path, monkeypatch):
    disk_full(monkeypatch)
    args = ["--debug", "score", "--images", str(ws / "images"), "--captions", str(ws / "captions.jsonl"),
            "--references", str(ws / "references.json"), "--judge", str(ws / "judge.yaml"), "--out",
            str(ws / "out"), "--no-progress"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert isinstance(result.exception, OSError) and result.exception.errno == errno.ENOSPC


def test_ctrl_c_is_one_line_and_status_130(ws: Path):
    """A real process stopped by SIGINT while it waits on the judge: no stack frames, no warnings."""
    import signal
    import subprocess
    import sys
    import time

    with JudgeServer(ScriptedJudge(latency_s=600)) as slow:
        (ws / "slow.yaml").write_text(yaml.safe_dump(
            {"base_url": slow.base_url, "model": "m", "api_key_env": None, "cache_path": None}
        ))  # fmt: skip
        args = ["score", "--images", str(ws / "images"), "--captions", str(ws / "captions.jsonl"), "--references",
                str(ws / "references.json"), "--judge", str(ws / "slow.yaml"), "--out", str(ws / "out"),
                "--no-progress"]  # fmt: skip
        env = {**os.environ, "COLUMNS": "60", "PYTHONPATH": os.pathsep.join(sys.path)}
        process = subprocess.Popen([sys.executable, "-m", "balcaprl.cli", *args], env=env, text=True,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
        try:
            while slow.counters.total < 2:  # both captions are with the judge: the run is mid-way
                assert process.poll() is None, process.communicate()
                time.sleep(0.01)
            process.send_signal(signal.SIGINT)
            out, err = process.communicate(timeout=120)
        finally:
            process.kill()
    assert process.returncode == 130, (out, err)
    assert err.strip() == (
        "interrupted; what was finished is kept: run the same command again (with --resume where it has one) to go on"
    )
