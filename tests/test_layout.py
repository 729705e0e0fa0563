"""Rules of the test tree that keep it order-independent."""

from __future__ import annotations

import re
from pathlib import Path

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
