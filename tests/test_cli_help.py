"""What a person reads in the command line: plain value kinds, help for every option, one name per
idea (old spellings kept, hidden), examples in the help, and a server that stops without advice."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from balcaprl.cli import app
from balcaprl.cli.common import plain_kind

SRC = Path(__file__).resolve().parents[1] / "src"


def leaf_commands(command=None, path=()):
    command = command or get_command(app)
    for name, sub in getattr(command, "commands", {}).items():
        yield from leaf_commands(sub, (*path, name))
    if not hasattr(command, "commands"):
        yield path, command


LEAVES = sorted(path for path, _ in leaf_commands())


@pytest.mark.parametrize(
    ("label", "plain"),
    [
        ("<list[str]>", "TEXT"),
        ("<float range>", "NUMBER"),
        ("<int range>", "INTEGER"),
        ("<file>", "FILE"),
        ("<directory>", "DIR"),
        ("<path>", "PATH"),
        ("<str>", "TEXT"),
        ("<a|b>", "a|b"),
    ],  # fmt: skip
)
def test_typer_labels_become_plain_kinds(label, plain):
    assert plain_kind(label) == plain


@pytest.mark.parametrize("path", LEAVES, ids=" ".join)
def test_every_help_screen_names_plain_kinds_and_helps_every_option(path):
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "60"})
    assert result.exit_code == 0, result.output
    assert not re.search(r"<(list\[|str>|int|float|path>|file>|directory>)", result.output), result.output
    command = dict(leaf_commands())[path]
    bare = [
        p.opts for p in command.params if not p.hidden and p.name != "help" and not getattr(p, "help", None)
    ]
    assert not bare, f"options without help: {bare}"


@pytest.mark.parametrize("path", LEAVES, ids=" ".join)
def test_a_usage_line_shows_no_hidden_old_spelling(path):
    help_text = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "60"}).output
    usage = help_text.split("\n\n", 1)[0]  # the usage line, however it wraps
    command = dict(leaf_commands())[path]
    for param in command.params:
        if param.hidden:
            assert param.name not in usage and not any(o in usage for o in param.opts), (param.name, usage)
    if path == ("data", "info"):  # the old DIR positional is hidden; the usage names what the help lists
        assert " ".join(usage.split()) == "Usage: balcaprl data info [OPTIONS]"


def test_old_spellings_still_run_and_are_hidden(tmp_path):
    runner = CliRunner()
    built = runner.invoke(
        app, ["synthetic", "build", "--out", str(tmp_path / "d"), "--n-train", "2", "--n-eval", "2"]
    )
    assert built.exit_code == 0, built.output
    for args in (["--data", str(tmp_path / "d")], [str(tmp_path / "d")]):  # the new name, the old DIR
        result = runner.invoke(app, ["data", "info", *args, "--json", "--png", str(tmp_path / "h.png")])
        assert result.exit_code == 0, (args, result.output)
    assert "judge-config" not in runner.invoke(app, ["data", "recaption", "--help"]).output
    missing = runner.invoke(app, ["data", "recaption", "--data", str(tmp_path / "d"), "--model", "m"])
    assert missing.exit_code == 2 and "give --judge" in missing.output


@pytest.mark.filterwarnings("ignore::ResourceWarning")
def test_judge_serve_stops_on_ctrl_c_without_resume_advice():
    environment = {**os.environ, "PYTHONPATH": str(SRC)}
    server = subprocess.Popen(
        [sys.executable, "-m", "balcaprl.cli", "judge", "serve", "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment,
    )  # fmt: skip
    try:
        assert server.stdout.readline().startswith("balcaprl judge server: ")
        server.send_signal(signal.SIGINT)
        _, stderr = server.communicate(timeout=30)
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()
    assert server.returncode == 0, stderr
    assert "--resume" not in stderr and "stopped" in stderr


@pytest.mark.parametrize("path", LEAVES, ids=" ".join)
def test_every_help_screen_ends_with_an_example_of_that_command(path):
    from test_docs import check_commands

    help_text = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "60"}).output
    assert "Example:" in help_text
    example = " ".join(help_text.split("Example:", 1)[1].replace("\\\n", " ").split())
    problems, found = check_commands(f"`{example}`", get_command(app), "help")
    assert not problems and path in found, (example, problems, found)
