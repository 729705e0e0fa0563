"""`balcaprl train` on a full disk: one line naming the file (status 1), never a traceback."""

from __future__ import annotations

import errno
import os

from test_train_cli import RECIPE_3B, tiny_overrides
from train_testkit import ScriptedJudge
from typer.testing import CliRunner

import balcaprl.judge
from balcaprl.cli import app


def run_train(tiny_llava, tiny_dataset, out, monkeypatch, judge):
    monkeypatch.setattr(balcaprl.judge, "build_judge", lambda cfg, image_root=None, processes=1: judge)
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
