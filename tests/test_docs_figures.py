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
        "before\n  <!-- figures:offline-walk -->\n  The whole walk takes 1.5 CPU-minutes (2.5 min wall on 2 cores, "
        "1-minute load 7.5 at the start and 8.0 at the end; commit 0123456789, `make docs-figures`); `tests/test_offline_guide.py` runs it as "
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
    junit.write_text(
        '<testsuites><testsuite tests="4" failures="1" errors="0" skipped="1"><testcase classname="tests.a" name="t1"/>'
        '<testcase classname="tests.b" name="t2"><failure message="no"/></testcase></testsuite></testsuites>'
    )
    assert docs_figures._results(junit)["summary"] == "2 tests passed, 1 skipped, 1 failed (tests.b::t2)"


def test_a_failed_command_records_nothing_unless_its_failure_is_the_result(tmp_path, monkeypatch):
    failing = (sys.executable, "-c", "raise SystemExit(3)")
    monkeypatch.setitem(docs_figures.MEASUREMENTS, "fails", docs_figures.Measurement(failing, str))
    with pytest.raises(SystemExit, match="exited with status 3; nothing recorded"):
        docs_figures.measure("fails", tmp_path)
    assert not (tmp_path / "fails.json").exists()
    counted = docs_figures.Measurement(failing, str, failure_is_a_result=True)
    monkeypatch.setitem(docs_figures.MEASUREMENTS, "fails", counted)
    assert json.loads(docs_figures.measure("fails", tmp_path).read_text())["exit_status"] == 3


def demo_summary(before: float, after: float, delta: float, low: float, high: float) -> dict:
    return {"before": {"b_capscore": before}, "variants": {"full": {"after": {"b_capscore": after},
            "b_capscore_change": {"delta": delta, "low": low, "high": high}}}}  # fmt: skip


def test_a_repeat_on_a_second_clone_states_its_difference_from_the_first_run(tmp_path):
    first = {**RECORD, "name": "demo", "results": demo_summary(21.4057, 28.0763, 6.6706, 5.72, 7.63)}
    (tmp_path / "demo.json").write_text(json.dumps(first))
    same = {**first, "name": "demo-clone", "fresh_clone": True}
    (tmp_path / "demo-clone.json").write_text(json.dumps(same))
    line = docs_figures.render("demo-clone", tmp_path)
    assert line.startswith(
        "A second fresh clone of commit 0123456789 printed 21.4 -> 28.1 (full), [+5.7, +7.6]: the same figures "
        "(before +0.00, after +0.00, change +0.00); 1.5 CPU-minutes"
    )
    moved = {**same, "results": demo_summary(21.4057, 28.2063, 6.8006, 5.8, 7.7)}
    (tmp_path / "demo-clone.json").write_text(json.dumps(moved))
    assert "differences from the run above (before +0.00, after +0.13, change +0.13)" in docs_figures.render(
        "demo-clone", tmp_path
    )
    (tmp_path / "demo-clone.json").write_text(json.dumps({**same, "commit": "fedcba9876543210"}))
    assert "not the commit of the run above, so not compared" in docs_figures.render("demo-clone", tmp_path)


def test_a_repeat_runs_in_a_fresh_clone_of_its_first_runs_commit(tmp_path, monkeypatch):
    """measure() clones the repository at the commit the first record names and runs there: the
    command reports the tree it ran in and that tree's HEAD."""
    older = docs_figures._git("rev-list", "--max-count=1", "HEAD~1")
    (tmp_path / "first.json").write_text(json.dumps({**RECORD, "name": "first", "commit": older}))
    report = "import json, os, subprocess; json.dump({'cwd': os.getcwd(), 'head': subprocess.check_output(['git', 'rev-parse', 'HEAD'], text=True).strip()}, open('where.json', 'w'))"  # fmt: skip
    spec = docs_figures.Measurement(
        (sys.executable, "-c", report), lambda r, f: "", "where.json", repeats="first"
    )
    monkeypatch.setitem(docs_figures.MEASUREMENTS, "again", spec)
    record = json.loads(docs_figures.measure("again", tmp_path).read_text())
    assert record["commit"] == record["results"]["head"] == older and record["fresh_clone"]
    assert not record["dirty"] and not Path(record["results"]["cwd"]).exists()  # the scratch clone is gone
    assert Path(record["results"]["cwd"]).resolve() != docs_figures.REPO


def test_the_audit_table_renders_each_flip_rate_as_a_row(tmp_path):
    row = {"flip_rate": 0.1, "items": 1000, "caption_pairs": 17510, "reference_pairs": 19030,
           "error": {"pointable": 0.1021, "visible": 0.104, "covered": 0.0994},
           "kappa": {"pointable": 0.2571, "visible": 0.443, "covered": 0.7224}, "kendall_tau_b": 0.7334}  # fmt: skip
    table = {"images": 100, "rows": [row]}
    (tmp_path / "audit-flips.json").write_text(
        json.dumps({**RECORD, "name": "audit-flips", "results": table})
    )
    text = docs_figures.render("audit-flips", tmp_path)
    assert text.startswith("On 1,000 captions of 100 synthetic images (")
    assert "17,510 caption and 19,030 reference assertion pairs" in text and "1.5 CPU-minutes" in text
    assert text.endswith("| 0.10 | 0.102 | 0.104 | 0.099 | 0.257 | 0.443 | 0.722 | 0.733 |\n")
    assert text.count("\n|") == 3  # the header, its rule and one row


def test_the_sft_record_renders_its_time_and_the_policys_held_out_scores(tmp_path):
    scores = {"b_capscore": 19.04, "precision": 0.141, "recall": 0.153, "linguistic": 0.718, "n": 200,
              "mean_tokens": 61.4}  # fmt: skip
    results = {
        "steps": 800,
        "held_out": {"before": None, "after": scores, "references": {**scores, "b_capscore": 100.0}},
    }
    (tmp_path / "synthetic-sft.json").write_text(
        json.dumps({**RECORD, "name": "synthetic-sft", "results": results})
    )
    assert docs_figures.render("synthetic-sft", tmp_path) == (
        "Measured: `synthetic build` and `synthetic sft` as above (800 steps) take 1.5 CPU-minutes (2.5 min wall on 2 "
        "cores, 1-minute load 7.5 at the start and 8.0 at the end; commit 0123456789, `make docs-figures`); the saved policy scores held-out "
        "b-CapScore 19.0 (precision 0.14, recall 0.15, linguistic 0.72, 61 tokens) on 200 scenes, the references "
        "100.0.\n"
    )
