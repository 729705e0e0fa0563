"""One writer per output place: a second command on a place another process is writing is refused in
one line (status 2) before it pays for anything, and a killed writer never blocks the next run."""

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
from PIL import Image
from typer.testing import CliRunner

from balcaprl.cli import app
from balcaprl.errors import OutputError
from balcaprl.outputs import lock_output, release_output_locks
from balcaprl.testing.judge_server import JudgeServer
from balcaprl.testing.scripted_judge import ScriptedJudge

RECIPE_3B = Path(__file__).resolve().parents[1] / "configs" / "qwen2_5_vl_3b.yaml"
IN_USE = "is in use by another balcaprl command"
HOLDER = (
    "import sys; from balcaprl.outputs import lock_output; lock_output(sys.argv[1]); print('held', flush=True); "
    "sys.stdin.read()"
)


def balcaprl(*args: str, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "COLUMNS": "100", "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.Popen(
        [sys.executable, "-m", "balcaprl.cli", *args], env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs,
    )  # fmt: skip


@pytest.fixture()
def ws(tmp_path: Path) -> Path:
    (tmp_path / "images").mkdir()
    for i in range(3):
        Image.new("RGB", (16, 16), (40 * i, 10, 10)).save(tmp_path / "images" / f"{i}.png")
    (tmp_path / "captions.jsonl").write_text(
        "".join(json.dumps({"image": f"{i}.png", "caption": "A red door."}) + "\n" for i in range(3))
    )
    (tmp_path / "references.json").write_text(json.dumps({f"{i}.png": "A red door." for i in range(3)}))
    return tmp_path


def judge_yaml(path: Path, base_url: str) -> Path:
    path.write_text(yaml.safe_dump({"base_url": base_url, "model": "m", "api_key_env": None, "cache_path": None,
                                    "max_retries": 0, "timeout_s": 120}))  # fmt: skip
    return path


def score_args(ws: Path, judge: Path, *extra: str) -> list[str]:
    return ["score", "--images", str(ws / "images"), "--captions", str(ws / "captions.jsonl"), "--references",
            str(ws / "references.json"), "--judge", str(judge), "--out", str(ws / "out"), "--no-progress", *extra]  # fmt: skip


def wait_for_lock(lock: Path, pid: int, process: subprocess.Popen) -> None:
    for _ in range(6000):  # polls, not a timing assertion: the writer takes the lock before its first call
        if lock.exists() and lock.read_text().strip() == str(pid):
            return
        assert process.poll() is None, process.communicate()
        time.sleep(0.01)
    raise AssertionError(f"{lock} was never taken")


def test_a_second_score_on_a_busy_folder_is_refused_and_a_killed_one_blocks_nothing(ws: Path):
    with JudgeServer(ScriptedJudge(latency_s=600)) as slow, JudgeServer(ScriptedJudge()) as fast:
        first = balcaprl(*score_args(ws, judge_yaml(ws / "slow.yaml", slow.base_url)))
        try:
            wait_for_lock(ws / ".out.lock", first.pid, first)
            for flags in ((), ("--resume",), ("--overwrite",)):
                second = balcaprl(*score_args(ws, judge_yaml(ws / "fast.yaml", fast.base_url), *flags))
                out, err = second.communicate(timeout=120)
                assert second.returncode == 2, (out, err)
                assert err.strip() == (
                    f"error: --out {ws / 'out'} {IN_USE} (pid {first.pid}); wait for it to finish or choose "
                    "another place (one writer per output place)"
                )
            assert fast.counters.total == 0  # refused before any call
        finally:
            first.send_signal(signal.SIGKILL)
            first.communicate()
        third = balcaprl(*score_args(ws, ws / "fast.yaml", "--resume"))
        out, err = third.communicate(timeout=300)
    assert third.returncode == 0, (out, err)  # the killed writer's lock died with it
    assert len((ws / "out" / "scores.jsonl").read_text().splitlines()) == 3
    assert not (ws / ".out.lock").exists()  # released and removed at the end


@pytest.fixture()
def holder(tmp_path: Path):
    """``holder(place)``: another process that holds the lock on ``place`` until the test ends."""
    started: list[subprocess.Popen] = []

    def hold(place: Path) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        process = subprocess.Popen([sys.executable, "-c", HOLDER, str(place)], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, text=True, env=env)  # fmt: skip
        started.append(process)
        assert process.stdout.readline().strip() == "held"

    yield hold
    for process in started:
        process.communicate(input="")


def test_every_command_refuses_a_place_another_process_writes(ws: Path, holder, tmp_path: Path):
    from balcaprl.synthetic.build import build_dataset

    data = build_dataset(tmp_path / "data", n_train=2, n_eval=1, seed=0)
    judge = judge_yaml(ws / "refusing.yaml", "http://127.0.0.1:9/v1")
    commands = {
        "score": (ws / "out", score_args(ws, judge, "--resume")),
        "evaluate": (ws / "ev", ["evaluate", "--captions", str(ws / "captions.jsonl"), "--out", str(ws / "ev"),
                                 "--suite", "caparena", "--judge", str(judge), "--no-progress"]),
        "caption": (ws / "caps.jsonl", ["caption", "--model", "m", "--images", str(ws / "images"), "--out",
                                        str(ws / "caps.jsonl"), "--no-progress"]),
        "data recaption": (data, ["data", "recaption", "--data", str(data), "--model", "m", "--judge-config",
                                  str(judge), "--no-progress"]),
        "synthetic build": (ws / "built", ["synthetic", "build", "--out", str(ws / "built"), "--n-train", "1",
                                           "--n-eval", "1"]),
        "train": (ws / "run", ["train", str(RECIPE_3B), f"data.path={data}", f"run.output_dir={ws / 'run'}",
                               "judge.cache_path=null", "--resume"]),
    }  # fmt: skip
    env = {"COLUMNS": "100", "OPENAI_API_KEY": "sk-placeholder-never-sent", "HF_HUB_OFFLINE": "1"}
    for name, (place, args) in commands.items():
        holder(place)
        result = CliRunner().invoke(app, args, env=env)
        assert result.exit_code == 2, (name, result.output)
        assert f"{place} {IN_USE}" in " ".join(result.output.split()), (name, result.output)
        assert result.output.count("error:") == 1 and "Traceback" not in result.output


def test_a_process_may_claim_its_own_place_twice_and_releases_it(tmp_path: Path):
    first = lock_output(tmp_path / "out")
    assert lock_output(tmp_path / "out") == first == tmp_path / ".out.lock"
    release_output_locks()
    assert not first.exists()
    lock_output(tmp_path / "out")  # free again
    release_output_locks()


def test_one_place_named_through_a_symlink_has_one_lock(tmp_path: Path, holder):
    (tmp_path / "real").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "real", target_is_directory=True)
    holder(tmp_path / "real")
    with pytest.raises(OutputError, match=f"--out {tmp_path / 'alias'} {IN_USE}"):
        lock_output(tmp_path / "alias")


def test_a_lock_file_planted_as_a_link_is_refused_and_its_target_untouched(ws: Path):
    """A real ``score`` process (its judge unreachable): ``.out.lock`` links to a user's file. The
    command must neither write its PID through the link nor delete it, and says so in one line."""
    victim = ws / "notes.txt"
    victim.write_text("precious\n")
    (ws / ".out.lock").symlink_to(victim)
    judge = judge_yaml(ws / "refusing.yaml", "http://127.0.0.1:9/v1")
    process = balcaprl(*score_args(ws, judge))
    out, err = process.communicate(timeout=120)
    assert process.returncode == 2, (out, err)
    assert err.strip() == (
        f"error: --out {ws / 'out'}: its lock file {ws / '.out.lock'} is a symbolic link to {victim}; balcaprl "
        "never writes through a link: remove the link (what it points at is left as it is) and run again"
    )
    assert victim.read_text() == "precious\n" and (ws / ".out.lock").is_symlink()
    assert not (ws / "out").exists()


@pytest.mark.parametrize("plant", ["dangling link", "hard link", "fifo"])
def test_no_lock_is_taken_through_anything_but_a_plain_file_of_its_own(tmp_path: Path, plant: str):
    lock = tmp_path / ".out.lock"
    victim = tmp_path / "victim"
    if plant == "dangling link":
        lock.symlink_to(victim)  # O_CREAT through it would create the victim
    elif plant == "hard link":
        victim.write_text("precious\n")
        os.link(victim, lock)
    else:
        os.mkfifo(lock)
    with pytest.raises(OutputError, match="balcaprl never writes through a link"):
        lock_output(tmp_path / "out")
    assert victim.read_text() == "precious\n" if plant == "hard link" else not victim.exists()
    release_output_locks()
