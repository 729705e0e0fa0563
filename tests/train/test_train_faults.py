"""`balcaprl train` on a full disk: one line naming the file (status 1), never a traceback."""

from __future__ import annotations

import errno
import os

import pytest
from test_train_cli import RECIPE_3B, tiny_overrides
from train_testkit import ScriptedJudge
from typer.testing import CliRunner

import balcaprl.judge
from balcaprl.cli import app


def run_train(tiny_llava, tiny_dataset, out, monkeypatch, judge):
    monkeypatch.setattr(balcaprl.judge, "build_judge", lambda cfg, **kwargs: judge)
    overrides = tiny_overrides(tiny_llava, tiny_dataset, out)
    return CliRunner().invoke(app, ["train", str(RECIPE_3B), *overrides], env={"COLUMNS": "60"})


def test_a_full_disk_in_training_is_one_line_naming_the_file(tiny_llava, tiny_dataset, tmp_path, monkeypatch):
    def fsync(fd: int) -> None:  # what a full disk does to the first record written
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", fsync)
    result = run_train(
        tiny_llava, tiny_dataset, tmp_path / "run", monkeypatch, ScriptedJudge(fail_every=None)
    )
    assert result.exit_code == 1, result.output
    last = result.output.strip().splitlines()[-1]
    assert (
        last.startswith(f"error: {tmp_path / 'run'}/")
        and ": No space left on device; free some space" in last
    )
    assert "Traceback" not in result.output and result.output.count("error:") == 1, result.output


def test_a_successful_run_ends_without_resource_warnings(tiny_llava, tiny_dataset, tmp_path):
    """A real process against a loopback judge over HTTP: the judge's session is closed on the
    trainer's reward loop before it stops, so nothing is left for the exit to complain about."""
    import subprocess
    import sys

    import yaml

    from balcaprl.testing.judge_server import JudgeServer
    from balcaprl.testing.scripted_judge import ScriptedJudge as ServedJudge

    with JudgeServer(ServedJudge()) as server:
        judge = tmp_path / "judge.yaml"
        judge.write_text(yaml.safe_dump({"base_url": server.base_url, "model": "m", "api_key_env": None,
                                         "cache_path": None}))  # fmt: skip
        args = ["train", str(RECIPE_3B.parent / "llava_1_5_7b.yaml"), "--judge", str(judge),
                *tiny_overrides(tiny_llava, tiny_dataset, tmp_path / "run")]  # fmt: skip
        env = {**os.environ, "COLUMNS": "100", "PYTHONPATH": os.pathsep.join(sys.path)}
        done = subprocess.run(
            [sys.executable, "-m", "balcaprl.cli", *args], capture_output=True, text=True, env=env
        )
    assert done.returncode == 0, done.stderr
    assert "done: 4 steps" in done.stdout and server.counters.total > 0
    for warning in ("Unclosed client session", "Unclosed connector", "was never awaited", "Traceback"):
        assert warning not in done.stderr, done.stderr


def test_ctrl_c_in_training_is_one_line_and_status_130(tiny_llava, tiny_dataset, tmp_path):
    """SIGINT to a real training process while its rollouts are with the judge."""
    import signal
    import subprocess
    import sys
    import time

    import yaml

    from balcaprl.testing.judge_server import JudgeServer
    from balcaprl.testing.scripted_judge import ScriptedJudge as ServedJudge

    with JudgeServer(ServedJudge(latency_s=600)) as server:
        judge = tmp_path / "judge.yaml"
        judge.write_text(yaml.safe_dump({"base_url": server.base_url, "model": "m", "api_key_env": None,
                                         "cache_path": None}))  # fmt: skip
        args = ["train", str(RECIPE_3B.parent / "llava_1_5_7b.yaml"), "--judge", str(judge),
                *tiny_overrides(tiny_llava, tiny_dataset, tmp_path / "run")]  # fmt: skip
        env = {**os.environ, "COLUMNS": "100", "PYTHONPATH": os.pathsep.join(sys.path)}
        process = subprocess.Popen([sys.executable, "-m", "balcaprl.cli", *args], env=env, text=True,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
        try:
            while server.counters.total == 0:  # the first rollouts are being judged
                assert process.poll() is None, process.communicate()
                time.sleep(0.01)
            process.send_signal(signal.SIGINT)
            _, err = process.communicate(timeout=300)
        finally:
            process.kill()
    assert process.returncode == 130, err
    assert err.strip().splitlines()[-1].startswith("interrupted; what was finished is kept"), err
    for noise in ("Traceback", 'File "', "Task was destroyed", "never awaited", "Unclosed"):
        assert noise not in err, err


def _file_size_limit(limit: int):
    def apply() -> None:  # in the child, before exec: writes past `limit` fail with EFBIG, not a signal
        import resource
        import signal

        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

    return apply


@pytest.mark.parametrize(
    ("limit", "writer"), [(300_000, "safetensors: model.safetensors"), (1_000_000, "torch: optimizer.pt")]
)
def test_a_checkpoint_the_system_refuses_to_write_is_one_line(
    tiny_policy, tiny_dataset, tmp_path, limit, writer
):
    """A real ``balcaprl train`` process whose files may not grow past ``limit`` bytes (the tiny
    policy's model.safetensors is ~645 KB, its optimizer.pt ~1.3 MB): the checkpoint's writer
    (safetensors, or torch's zip writer) fails mid-file as on a full disk, with its own error type and
    no errno. One line naming the folder, status 1; the run's earlier files are kept."""
    import subprocess
    import sys

    import yaml

    from balcaprl.testing.judge_server import JudgeServer
    from balcaprl.testing.scripted_judge import ScriptedJudge as ServedJudge

    with JudgeServer(ServedJudge()) as server:
        judge = tmp_path / "judge.yaml"
        judge.write_text(yaml.safe_dump({"base_url": server.base_url, "model": "m", "api_key_env": None,
                                         "cache_path": None}))  # fmt: skip
        run = tmp_path / "run"
        args = [
            "train",
            str(RECIPE_3B),
            "--judge",
            str(judge),
            *tiny_overrides(tiny_policy, tiny_dataset, run),
        ]
        env = {**os.environ, "COLUMNS": "60", "PYTHONPATH": os.pathsep.join(sys.path)}
        done = subprocess.run([sys.executable, "-m", "balcaprl.cli", *args], capture_output=True, text=True,
                              env=env, preexec_fn=_file_size_limit(limit), timeout=900)  # fmt: skip
    assert done.returncode == 1, (writer, done.stderr[-3000:])
    assert "Traceback" not in done.stderr and done.stderr.count("error:") == 1, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1] == (
        f"error: {run / '.partial' / 'checkpoint-4'}: File too large; what was finished is kept: run the same "
        "command again (with --resume where it has one) to go on"
    )
    assert not list(run.glob("checkpoint-*"))  # nothing half-written was published
