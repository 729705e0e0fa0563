"""A run folder is never trained into by surprise: refused, resumed (--resume) or replaced (--overwrite)."""

from __future__ import annotations

import pytest

from balcaprl.errors import ConfigError
from balcaprl.train.checkpointing import replace_run, resolve_resume, run_results


def earlier_run(folder, *, checkpoint=True, metrics="{}\n"):
    folder.mkdir()
    if checkpoint:
        (folder / "checkpoint-4").mkdir()
        (folder / "checkpoint-4" / "trainer_state.json").write_text('{"global_step": 4}')
    (folder / "metrics.jsonl").write_text(metrics)
    (folder / "recipe.yaml").write_text("name: earlier\n")
    return folder


def test_what_counts_as_an_earlier_run(tmp_path):
    assert run_results(tmp_path / "absent") == []
    assert run_results(earlier_run(tmp_path / "a")) == ["checkpoint-4", "metrics.jsonl"]
    assert run_results(earlier_run(tmp_path / "b", checkpoint=False, metrics="")) == []  # nothing trained yet
    stopped = earlier_run(tmp_path / "c", checkpoint=False)  # stopped before its first checkpoint
    assert run_results(stopped) == ["metrics.jsonl"]
    with pytest.raises(
        ConfigError, match=r"already holds a run \(metrics.jsonl\); pass --resume .* --overwrite"
    ):
        resolve_resume(stopped, False)
    with pytest.raises(ConfigError, match="no checkpoint-\\* folder .* pass --overwrite to start it again"):
        resolve_resume(stopped, True)


def test_overwrite_removes_the_earlier_run_entirely(tmp_path):
    run = earlier_run(tmp_path / "run")
    assert resolve_resume(run, True).name == "checkpoint-4"
    replace_run(run)
    assert not run.exists() and list(tmp_path.iterdir()) == []  # nothing left aside
    assert resolve_resume(run, False) is None
    replace_run(run)  # nothing there: nothing to do
