"""Rules of the test tree that keep it order-independent."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent


def test_no_test_imports_a_conftest_by_name():
    # Every folder's conftest.py is a module named `conftest`: which one `from conftest import` finds
    # depends on which folders pytest collected first, so a file passes alone and fails in a full run.
    # Shared helpers live in *_testkit.py modules instead.
    offenders = [
        f"{path.relative_to(TESTS)}:{number}"
        for path in sorted(TESTS.rglob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1)
        if re.match(r"\s*(from conftest import|import conftest\b)", line)
    ]
    assert offenders == []


def test_only_the_commands_that_serve_a_stand_in_judge_import_the_test_doubles():
    # balcaprl.testing (loopback server, scripted judge, fixtures) stays apart from the code that trains
    # and evaluates: only `balcaprl judge serve` and the offline demo, which serve the oracle through
    # the loopback server, may import it.
    src = TESTS.parent / "src" / "balcaprl"
    allowed = {"cli/judge.py", "demo/pipeline.py"}
    importing = {
        str(path.relative_to(src))
        for path in src.rglob("*.py")
        if path.parent.name != "testing"
        and re.search(r"^\s*(from balcaprl\.testing\b|import balcaprl\.testing\b|from balcaprl import testing\b)",
                      path.read_text(encoding="utf-8"), re.MULTILINE)
    }  # fmt: skip
    assert importing <= allowed, sorted(importing - allowed)
    assert importing, "the check found no import at all: its pattern is stale"


def test_gitignore_keeps_the_guides_datasets_out_and_the_data_packages_in(tmp_path):
    # docs/data.md builds data/raw and data/sharegpt4v-recap at the top of the checkout; the source
    # packages named data must stay tracked. Checked with git's own matcher in a scratch repository.
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    (tmp_path / ".gitignore").write_text((TESTS.parent / ".gitignore").read_text(encoding="utf-8"))
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    paths = [
        "data/raw/x.json",
        "data/sharegpt4v-recap/train.parquet",
        "src/balcaprl/data/format.py",
        "tests/data/t.py",
    ]
    ignored = subprocess.run(
        ["git", "-C", str(tmp_path), "check-ignore", "--no-index", *paths], capture_output=True, text=True
    ).stdout.split()
    assert ignored == paths[:2]
