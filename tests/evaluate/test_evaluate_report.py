"""`balcaprl report`: Table 1's form (deltas, best marked per group, incomplete values flagged), the
paper's published rows, the figure, and the model-level Spearman with a human ranking."""

from __future__ import annotations

import csv
import io
import json

import pytest
from PIL import Image
from typer.testing import CliRunner

from balcaprl.cli import app
from balcaprl.errors import InputError
from balcaprl.evaluate.report import (
    build_report,
    human_alignment,
    load_eval_rows,
    published_rows,
    rank_average,
    read_human_ranking,
    report_figure,
    spearman,
)


def write_eval(folder, label, dcscore, captionqa, caparena, length, bcapscore, incomplete=(), general=None,
               not_comparable=None):  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    results = {}
    for protocol in ("dcscore", "captionqa", "caparena", "bcapscore"):
        done = protocol not in incomplete
        reasons = (not_comparable or {}).get(protocol, [])
        results[protocol] = {"complete": done, "n_failed": 0 if done else 3, "n_missing": 0,
                             "comparable_with_paper": not reasons, "not_comparable": reasons}  # fmt: skip
    if general:
        results["general"] = {"scores": general}
    headline = {"dcscore": dcscore, "captionqa": captionqa, "caparena": caparena, "arena_length": length,
                "bcapscore": bcapscore}  # fmt: skip
    (folder / "eval.json").write_text(json.dumps({"label": label, "results": results, "headline": headline}))
    return folder


@pytest.fixture
def runs(tmp_path):
    write_eval(tmp_path / "base" / "eval", "base", 40.0, 70.0, -30.0, 120, 45.0)
    a = write_eval(tmp_path / "a", "run-a", 45.5, 69.0, -20.0, 150.4, 47.0, incomplete=("dcscore",),
                   general={"ChartQA": 80.0, "OCRBench": 70.0})  # fmt: skip
    b = write_eval(tmp_path / "b", "run-b", 42.0, 75.0, -40.0, 300, None)
    return tmp_path / "base", a, b  # a run folder (eval one level down) and two eval folders


def test_table_one_form(tmp_path, runs):
    report = build_report(list(runs), tmp_path / "report", baseline="base")
    md = report.markdown
    assert "| Model | DCScore | Δ | CaptionQA | Δ | CapArena | Δ | Arena Length | b-CapScore | Δ |" in md
    assert "| **base** | 40.0 | – | 70.0 | – | -30.0 | – | 120 | 45.0 | – |" in md
    # best of the group in bold; the incomplete DCScore flagged with a dagger and explained
    assert "| run-a | **45.5**†1 | +5.5 | 69.0 | -1.0 | **-20.0** | +10.0 | 150 | **47.0** | +2.0 |" in md
    assert "| run-b | 42.0 | +2.0 | **75.0** | +5.0 | -40.0 | -10.0 | 300 | – | – |" in md
    assert (
        "†1 incomplete: 3 judge failures, 0 items without a caption; see its eval.json (run-a: DCScore)" in md
    )
    rows = list(csv.DictReader(io.StringIO((tmp_path / "report" / "report.csv").read_text())))
    assert rows[1]["model"] == "run-a" and float(rows[1]["caparena_delta"]) == 10.0
    assert rows[1]["best"] == "dcscore;caparena;bcapscore" and rows[1]["incomplete"] == "dcscore"
    assert rows[2]["bcapscore"] == "" and rows[2]["bcapscore_delta"] == ""
    assert "## General vision benchmarks" in md and "| run-a | – | **80.00** |" in md
    image = Image.open(tmp_path / "report" / "report.png")
    assert image.width > 1000 and image.height > 150


def test_published_rows_reproduce_the_papers_deltas(tmp_path):
    rows = published_rows("qwen2.5-vl-3b")
    assert [r.name for r in rows] == [
        f"QwenVL2.5-3B {m} (paper)" for m in ("Baseline", "CapRL-3B", "RubiCap-3B", "BalCapRL")
    ]
    report = build_report([], tmp_path, published="qwen2.5-vl-3b", baseline="QwenVL2.5-3B Baseline (paper)")
    # the paper prints +7.5 / +5.0 / +30.2 / +3.1 for BalCapRL-3B and +5.3 / +12.6 / -16.6 / +1.2 for CapRL-3B
    assert (
        "| QwenVL2.5-3B BalCapRL (paper) | **50.8** | +7.5 | 75.0 | +5.0 | **-3.8** | +30.2 | 175 | **49.3** | +3.1 |"
        in report.markdown
    )
    assert (
        "| QwenVL2.5-3B CapRL-3B (paper) | 48.6 | +5.3 | **82.6** | +12.6 | -50.6 | -16.6 | 403 | 47.4 | +1.2 |"
        in report.markdown
    )
    everything = published_rows("all")
    assert len(everything) == 14 and everything[0].values["caparena"] == 10.3  # GPT-4o
    feedquill = next(r for r in everything if "FEEDQUILL" in r.name)
    assert feedquill.values == {
        "dcscore": 34.5,
        "captionqa": None,
        "caparena": None,
        "arena_length": None,
        "bcapscore": None,
    }
    assert rows[3].general["TextVQA"] == 78.40  # Table 2 rides along where the paper has it
    with pytest.raises(InputError, match="no published row"):
        published_rows("qwen3")


def test_spearman_with_ties_by_hand():
    assert rank_average([10, 20, 20, 30]) == [1, 2.5, 2.5, 4]
    # x ranks 1..5; y = [5, 6, 7, 8, 7] ranks [1, 2, 3.5, 5, 3.5]: cov 8, var 10 and 9.5
    assert spearman([1, 2, 3, 4, 5], [5, 6, 7, 8, 7]) == pytest.approx(8 / 95**0.5)  # 0.8208 (scipy agrees)
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    with pytest.raises(ValueError):
        spearman([1, 1, 1], [1, 2, 3])


def test_human_ranking_files_and_alignment(tmp_path, runs):
    (tmp_path / "h.txt").write_text("run-b\nrun-a\nbase\nnot-evaluated\n")  # best first
    (tmp_path / "h.csv").write_text("model,score\nrun-a,1200\nrun-b,1100\nbase,900\n")
    (tmp_path / "r.csv").write_text("model,rank\nrun-a,1\nrun-b,2\nbase,3\n")
    (tmp_path / "h.json").write_text(json.dumps(["run-a", "run-b", "base"]))
    assert read_human_ranking(tmp_path / "h.txt") == {"run-b": 4, "run-a": 3, "base": 2, "not-evaluated": 1}
    assert read_human_ranking(tmp_path / "r.csv") == {"run-a": -1, "run-b": -2, "base": -3}
    rows = load_eval_rows(list(runs))
    for name in ("h.csv", "r.csv", "h.json"):
        alignment = human_alignment(rows, read_human_ranking(tmp_path / name))
        # human order a > b > base; CaptionQA orders b > base > a -> rho = -0.5
        assert alignment["metrics"]["dcscore"]["spearman"] == pytest.approx(1.0)
        assert alignment["metrics"]["captionqa"]["spearman"] == pytest.approx(-0.5)
        assert alignment["metrics"]["bcapscore"]["spearman"] is None  # only 2 models have it
    result = CliRunner(env={"COLUMNS": "120"}).invoke(app, ["report", *map(str, runs), "--out", str(tmp_path / "rep"),
                                                            "--baseline", "base", "--human-ranking",
                                                            str(tmp_path / "h.txt"), "--published",
                                                            "proprietary"])  # fmt: skip
    assert result.exit_code == 0, result.output
    saved = json.loads((tmp_path / "rep" / "human_alignment.json").read_text())
    # txt: humans b > a > base; DCScore a > b > base: rank differences 1, 1, 0 -> 1 - 6*2/(3*8) = 0.5
    assert saved["metrics"]["dcscore"]["spearman"] == pytest.approx(0.5)
    assert saved["unmatched_in_ranking"] == ["not-evaluated"]
    assert "b-CapScore 0.956" in result.output and "GPT-5.4 (paper)" in result.output


def test_report_errors(tmp_path, runs):
    result = CliRunner(env={"COLUMNS": "120"}).invoke(
        app, ["report", str(runs[1]), "--baseline", "nope", "--out", str(tmp_path / "r")]
    )
    assert result.exit_code == 2 and "--baseline 'nope'" in result.output
    (tmp_path / "empty").mkdir()
    result = CliRunner(env={"COLUMNS": "120"}).invoke(
        app, ["report", str(tmp_path / "empty"), "--out", str(tmp_path / "r")]
    )
    assert result.exit_code == 2 and "no eval.json" in result.output


def test_numbers_not_comparable_with_table_1_are_marked(tmp_path):
    reasons = {"dcscore": ["prompts: paraphrase (not the benchmark's official prompts)"]}
    write_eval(tmp_path / "ours", "ours", 45.5, 70.0, -3.0, 150, 47.0, not_comparable=reasons)
    old = tmp_path / "old"  # an eval.json from before prompts and options were recorded
    old.mkdir()
    (old / "eval.json").write_text(json.dumps({"label": "old", "results": {"dcscore": {"complete": True}},
                                               "headline": {"dcscore": 40.0}}))  # fmt: skip
    report = build_report([tmp_path / "ours", old], tmp_path / "r", published="qwen2.5-vl-3b/baseline")
    md = report.markdown
    # the first run is the baseline; no Δ between classes (old's unrecorded DCScore, the paper's own)
    assert "| **ours** | **45.5**‡1 | – | **70.0** | – | **-3.0** | – | 150 | **47.0** | – |" in md
    assert "| old | 40.0‡2 | – | – | – | – | – | – | – | – |" in md
    assert "‡1 not comparable with the paper's Table 1: prompts: paraphrase" in md
    assert "‡2 not comparable with the paper's Table 1: the prompts and options used were not recorded" in md
    paper = next(line for line in md.splitlines() if "(paper) |" in line)
    assert "‡" not in paper  # the paper's own rows are the reference
    # 70.0 - 70.0, -34.0 - -3.0, 46.2 - 47.0 within the comparable class; DCScore across classes: none
    assert (
        paper
        == "| QwenVL2.5-3B Baseline (paper) | **43.3** | – | **70.0** | +0.0 | **-34.0** | -31.0 | 131 | **46.2** | -0.8 |"
    )
    rows = list(csv.DictReader(io.StringIO(report.csv)))
    assert [r["not_comparable"] for r in rows] == ["dcscore", "dcscore", ""]


@pytest.mark.parametrize("metrics", [1, 5])
def test_the_figure_title_fits_the_figure_with_one_metric_or_all(tmp_path, metrics):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    values = [40.0, 70.0, -30.0, 120, 45.0] if metrics == 5 else [None, None, None, None, 45.0]
    rows = load_eval_rows([write_eval(tmp_path / "only", "only", *values)])
    figure = report_figure(rows)
    try:
        figure.canvas.draw()
        assert len([ax for ax in figure.axes if ax.get_title()]) == metrics
        title = figure._suptitle.get_window_extent()
        frame = figure.bbox
        assert frame.x0 <= title.x0 and title.x1 <= frame.x1 and title.y1 <= frame.y1  # nothing cut off
    finally:
        plt.close(figure)


def test_one_footnote_per_distinct_reason(tmp_path):
    """Two runs, every score paraphrased: one ‡ note naming the eight cells, not eight notes."""
    why = ["prompts: paraphrase (not the benchmark's official prompts)"]
    reasons = {protocol: why for protocol in ("dcscore", "captionqa", "caparena", "bcapscore")}
    first = write_eval(tmp_path / "one", "one", 40.0, 70.0, -3.0, 150, 47.0, not_comparable=reasons)
    second = write_eval(tmp_path / "two", "two", 41.0, 71.0, -2.0, 160, 48.0, not_comparable=reasons)
    md = build_report([first, second], tmp_path / "r").markdown
    notes = [line for line in md.splitlines() if line.startswith("‡1 ")]
    assert len(notes) == 1 and "‡2" not in md
    assert notes[0].endswith("(one: DCScore; one: CaptionQA; one: CapArena; one: Arena Length; one: b-CapScore; "
                             "two: DCScore; two: CaptionQA; two: CapArena; two: Arena Length; two: b-CapScore)")  # fmt: skip
    assert "| two | **41.0**‡1 | +1.0 |" in md  # one class: the difference is taken


def test_report_png_draws_the_recorded_intervals(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder = write_eval(tmp_path / "a", "a", None, None, None, None, 47.0)
    record = json.loads((folder / "eval.json").read_text())
    record["results"]["bcapscore"]["metrics"] = {"ci95": [44.0, 51.5]}
    (folder / "eval.json").write_text(json.dumps(record))
    rows = load_eval_rows([folder])
    assert rows[0].intervals == {"bcapscore": (44.0, 51.5)}
    figure = report_figure(rows)
    try:
        (axis,) = [ax for ax in figure.axes if ax.get_title()]
        segments = [seg for collection in axis.collections for seg in collection.get_segments()]
        assert any(sorted((seg[0][0], seg[1][0])) == [44.0, 51.5] for seg in segments)  # the whisker
    finally:
        plt.close(figure)
