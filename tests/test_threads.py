"""One torch thread by default for CPU runs of every command that trains or generates (as the demo)."""

from __future__ import annotations

import pytest
import torch
from typer.main import get_command
from typer.testing import CliRunner

from balcaprl import threads
from balcaprl.cli import app

# Every command that trains or generates with a local model (the demo has its own `threads` setting).
TRAINS_OR_GENERATES = [("train",), ("synthetic", "sft"), ("synthetic", "caption"), ("caption",)]


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def command(path):
    found = get_command(app)
    for name in path:
        found = found.commands[name]
    return found


@pytest.mark.parametrize("path", TRAINS_OR_GENERATES, ids=" ".join)
def test_every_command_that_trains_or_generates_has_threads_defaulting_to_one(path):
    option = next(p for p in command(path).params if "--threads" in getattr(p, "opts", ()))
    assert option.default == threads.DEFAULT_CPU_THREADS == 1


def test_threads_are_set_on_the_cpu_only(restore_threads):
    torch.set_num_threads(2)
    assert threads.use_cpu_threads(3, on_cpu=False) is False and torch.get_num_threads() == 2
    assert threads.use_cpu_threads(1, on_cpu=True) is True and torch.get_num_threads() == 1
    with pytest.raises(ValueError, match="--threads must be >= 1"):
        threads.use_cpu_threads(0, on_cpu=True)


class _Stop(Exception):
    pass


@pytest.mark.parametrize(
    "args, on_cpu",
    [
        (["synthetic", "sft", "--data", "d", "--out", "o"], True),
        (["synthetic", "caption", "--policy", "p", "--data", "d", "--threads", "2"], True),
    ],
)
def test_the_commands_pin_threads_before_any_work(monkeypatch, args, on_cpu, restore_threads):
    calls = []

    def record(n, on_cpu=None):
        calls.append((n, on_cpu))
        raise _Stop  # the first thing the command does with torch

    monkeypatch.setattr(threads, "use_cpu_threads", record)
    result = CliRunner().invoke(app, args)
    assert isinstance(result.exception, _Stop), result.output
    assert calls == [(2 if "--threads" in args else 1, on_cpu)]


def test_train_pins_threads_for_a_cpu_recipe(monkeypatch, tmp_path, restore_threads):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        "model: {path: m}\ndata: {path: d}\nrun: {output_dir: o}\ntrain: {use_cpu: true, precision: fp32}\n"
    )
    calls = []

    def record(n, on_cpu=None):
        calls.append((n, on_cpu))
        raise _Stop

    monkeypatch.setattr(threads, "use_cpu_threads", record)
    result = CliRunner().invoke(app, ["train", str(recipe)])
    assert isinstance(result.exception, _Stop), result.output
    assert calls == [(1, True)]
