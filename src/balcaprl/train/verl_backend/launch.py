"""Start a rendered verl run: check what can be checked before GPUs are spent, write the run folder's
files, then run ``python -m balcaprl.train.verl_backend.main <overrides>``.

Written into ``run.output_dir`` first: ``recipe.yaml`` (the resolved recipe), ``verl/overrides.txt`` (the
exact Hydra overrides, one per line), ``verl/command.sh`` (the same launch as a shell command) and, for
a recipe with an inline ``judge:`` mapping, ``verl/judge.yaml`` (what the reward workers read; the API
key stays in the environment variable it names).
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import subprocess
import sys
from pathlib import Path

from balcaprl.errors import ConfigError
from balcaprl.files import atomic_write_text
from balcaprl.recipe import Recipe
from balcaprl.train.verl_backend.export import SPLIT_FILES, read_export
from balcaprl.train.verl_backend.render import VerlLaunch


def preflight(recipe: Recipe, launch: VerlLaunch, *, require_gpu: bool = True) -> list[str]:
    """Problems that would make the job fail later (empty list: go)."""
    problems = []
    for module, what in (
        ("verl", "pip install -e '.[verl,vllm]' -c constraints/gpu-cluster.txt, as docs/gpu.md says"),
        ("transfer_queue", "pip install transferqueue"),
    ):
        if importlib.util.find_spec(module) is None:
            problems.append(f"{module} is not installed ({what})")
    values = launch.as_dict()
    train_file = Path(values["data.train_files"])
    try:
        manifest = read_export(train_file.parent)
    except FileNotFoundError as err:
        problems.append(str(err))
    else:
        if manifest.get("reference") != recipe.data.reference:
            problems.append(
                f"the verl export in {train_file.parent} holds {manifest.get('reference')!r} captions but the recipe "
                f"asks for data.reference={recipe.data.reference!r}; re-export with --reference "
                f"{recipe.data.reference} --overwrite"
            )
        for split in ("train", "eval"):
            if not (train_file.parent / SPLIT_FILES[split]).is_file():
                problems.append(
                    f"{train_file.parent / SPLIT_FILES[split]} is missing; re-run balcaprl verl export "
                    "with --overwrite"
                )
    judge = values.get("reward.custom_reward_function.reward_kwargs.judge_config")
    to_write = {Path(p).expanduser().resolve() for p in launch.files}
    if judge and Path(judge).expanduser().resolve() not in to_write and not Path(judge).is_file():
        problems.append(f"judge config {judge} not found")
    if require_gpu:
        import torch

        from balcaprl.train.driver import check_driver

        try:
            check_driver()
        except ConfigError as error:
            problems.append(str(error))
        if not torch.cuda.is_available():
            problems.append(
                "no CUDA GPU visible: verl's FSDP workers and vLLM rollouts need GPUs (--dry-run renders only)"
            )
    return problems


def write_run_files(recipe: Recipe, launch: VerlLaunch, python: str = "python3") -> Path:
    """Write the files listed in the module docstring; returns the overrides file."""
    out = Path(recipe.run.output_dir).expanduser().resolve()
    (out / "verl").mkdir(parents=True, exist_ok=True)
    for path, text in launch.files.items():
        path = Path(path).expanduser().resolve()
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, text)
    atomic_write_text(out / "recipe.yaml", recipe.to_yaml())
    overrides = out / "verl" / "overrides.txt"
    atomic_write_text(overrides, launch.to_text(["verl overrides rendered by `balcaprl verl launch`"]))
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in launch.env.items())
    command = " ".join(shlex.quote(part) for part in launch.command(python))
    atomic_write_text(
        out / "verl" / "command.sh", f'#!/usr/bin/env bash\nset -euo pipefail\n{env} {command} "$@"\n'
    )
    return overrides


def run_verl(recipe: Recipe, launch: VerlLaunch) -> int:
    """Preflight, write the run files, run verl in a child process; returns its exit code."""
    problems = preflight(recipe, launch)
    if problems:
        raise ConfigError("cannot start the verl run:\n  " + "\n  ".join(problems))
    write_run_files(recipe, launch, sys.executable)
    env = {**os.environ, **launch.env}
    return subprocess.run(launch.command(sys.executable), env=env, check=False).returncode
