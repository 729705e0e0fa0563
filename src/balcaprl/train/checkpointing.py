"""Runs users can trust: where to resume from, and refusing to resume into a different run.

A run folder holds
    recipe.yaml          the resolved recipe the run started with
    checkpoint-N/        every run.save_steps steps (model, optimizer, scheduler, RNG states, trainer state)
    metrics.jsonl        one line per step
    rollouts.jsonl       optional, every rollout of every Nth step
    final/               the final policy and processor

A folder that already holds a run (a checkpoint, the final policy, or metrics) is refused for a new
run; ``--resume`` continues it and ``--overwrite`` replaces it (:func:`replace_run`: the old run is
moved aside in one rename, then deleted, so the folder never mixes two runs' files).

``--resume`` restarts from the newest checkpoint: the Trainer restores weights, optimizer, scheduler,
RNG states and the step count, and skips the prompts already used, so the data order goes on exactly
as in an uninterrupted run (the prompt order is seeded per epoch, see ``EpochSeededRepeatSampler``).
Lines that metrics.jsonl and rollouts.jsonl gained after that checkpoint are dropped first, so the
files read as if the run had never stopped. A resume with a recipe that would change the run (other
than how it is logged or observed) is refused unless asked for.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import yaml
from transformers import TrainerCallback

from balcaprl.errors import ConfigError
from balcaprl.files import atomic_write_text
from balcaprl.recipe import Recipe
from balcaprl.train.metrics import read_jsonl

RECIPE_FILE = "recipe.yaml"
LOG_FILES = ("metrics.jsonl", "rollouts.jsonl")
# Recipe keys a resumed run may change: how a run is observed, when it stops, and the judge endpoint.
RESUMABLE_CHANGES = (
    "name",
    "description",
    "judge",
    "run.report_to",
    "run.run_name",
    "run.progress",
    "run.log_rollouts_every",
    "run.save_total_limit",
    "run.save_final_model",
    "train.stop_after_step",
    "train.dataloader_num_workers",
    "data.path",
    "model.path",
)


def latest_checkpoint(output_dir: Path | str) -> Path | None:
    from transformers.trainer_utils import get_last_checkpoint

    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return None
    found = get_last_checkpoint(str(output_dir))
    return Path(found) if found else None


def checkpoint_step(checkpoint: Path) -> int:
    state = Path(checkpoint) / "trainer_state.json"
    if not state.is_file():
        raise ConfigError(f"{checkpoint} is not a training checkpoint (no trainer_state.json)")
    return int(json.loads(state.read_text())["global_step"])


def run_results(output_dir: Path | str) -> list[str]:
    """What in ``output_dir`` belongs to an earlier run: checkpoints, the final policy, metrics."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return []
    found = sorted(p.name for p in output_dir.glob("checkpoint-*") if p.is_dir())
    if (output_dir / "final").is_dir():
        found.append("final/")
    found += [
        name for name in LOG_FILES if (output_dir / name).is_file() and (output_dir / name).stat().st_size
    ]
    return found


def replace_run(output_dir: Path | str, processes: Any = None) -> None:
    """``--overwrite``: take an earlier run out of ``output_dir`` (one atomic rename aside, then
    deleted; checkpoints are large, so two runs are never kept side by side).

    ``processes`` is accelerate's ``PartialState`` under a launcher, where every process runs the
    command: only the main process replaces the run, and all wait for it before going on.
    """
    try:
        if processes is None or processes.is_main_process:
            _replace_run(Path(output_dir))
    finally:
        if processes is not None:
            processes.wait_for_everyone()


def _replace_run(output_dir: Path) -> None:
    if not run_results(output_dir):
        return
    aside = output_dir.parent / f".{output_dir.name}.replaced"
    shutil.rmtree(aside, ignore_errors=True)
    os.rename(output_dir, aside)
    shutil.rmtree(aside)


def resolve_resume(output_dir: Path | str, resume: bool | str | Path) -> Path | None:
    """The checkpoint to resume from, or None for a fresh run; refuses to clobber an existing run."""
    output_dir = Path(output_dir)
    if resume is False or resume is None:
        existing = run_results(output_dir)
        if existing:
            shown = ", ".join(existing[:3]) + (", ..." if len(existing) > 3 else "")
            raise ConfigError(
                f"run.output_dir {output_dir} already holds a run ({shown}); pass --resume to continue it, "
                "--overwrite to replace it, or choose another run.output_dir"
            )
        return None
    if resume is True:
        found = latest_checkpoint(output_dir)
        if found is None:
            raise ConfigError(
                f"--resume: no checkpoint-* folder in {output_dir} to resume from"
                + ("; pass --overwrite to start it again" if run_results(output_dir) else "")
            )
        return found
    checkpoint = Path(resume)
    checkpoint_step(checkpoint)  # validates
    return checkpoint


def _flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict):
        flat: dict[str, Any] = {}
        for key, value in data.items():
            flat.update(_flatten(value, f"{prefix}{key}."))
        return flat or {prefix.rstrip("."): {}}
    return {prefix.rstrip("."): data}


def recipe_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Keys whose values differ and that a resume must not change, as 'key: old -> new' lines."""
    before, after = _flatten(old), _flatten(new)
    changes = []
    for key in sorted(set(before) | set(after)):
        if any(key == k or key.startswith(k + ".") for k in RESUMABLE_CHANGES):
            continue
        if before.get(key) != after.get(key):
            changes.append(f"{key}: {before.get(key)!r} -> {after.get(key)!r}")
    return changes


def write_recipe_snapshot(output_dir: Path, recipe: Recipe) -> None:
    output_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(output_dir / RECIPE_FILE, recipe.to_yaml())


def check_resumable(output_dir: Path, recipe: Recipe, allow_changes: bool) -> None:
    snapshot = output_dir / RECIPE_FILE
    if not snapshot.is_file():
        return
    changes = recipe_changes(yaml.safe_load(snapshot.read_text()) or {}, recipe.to_dict())
    if changes and not allow_changes:
        raise ConfigError(
            f"the recipe differs from the one {output_dir} was started with ({RECIPE_FILE}); resuming would not "
            "continue the same run:\n  "
            + "\n  ".join(changes)
            + "\npass --allow-recipe-change to resume anyway"
        )


def truncate_logs(output_dir: Path, step: int) -> None:
    """Drop log lines written after ``step`` (and summaries), so a resumed run's files read seamlessly."""
    for name in LOG_FILES:
        path = output_dir / name
        if not path.exists():
            continue
        kept = [r for r in read_jsonl(path) if r.get("step", 0) <= step and r.get("kind") != "summary"]
        text = "".join(json.dumps(r) + "\n" for r in kept)
        atomic_write_text(path, text)


class StopAfterStep(TrainerCallback):
    """Checkpoint and stop once ``step`` optimizer steps are done; the LR schedule is left as planned."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= self.step:
            control.should_save = True
            control.should_training_stop = True
        return control
