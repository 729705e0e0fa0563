"""The GPU and cluster guides' commands, each run in the form a CPU can check.

docs/training.md, docs/gpu.md and docs/verl.md show commands that train on GPUs or read a model from
the hub, which this suite cannot run. Each ``balcaprl`` command line in them (and each ``accelerate
launch ... -m balcaprl.cli train`` line) is run here in its CPU-checkable form, from the repository
root, so that a renamed option, a recipe or launcher file that is not there, or a recipe key the
recipe does not have fails:

- ``train RECIPE ... --plan ...``: as written (the memory plan runs on a CPU);
- ``train RECIPE ...``: with ``--print-config`` added (the recipe and every override validated), and
  each ``train.trl_overrides.NAME`` checked against the installed TRL's ``GRPOConfig``;
- ``accelerate launch --config_file LAUNCHER -m balcaprl.cli train RECIPE``: the memory plan of that
  launch, ``train RECIPE --plan --launcher LAUNCHER``;
- ``verl launch RECIPE ...``: with ``--dry-run`` added (every verl setting rendered, nothing started);
- ``verl export --data DIR --tokenizer HUB_ID``: as written, with the dataset and the hub id replaced
  by local stand-ins (a tiny dataset, a tiny Qwen2.5-VL built here).

The guides' placeholders (``RECIPE``, ``CONFIG``, ``GIB``) take the paper's 3B recipe and 80 GiB.
"""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from balcaprl.cli import app
from test_docs import SHELL_OPERATORS, shell_snippets

REPO = Path(__file__).resolve().parents[2]
GUIDES = ("docs/training.md", "docs/gpu.md", "docs/verl.md")
# an indented code block's command line (docs/gpu.md's style; the docs checker reads fenced blocks)
INDENTED_COMMAND = re.compile(r"^ {4}(balcaprl|accelerate launch) ")
COMMAND_NAME = re.compile(r"[a-z][a-z0-9-]*")
PLACEHOLDERS = {"RECIPE": "configs/qwen2_5_vl_3b.yaml", "CONFIG": "configs/qwen2_5_vl_3b.yaml", "GIB": "80"}


def guide_commands(text: str) -> list[list[str]]:
    """Each ``balcaprl`` command of ``text`` as its words after ``balcaprl`` (``accelerate launch``
    lines keep their launcher as ``["accelerate", CONFIG_FILE, *words]``)."""
    commands = []
    indented = [
        line for line in text.splitlines() if INDENTED_COMMAND.match(line)
    ]  # `    balcaprl ...` blocks
    for snippet in [s for _, s in shell_snippets(text)] + indented:
        if "balcaprl" not in snippet:
            continue
        try:
            words = shlex.split(snippet)
        except ValueError:  # prose in a code span (an apostrophe): split on spaces, as a reader would
            words = snippet.split()
        cut = next((i for i, w in enumerate(words) if w in SHELL_OPERATORS), len(words))
        words = [PLACEHOLDERS.get(w, w) for w in words[:cut]]
        if words[:2] == ["accelerate", "launch"] and "balcaprl.cli" in words:
            launcher = words[words.index("--config_file") + 1]
            commands.append(["accelerate", launcher, *words[words.index("balcaprl.cli") + 1 :]])
        elif "balcaprl" in words:
            commands.append(words[words.index("balcaprl") + 1 :])
    # a command named in prose (`balcaprl train`, `balcaprl verl launch`) is a name, not a line to run
    return [w for w in commands if not all(COMMAND_NAME.fullmatch(word) for word in w)]


def cpu_form(words: list[str], stand_ins: dict[str, str]) -> list[str]:
    """The arguments that check ``words`` on a CPU (the module docstring's list)."""
    if words[0] == "accelerate":
        _, launcher, command, recipe, *rest = words
        assert command == "train" and not rest, words
        return ["train", recipe, "--plan", "--launcher", launcher]
    if words[0] == "train":
        return words if "--plan" in words else [*words, "--print-config"]
    if words[:2] == ["verl", "launch"]:
        return words if "--dry-run" in words else [*words, "--dry-run"]
    if words[:2] == ["verl", "export"]:
        return [stand_ins.get(w, w) for w in words]
    raise AssertionError(f"no CPU form for `balcaprl {' '.join(words)}`: add one to this test")


def check_trl_overrides(words: list[str]) -> None:
    """The pass-through TRL settings of a ``train`` line are fields of the installed ``GRPOConfig``."""
    from trl import GRPOConfig

    from balcaprl.recipe import load_recipe
    from balcaprl.train.trl_overrides import apply_trl_overrides

    recipe = load_recipe(words[1], [w for w in words[2:] if not w.startswith("-")])
    apply_trl_overrides({}, recipe.train.trl_overrides, GRPOConfig)


def run_cpu_form(words: list[str], stand_ins: dict[str, str]):
    args = cpu_form(words, stand_ins)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, (f"balcaprl {' '.join(args)}", result.output, result.exception)
    if words[0] == "train" and any(w.startswith("train.trl_overrides.") for w in words):
        check_trl_overrides(words)
    return result


def every_command() -> list[list[str]]:
    lines = [tuple(w) for guide in GUIDES for w in guide_commands((REPO / guide).read_text(encoding="utf-8"))]
    return [list(words) for words in dict.fromkeys(lines)]  # a line shown twice is checked once


@pytest.fixture
def stand_ins(tiny_dataset, tiny_policy, tmp_path):
    """The verl guide's dataset and tokenizer hub id, replaced by local ones (the dataset a copy: the
    export writes into it)."""
    data = tmp_path / "sharegpt4v-recap"
    shutil.copytree(tiny_dataset, data)
    return {"data/sharegpt4v-recap": str(data), "Qwen/Qwen2.5-VL-3B-Instruct": str(tiny_policy)}


def test_the_guides_commands_are_found():
    commands = every_command()
    kinds = {" ".join(w[:2]) if w[0] == "verl" else w[0] for w in commands}
    assert kinds == {"train", "accelerate", "verl launch", "verl export"}, kinds
    assert sum("--plan" in w for w in commands) >= 5 and sum(w[0] == "accelerate" for w in commands) == 2


@pytest.mark.parametrize("words", every_command(), ids=lambda w: " ".join(w)[:70])
def test_each_guide_command_runs_in_its_cpu_form(words, stand_ins, monkeypatch):
    monkeypatch.chdir(REPO)  # the guides' paths are from the checkout's root
    monkeypatch.setenv("COLUMNS", "60")
    result = run_cpu_form(words, stand_ins)
    if words[:2] == ["verl", "export"]:
        assert (Path(stand_ins["data/sharegpt4v-recap"]) / "verl" / "export.json").is_file()
    if words[:2] == ["verl", "launch"] and "--no-flash-attn" in words:
        assert "use_remove_padding=false" in result.output


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("balcaprl train configs/qwen2_5_vl_3b.yaml rewards.weights.precison=0.2", "precison"),
        ("balcaprl train configs/qwen2_5_vl_3b.yaml train.trl_overrides.logging_frist_step=true", "frist"),
        ("balcaprl train configs/qwen2_5_vl_9b.yaml --resume", "qwen2_5_vl_9b"),
        ("balcaprl verl launch configs/qwen2_5_vl_3b.yaml --no-flash-atn", "no-flash-atn"),
        ("balcaprl train RECIPE --plan --launcher configs/accelerate/fdsp.yaml", "fdsp"),
        ("accelerate launch --config_file configs/accelerate/fdsp.yaml -m balcaprl.cli train RECIPE", "fdsp"),
    ],
)
def test_a_planted_mistake_in_a_guide_command_fails(line, says, monkeypatch):
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("COLUMNS", "200")
    (words,) = guide_commands(f"`{line}`")
    with pytest.raises(Exception) as failure:
        run_cpu_form(words, {})
    assert says in str(failure.value), failure.value
