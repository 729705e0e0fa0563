"""The command line as a whole: its tree, its one error boundary, TRL's and verl's flags kept apart,
and a help path that imports no heavy library."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.main import get_command
from typer.testing import CliRunner

import balcaprl
from balcaprl.cli import DEBUG_ENV, app
from balcaprl.errors import InputError

SRC = Path(__file__).resolve().parents[1] / "src"

# The command line as decided: group -> its commands (None: a command, not a group).
TREE = {
    "demo": None,
    "synthetic": {
        "build": None,
        "sft": None,
        "caption": None,
        "show": None,
        "init-policy": None,
        "probe": None,
    },
    "data": {"prepare": {"sharegpt4v": None}, "recaption": None, "info": None},
    "judge": {"serve": None, "audit": None},
    "train": None,
    "verl": {"export": None, "launch": None},
    "caption": None,
    "score": None,
    "evaluate": None,
    "report": None,
    "evaluate-general": None,
    "inspect": None,
    "figure": {"advantage-collapse": None},
    "version": None,
}

TRL_FLAGS = {
    "--resume",
    "--resume-from",
    "--overwrite",
    "--judge",
    "--allow-recipe-change",
    "--print-config",
    "--threads",
}
# `balcaprl train CONFIG --plan`: the memory plan of a TRL launch (accelerate config) or of a verl layout.
PLAN_FLAGS = {"--plan", "--launcher", "--verl-layout", "--gpus", "--gpu-memory"}
VERL_FLAGS = {
    "--judge",
    "--nnodes",
    "--gpus-per-node",
    "--verl-data",
    "--verl-override",
    "--dry-run",
    "--gpu-memory",
    "--flash-attn",
}
HEAVY = ("torch", "transformers", "openai", "pyarrow", "datasets", "trl")


def tree_of(command):
    """Group -> its commands, from the click command typer builds (None for a command)."""
    if not hasattr(command, "commands"):
        return None
    return {name: tree_of(sub) for name, sub in command.commands.items()}


def options_of(command) -> set[str]:
    return {opt for p in command.params if p.param_type_name == "option" for opt in p.opts} - {"--help", "-h"}


def invoke(*args: str, columns: int = 120):
    return CliRunner().invoke(app, list(args), env={"COLUMNS": str(columns)})


def run_cli(*args: str, columns: int = 120, **env: str) -> subprocess.CompletedProcess:
    """The real entry point in a fresh interpreter, as a user runs it."""
    inherited = {k: v for k, v in os.environ.items() if k != DEBUG_ENV}
    environment = {**inherited, "PYTHONPATH": str(SRC), "COLUMNS": str(columns), **env}
    return subprocess.run(
        [sys.executable, "-m", "balcaprl.cli", *args],
        capture_output=True,
        text=True,
        env=environment,
        timeout=120,
    )


# ---------------------------------------------------------------------------------------------------
# The tree


def test_the_command_tree_is_the_decided_one():
    assert tree_of(get_command(app)) == TREE


GROUPS = [("synthetic",), ("data",), ("data", "prepare"), ("judge",), ("verl",), ("figure",)]


@pytest.mark.parametrize("group", GROUPS, ids=" ".join)
def test_each_group_lists_its_commands(group):
    result = invoke(*group, "--help", columns=200)
    assert result.exit_code == 0, result.output
    commands = TREE
    for name in group:
        commands = commands[name]
    for command in commands:
        assert f" {command} " in result.output, command


def test_top_level_help_groups_commands_by_activity_in_order():
    output = invoke("--help", columns=200).output
    panels = ["Demo", "Data", "Judge", "Train", "Evaluate", "Paper"]
    positions = [output.index(f"\n{panel}:\n") for panel in panels]
    assert positions == sorted(positions)
    panel_of = {name: get_command(app).commands[name].rich_help_panel for name in TREE}
    assert panel_of["demo"] == panel_of["synthetic"] == "Demo"
    assert panel_of["train"] == panel_of["verl"] == "Train"
    assert {panel_of[n] for n in ("caption", "score", "evaluate", "report", "evaluate-general")} == {
        "Evaluate"
    }


def help_pages(command=None, prefix=()):
    """(argument path, click command) for every page of the tree."""
    command = command or get_command(app)
    yield prefix, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from help_pages(sub, (*prefix, name))


@pytest.mark.parametrize("columns", [60, 80])
def test_every_help_page_shows_each_flag_whole_and_no_value_for_a_switch(columns):
    """At 80 columns rich's table cut names to `--official-deca…` and showed `--resume <bool>`."""
    for path, command in help_pages():
        output = CliRunner().invoke(app, [*path, "--help"], terminal_width=columns).output  # click's width
        assert "…" not in output, path
        assert max(map(len, output.splitlines())) <= columns, path
        for param in command.params:
            if param.param_type_name != "option" or param.hidden:
                continue
            for name in (*param.opts, *param.secondary_opts):
                whole = re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])(.*)", output)
                assert whole, (path, name)
                if param.is_flag:  # a switch: nothing after its names but the help text
                    assert not re.match(r",? ?<", whole.group(1)), (path, name, whole.group(0))


def test_evaluate_help_at_80_columns_as_a_user_runs_it():
    """The issue's own check: `COLUMNS=80 balcaprl evaluate --help` in a fresh interpreter."""
    result = run_cli("evaluate", "--help", columns=80)
    assert result.returncode == 0, result.stderr
    for flag in ("--official-decapbench", "--official-caparena", "--official-captionqa", "--decapbench-images",
                 "--caparena-images", "--min-scored"):  # fmt: skip
        assert re.search(rf"^  {flag} ", result.stdout, re.MULTILINE), flag
    assert re.search(r"^  --resume  +Continue", result.stdout, re.MULTILINE)  # a switch: no value shown
    assert "<bool>" not in result.stdout and max(map(len, result.stdout.splitlines())) <= 80


# ---------------------------------------------------------------------------------------------------
# The error boundary


@pytest.mark.parametrize("columns", [40, 300])
def test_a_user_error_is_one_unwrapped_line_and_exit_2(tmp_path, columns):
    missing = tmp_path / ("a-folder-with-a-long-name-" * 3) / "sharegpt4v_instruct_gpt4-vision_cap100k.json"
    result = run_cli(
        "data", "prepare", "sharegpt4v", "--json", str(missing), "--image-root", str(tmp_path),
        "--out", str(tmp_path / "out"), columns=columns,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr == f"error: --json {missing} is not a file\n"
    assert result.stdout == ""


def test_debug_shows_the_traceback_of_a_user_error(tmp_path):
    args = ["data", "prepare", "sharegpt4v", "--json", str(tmp_path / "nope.json"), "--image-root", str(tmp_path),
            "--out", str(tmp_path / "out")]  # fmt: skip
    for result in (run_cli("--debug", *args, columns=300), run_cli(*args, columns=300, BALCAPRL_DEBUG="1")):
        assert result.returncode == 1, result.stderr
        assert "Traceback" in result.stderr and "InputError" in result.stderr
        assert "is not a file" in result.stderr and not result.stderr.startswith("error:")


def test_debug_in_process_lets_the_user_error_through(tmp_path):
    result = invoke("--debug", "data", "info", str(tmp_path))
    assert isinstance(result.exception, InputError)
    assert "not a finished balcaprl dataset" in str(result.exception)
    assert "error:" not in result.output


def test_an_exception_that_is_not_a_user_error_is_a_bug_and_is_not_swallowed(tmp_path, monkeypatch):
    def broken(out, grid):
        raise RuntimeError("a bug in the figure code")

    monkeypatch.setattr("balcaprl.figures.advantage_collapse.write_advantage_collapse", broken)
    result = invoke("figure", "advantage-collapse", "--out", str(tmp_path))
    assert isinstance(result.exception, RuntimeError) and result.exit_code == 1
    assert "error:" not in result.output


def test_a_bug_keeps_its_traceback_through_the_entry_point(tmp_path):
    code = (
        "import balcaprl.figures.advantage_collapse as figure\n"
        "def broken(out, grid):\n    raise RuntimeError('a bug in the figure code')\n"
        "figure.write_advantage_collapse = broken\n"
        "from balcaprl.cli import app\napp(prog_name='balcaprl')\n"
    )
    environment = {**os.environ, "PYTHONPATH": str(SRC), "COLUMNS": "300"}
    result = subprocess.run(
        [sys.executable, "-c", code, "figure", "advantage-collapse", "--out", str(tmp_path)],
        capture_output=True, text=True, env=environment, timeout=120,
    )  # fmt: skip
    assert result.returncode == 1
    assert (
        "Traceback" in result.stderr
        and "RuntimeError" in result.stderr
        and "a bug in the figure code" in result.stderr
    )


def test_usage_errors_keep_exit_2():
    result = invoke("data", "info")  # missing argument
    assert result.exit_code == 2
    assert invoke("no-such-command").exit_code == 2


# ---------------------------------------------------------------------------------------------------
# TRL's train and verl's launch: each with its own flags


def test_train_has_only_trl_flags_and_verl_launch_only_verl_flags():
    root = get_command(app)
    assert options_of(root.commands["train"]) == TRL_FLAGS | PLAN_FLAGS
    assert options_of(root.commands["verl"].commands["launch"]) == VERL_FLAGS


@pytest.mark.parametrize(
    "flag", ["--nnodes=2", "--dry-run", "--verl-override=trainer.save_freq=7", "--backend=verl"]
)
def test_train_refuses_a_verl_flag(tmp_path, flag):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("{}\n")
    result = invoke("train", str(recipe), flag)
    assert result.exit_code == 2
    assert "No such option" in " ".join(result.output.split())


@pytest.mark.parametrize("flag", ["--resume", "--print-config", "--allow-recipe-change"])
def test_verl_launch_refuses_a_trl_flag(tmp_path, flag):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("{}\n")
    result = invoke("verl", "launch", str(recipe), flag)
    assert result.exit_code == 2
    assert "No such option" in " ".join(result.output.split())


# ---------------------------------------------------------------------------------------------------
# A light help path


def test_help_imports_no_heavy_library():
    """Every help page of the tree, built in a fresh interpreter, leaves the heavy libraries unloaded."""
    code = f"""
import json, sys
from typer.main import get_command
import balcaprl.cli

def paths(command, prefix):
    yield prefix
    if hasattr(command, "commands"):
        for name, sub in command.commands.items():
            yield from paths(sub, [*prefix, name])

for args in paths(get_command(balcaprl.cli.app), []):
    balcaprl.cli.app([*args, "--help"], prog_name="balcaprl", standalone_mode=False)
print(json.dumps([name for name in {list(HEAVY)!r} if name in sys.modules]))
"""
    environment = {**os.environ, "PYTHONPATH": str(SRC), "COLUMNS": "100"}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=environment, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "Usage: balcaprl verl launch" in result.stdout  # the leaves' help pages were built too
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []


def _paths(tree, prefix=()):
    for name, sub in tree.items():
        yield (*prefix, name)
        if sub:
            yield from _paths(sub, (*prefix, name))


@pytest.mark.parametrize("path", list(_paths(TREE)), ids=" ".join)
def test_a_process_builds_only_the_command_it_runs_and_prints_what_the_whole_tree_prints(
    path, monkeypatch, capsys
):
    """``app(...)`` as the entry point calls it builds the one top-level command named (typer's
    build of each command costs start-up time); its help and usage errors are the whole tree's."""
    import typer.main

    built = []
    build = typer.main.get_command_from_info
    monkeypatch.setattr(typer.main, "get_command_from_info", lambda **kw: built.append(kw) or build(**kw))
    monkeypatch.setenv("COLUMNS", "100")

    def run(call, args):
        built.clear()
        try:
            status = call(args, prog_name="balcaprl")
        except SystemExit as exit:
            status = exit.code
        captured = capsys.readouterr()
        return status, captured.out, captured.err, len(built)

    top = TREE[path[0]]
    commands = 1 if top is None else _leaves(top)
    for args in ([*path, "--help"], [*path, "--no-such-flag"]):
        *whole, built_whole = run(lambda *a, **k: typer.Typer.__call__(app, *a, **k), args)
        *one, built_one = run(app, args)
        assert one == whole, args
        assert (built_one, built_whole) == (commands, _leaves(TREE)), args


def _leaves(tree) -> int:
    """How many commands a tree holds (typer builds each with get_command_from_info; groups apart)."""
    return sum(_leaves(sub) if sub else 1 for sub in tree.values())


def test_import_balcaprl_is_lazy_and_its_public_names_still_work():
    code = f"""
import json, sys
import balcaprl
before = [name for name in {list(HEAVY)!r} if name in sys.modules]
listed = sorted(set(balcaprl.__all__) - set(dir(balcaprl)))
from balcaprl import c_gdpo_advantages
print(json.dumps({{"before": before, "not_in_dir": listed, "torch_after": "torch" in sys.modules}}))
"""
    environment = {**os.environ, "PYTHONPATH": str(SRC)}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=environment, timeout=120
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report == {"before": [], "not_in_dir": [], "torch_after": True}


def test_every_public_name_is_the_defining_modules_object():
    import balcaprl.advantages
    import balcaprl.rewards

    for name in balcaprl.__all__:
        home = balcaprl.advantages if name.endswith("_advantages") else balcaprl.rewards
        assert getattr(balcaprl, name) is getattr(home, name), name
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = balcaprl.no_such_name


def test_library_modules_do_not_import_typer():
    """The CLI framework stays in balcaprl.cli: the library is usable without it."""
    offenders = []
    for path in (SRC / "balcaprl").rglob("*.py"):
        if path.relative_to(SRC / "balcaprl").parts[0] == "cli":
            continue
        text = path.read_text(encoding="utf-8")
        if "import typer" in text or "from typer" in text:
            offenders.append(str(path.relative_to(SRC)))
    assert offenders == []


def test_version_prints_the_package_version():
    result = invoke("version")
    assert result.exit_code == 0 and result.output.strip() == balcaprl.__version__


def test_dash_dash_version_prints_the_package_version_and_runs_nothing_else():
    result = run_cli("--version", "data", "info")
    assert result.returncode == 0 and result.stdout == f"{balcaprl.__version__}\n", result.stderr


def test_python_dash_m_balcaprl_is_the_same_command_line():
    environment = {k: v for k, v in os.environ.items() if k != DEBUG_ENV} | {"PYTHONPATH": str(SRC)}
    result = subprocess.run(
        [sys.executable, "-m", "balcaprl", "version"],
        capture_output=True,
        text=True,
        env=environment,
        timeout=120,
    )
    assert result.returncode == 0 and result.stdout.strip() == balcaprl.__version__, result.stderr
