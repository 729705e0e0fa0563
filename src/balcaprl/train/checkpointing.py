"""Runs users can trust: where to resume from, and refusing to resume into a different run.

A run folder holds
    recipe.yaml          the resolved recipe the run started with
    checkpoint-N/        every run.save_steps steps (model, optimizer, scheduler, RNG states, trainer state)
    metrics.jsonl        one line per step
    rollouts.jsonl       optional, every rollout of every Nth step
    final/               the final policy and processor

A checkpoint is written aside, in ``.partial/checkpoint-N/``, and published into the run folder by
one rename once every process has finished writing it (:class:`AtomicCheckpoints`; ``final/`` the
same way, :func:`save_final_model`), so ``checkpoint-N/`` is either complete or absent: a full disk
or a kill mid-save leaves the previous checkpoints as they were. A write the system refuses while a
checkpoint is saved (a full disk, a file-size limit) is an ``OSError`` naming the folder, whatever
library wrote the file (torch's zip writer and safetensors report it as their own errors), so the
command line says it in one line (:func:`save_failure`).

A checkpoint is complete only when it says so: its last file, written after every process finished
its part, is a manifest (:data:`MANIFEST`) with the size and hash of every other file
(:func:`write_manifest`). ``--resume`` takes the newest checkpoint whose files match their manifest;
one that does not (cut short, truncated or damaged since, or with no manifest) is skipped with one
line saying why (:func:`latest_checkpoint`). The hash is xxHash's XXH3-128: a checkpoint of a 3B
model is 42 GiB, and XXH3 reads at the speed of memory (3.2 GB/s on one core here, against 0.36 GB/s
for sha256), so checking costs less than the resume's own loading of the same bytes. It is a check
against accidents (a truncation, a damaged block), not against forgery: whoever can write the run
folder can write the manifest too.

Under FSDP with ``SHARDED_STATE_DICT`` (``configs/accelerate/fsdp.yaml``) each process writes its
own shard of the weights and optimizer (``pytorch_model_fsdp_0/``, ``optimizer_0/``), once, without
gathering them; ``final/`` is still the whole model, gathered once at the end and written with
``save_pretrained`` (what ``from_pretrained`` and ``balcaprl caption`` load).

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

import errno
import json
import os
import re
import resource
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import xxhash
import yaml
from transformers import TrainerCallback

from balcaprl.errors import ConfigError
from balcaprl.files import atomic_write_text, naming
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


STAGING_DIR = ".partial"  # checkpoints being written, inside the run folder (same file system: rename)
# What a checkpoint holds weights in: plain or sharded safetensors, an FSDP shard folder or file (the
# SHARDED_STATE_DICT form, or FULL_STATE_DICT's extra copy), a DeepSpeed folder, a peft adapter.
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model_fsdp_0",
    "pytorch_model_fsdp.bin",
    "adapter_model.safetensors",
)


MANIFEST = "balcaprl_checkpoint.json"  # written last: the checkpoint's word that it is complete
_HASH = "xxh3_128"
_READ_BYTES = 8 * 2**20


def _file_hash(path: Path) -> str:
    digest = xxhash.xxh3_128()
    with open(path, "rb") as handle:
        while block := handle.read(_READ_BYTES):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(folder: Path) -> None:
    """The manifest of the finished checkpoint ``folder``: every file under it with its size and hash
    (module docstring), written atomically and last."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)
    entries = {
        p.relative_to(folder).as_posix(): {"bytes": p.stat().st_size, _HASH: _hash_once(p)} for p in files
    }
    atomic_write_text(folder / MANIFEST, json.dumps({"version": 1, "files": entries}, indent=1) + "\n")


_HASHED: dict[tuple[str, int, int, int], str] = {}  # (file, size, mtime, inode) -> its hash


def _hash_once(path: Path) -> str:
    """:func:`_file_hash`, once per process for a file that has not changed since (``--resume`` checks
    twice: for the refusals, then to resume; a checkpoint is tens of GiB)."""
    stat = path.stat()
    key = (str(path), stat.st_size, stat.st_mtime_ns, stat.st_ino)
    if key not in _HASHED:
        _HASHED[key] = _file_hash(path)
    return _HASHED[key]


def manifest_problem(checkpoint: Path) -> str | None:
    """What in ``checkpoint`` does not match its manifest (None: every file does)."""
    manifest = checkpoint / MANIFEST
    if not manifest.is_file():
        return f"no {MANIFEST}: cut short, or saved before balcaprl checked its checkpoints"
    try:
        files = json.loads(manifest.read_text(encoding="utf-8"))["files"]
        listed = {str(name): (int(entry["bytes"]), str(entry[_HASH])) for name, entry in files.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return f"{MANIFEST} unreadable"
    for name, (size, digest) in sorted(listed.items()):
        path = checkpoint / name
        try:
            actual = path.stat().st_size
            if actual != size:
                return f"{name} has {actual:,} bytes, {size:,} were written"
            if _hash_once(path) != digest:
                return f"{name} is not what was written (its hash differs)"
        except FileNotFoundError:
            return f"{name} is missing"
        except OSError as error:
            return f"{name} cannot be read ({error.strerror or error})"
    return None


def incomplete_reason(checkpoint: Path) -> str | None:
    """Why ``checkpoint`` cannot be resumed from (None when it is complete): no trainer state or
    weights (cut short), or files that do not match its manifest (:func:`manifest_problem`)."""
    state = checkpoint / "trainer_state.json"
    try:
        json.loads(state.read_text(encoding="utf-8"))["global_step"]
    except FileNotFoundError:
        return "no trainer_state.json"
    except (OSError, ValueError, KeyError, TypeError):
        return "trainer_state.json unreadable"
    has_weights = any((checkpoint / name).exists() for name in WEIGHT_FILES)
    if not has_weights and not any(checkpoint.glob("global_step*")):  # DeepSpeed's own folder
        return "no model weights"
    return manifest_problem(checkpoint)


def latest_checkpoint(output_dir: Path | str, report: Callable[[str], None] | None = None) -> Path | None:
    """The newest complete ``checkpoint-N`` in ``output_dir``; newer incomplete ones are skipped, each
    with one line to ``report``."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return None
    numbered = []
    for path in output_dir.glob("checkpoint-*"):
        suffix = path.name.removeprefix("checkpoint-")
        if path.is_dir() and suffix.isdigit():
            numbered.append((int(suffix), path))
    for _, path in sorted(numbered, reverse=True):
        reason = incomplete_reason(path)
        if reason is None:
            return path
        if report is not None:
            report(f"skipping {path}: incomplete ({reason}); resuming from an earlier checkpoint")
    return None


def _fsync_tree(folder: Path) -> None:
    """Flush every file under ``folder`` and the folders themselves, so a published checkpoint is on
    disk before its name is."""
    for path in sorted(folder.rglob("*"), reverse=True):
        if path.is_file():
            with open(path, "rb") as handle, naming(path):
                os.fsync(handle.fileno())
    _fsync_dir(folder)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        with naming(folder):
            os.fsync(fd)
    finally:
        os.close(fd)


def save_failure(folder: Path, error: Exception) -> OSError:
    """The ``OSError`` behind a checkpoint write that failed with a writer's own error (torch's zip
    writer: ``RuntimeError: ... unexpected pos``; safetensors: ``SafetensorError``), which carries no
    errno: the one its message quotes (safetensors: ``(os error 28)``), else a full file system
    (ENOSPC), a file at the process's file-size limit (EFBIG), else an I/O error that quotes the
    writer."""
    quoted = re.search(r"\(os error (\d+)\)", str(error))
    if quoted is not None:
        code = int(quoted.group(1))
        return OSError(code, os.strerror(code), str(folder))
    try:
        usage = os.statvfs(folder)
        full = usage.f_bavail * usage.f_frsize < _READ_BYTES
    except OSError:
        full = False
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    at_limit = limit != resource.RLIM_INFINITY and any(
        p.is_file() and p.stat().st_size >= limit for p in folder.rglob("*")
    )
    code = errno.ENOSPC if full else errno.EFBIG if at_limit else errno.EIO
    reason = os.strerror(code) + (
        "" if full or at_limit else f" (the writer said: {str(error).splitlines()[0]})"
    )
    return OSError(code, reason, str(folder))


def _writer_errors() -> tuple[type[Exception], ...]:
    from safetensors import SafetensorError

    return (RuntimeError, SafetensorError)


def publish(staged: Path, target: Path) -> None:
    """Move the finished folder ``staged`` to ``target`` in one rename (an existing ``target``, e.g. the
    same step saved again after a resume, is moved aside first and deleted after)."""
    _fsync_tree(staged)
    old = None
    if target.exists():
        old = target.parent / STAGING_DIR / f"{target.name}.replaced"
        shutil.rmtree(old, ignore_errors=True)
        os.rename(target, old)
    os.rename(staged, target)
    _fsync_dir(target.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


class AtomicCheckpoints:
    """Trainer mixin: ``checkpoint-N`` is written under ``OUTPUT/.partial/`` and published by
    :func:`publish` once every process has written its part; older checkpoints are then rotated out
    (``save_total_limit``) in the run folder itself.

    The Trainer (and TRL's ``_save_checkpoint``) place a checkpoint at ``_get_output_dir()/checkpoint-N``,
    so redirecting that one method while a checkpoint is saved is enough.
    """

    _staging_checkpoint = False

    def _get_output_dir(self, trial: Any) -> str:
        run_dir = super()._get_output_dir(trial)  # type: ignore[misc]
        return os.path.join(run_dir, STAGING_DIR) if self._staging_checkpoint else run_dir

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints

        run_dir = Path(self._get_output_dir(trial))
        name = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"  # type: ignore[attr-defined]
        staged = run_dir / STAGING_DIR / name
        accelerator, args = self.accelerator, self.args  # type: ignore[attr-defined]
        if args.should_save:
            shutil.rmtree(staged, ignore_errors=True)  # left by a save that was cut short
        accelerator.wait_for_everyone()
        self._staging_checkpoint = True
        try:
            super()._save_checkpoint(model, trial)  # type: ignore[misc]
        except _writer_errors() as error:
            raise save_failure(staged, error) from error
        finally:
            self._staging_checkpoint = False
        accelerator.wait_for_everyone()  # every shard written
        if args.should_save:
            write_manifest(staged)  # last: the checkpoint's word that it is complete
            publish(staged, run_dir / name)
            rotate_checkpoints(
                output_dir=str(run_dir),
                save_total_limit=args.save_total_limit,
                best_model_checkpoint=self.state.best_model_checkpoint,  # type: ignore[attr-defined]
                use_mtime=True,
            )
        accelerator.wait_for_everyone()


def _sharded_state_dict(trainer: Any) -> bool:
    if not getattr(trainer, "is_fsdp_enabled", False):
        return False
    return "FULL_STATE_DICT" not in str(trainer.accelerator.state.fsdp_plugin.state_dict_type)


def save_final_model(trainer: Any, final_dir: Path) -> None:
    """The whole policy (and processor) in ``final_dir``, written aside and published in one rename.

    With FSDP's sharded checkpoints the Trainer's ``save_model`` writes no weights, so the full state
    dict is gathered here (accelerate's ``get_state_dict``: on every process, CPU copy on the main one)
    and written with ``save_pretrained`` like any other checkpoint.
    """
    staged = final_dir.parent / STAGING_DIR / final_dir.name
    if trainer.args.should_save:
        shutil.rmtree(staged, ignore_errors=True)
    trainer.accelerator.wait_for_everyone()
    try:
        if _sharded_state_dict(trainer):
            state_dict = trainer.accelerator.get_state_dict(trainer.model)
            if trainer.args.should_save:
                trainer._save(str(staged), state_dict=state_dict)
        else:
            trainer.save_model(str(staged))
    except _writer_errors() as error:
        raise save_failure(staged, error) from error
    trainer.accelerator.wait_for_everyone()
    if trainer.args.should_save:
        publish(staged, final_dir)
    trainer.accelerator.wait_for_everyone()


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


def resolve_resume(
    output_dir: Path | str, resume: bool | str | Path, report: Callable[[str], None] | None = None
) -> Path | None:
    """The checkpoint to resume from, or None for a fresh run; refuses to clobber an existing run.
    ``report`` gets one line for each incomplete checkpoint passed over."""
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
        found = latest_checkpoint(output_dir, report)
        if found is None:
            raise ConfigError(
                f"--resume: no complete checkpoint-* folder in {output_dir} to resume from"
                + ("; pass --overwrite to start it again" if run_results(output_dir) else "")
            )
        return found
    checkpoint = Path(resume)
    checkpoint_step(checkpoint)  # validates
    reason = incomplete_reason(checkpoint)
    if reason is not None:
        raise ConfigError(f"--resume-from {checkpoint}: an incomplete checkpoint ({reason})")
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
