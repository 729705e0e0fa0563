"""Every figure block in README.md and docs/ is what scripts/docs_figures.py renders from the
committed records (docs/figures/NAME.json); the renderer reads a record as this checks it."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("docs_figures", REPO / "scripts" / "docs_figures.py")
docs_figures = importlib.util.module_from_spec(spec)
sys.modules["docs_figures"] = docs_figures  # (its dataclasses look their module up)
spec.loader.exec_module(docs_figures)

RECORD = {"name": "offline-walk", "commit": "0123456789abcdef", "dirty": False, "cores": 2, "load_before": 7.5,
          "load_after": 8.0, "wall_s": 150.0, "cpu_s": 90.0, "results": None}  # fmt: skip


@pytest.mark.parametrize("guide", docs_figures.GUIDES, ids=lambda p: p.name)
def test_every_figure_block_is_what_its_record_renders(guide):
    text = guide.read_text(encoding="utf-8")
    assert docs_figures.rendered(text) == text, f"{guide.name}: run `make docs-figures` (or render)"


def test_the_guides_mark_their_measured_figures():
    names = {m.group("name") for g in docs_figures.GUIDES for m in docs_figures.BLOCK.finditer(g.read_text())}
    assert names == set(docs_figures.MEASUREMENTS)  # each measurement shown, none unknown


def test_a_block_is_rewritten_from_its_record_with_cpu_minutes_load_and_commit(tmp_path):
    (tmp_path / "offline-walk.json").write_text(json.dumps(RECORD))
    text = "before\n  <!-- figures:offline-walk -->\n  stale figure\n  <!-- /figures -->\nafter\n"
    new = docs_figures.rendered(text, tmp_path)
    assert new == (
        "before\n  <!-- figures:offline-walk -->\n  The whole walk takes 1.5 CPU-minutes (2.5 min wall on 2 cores at "
        "1-minute load 7.5; commit 0123456789, `make docs-figures`); `tests/test_offline_guide.py` runs it as "
        "written.\n  <!-- /figures -->\nafter\n"
    )
    assert docs_figures.rendered(new, tmp_path) == new  # rendering is stable
    missing = docs_figures.rendered(text, tmp_path / "none")
    assert "Not yet regenerated" in missing and "stale figure" not in missing


def test_the_demo_record_renders_its_held_out_change(tmp_path):
    summary = {"before": {"b_capscore": 52.24}, "variants": {"full": {"after": {"b_capscore": 57.41},
               "b_capscore_change": {"delta": 5.17, "low": 4.26, "high": 6.31}}}}  # fmt: skip
    (tmp_path / "demo.json").write_text(
        json.dumps({**RECORD, "name": "demo", "dirty": True, "results": summary})
    )
    line = docs_figures.render("demo", tmp_path)
    assert line.startswith(
        "Measured: held-out b-CapScore 52.2 -> 57.4 (full), 95% CI of the change [+4.3, +6.3];"
    )
    assert "commit 0123456789+changes" in line


def test_an_unknown_block_name_is_refused():
    with pytest.raises(KeyError, match="no such measurement"):
        docs_figures.rendered("<!-- figures:nope -->\n<!-- /figures -->\n")


def test_a_test_runs_counts_come_from_its_junit_file(tmp_path):
    junit = tmp_path / "t.xml"
    junit.write_text('<testsuites><testsuite tests="1440" failures="0" errors="0" skipped="3"/></testsuites>')
    assert docs_figures._results(junit)["summary"] == "1,437 tests passed, 3 skipped"
