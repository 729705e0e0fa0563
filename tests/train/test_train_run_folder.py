"""A run folder is never trained into by surprise: refused, resumed (--resume) or replaced (--overwrite)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from balcaprl.errors import ConfigError
from balcaprl.train.checkpointing import replace_run, resolve_resume, run_results, write_manifest


def earlier_run(folder, *, checkpoint=True, metrics="{}\n"):
    folder.mkdir()
    if checkpoint:
        (folder / "checkpoint-4").mkdir()
        (folder / "checkpoint-4" / "trainer_state.json").write_text('{"global_step": 4}')
        (folder / "checkpoint-4" / "model.safetensors").write_bytes(b"")
        write_manifest(folder / "checkpoint-4")  # what a save writes last
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
    with pytest.raises(
        ConfigError, match="no complete checkpoint-\\* folder .* pass --overwrite to start it again"
    ):
        resolve_resume(stopped, True)


def test_overwrite_removes_the_earlier_run_entirely(tmp_path):
    run = earlier_run(tmp_path / "run")
    assert resolve_resume(run, True).name == "checkpoint-4"
    replace_run(run)
    assert not run.exists() and list(tmp_path.iterdir()) == []  # nothing left aside
    assert resolve_resume(run, False) is None
    replace_run(run)  # nothing there: nothing to do


class _Process:
    """Accelerate's PartialState as replace_run uses it: a rank, and a barrier shared by all ranks."""

    def __init__(self, main: bool, barrier: threading.Barrier):
        self.is_main_process = main
        self.barrier = barrier
        self.waited = False

    def wait_for_everyone(self):
        self.waited = True
        self.barrier.wait(timeout=30)


def test_under_a_launcher_only_the_main_process_replaces_the_run(tmp_path):
    run = earlier_run(tmp_path / "run")
    # A lone non-main process leaves the run alone (every rank deleting at once raced).
    other = _Process(main=False, barrier=threading.Barrier(1))
    replace_run(run, other)
    assert other.waited and run_results(run)
    # Eight ranks at once: the main one replaces; every rank waits for it, and none fails.
    barrier = threading.Barrier(8)
    ranks = [_Process(main=rank == 0, barrier=barrier) for rank in range(8)]
    with ThreadPoolExecutor(8) as pool:
        for done in [pool.submit(replace_run, run, rank) for rank in ranks]:
            done.result()
    assert all(rank.waited for rank in ranks)
    assert not run.exists() and list(tmp_path.iterdir()) == []
