"""`balcaprl score` end to end against the loopback server: files, hand-computed scores, summary,
resume from the cache, bad rows; and `balcaprl judge serve` as a real subprocess."""

from __future__ import annotations

import json

import pytest
import yaml
from judge_testkit import CAPTION, REFERENCE, config, judge_and_close, judge_serve, png_bytes, request
from typer.testing import CliRunner

from balcaprl.cli import app
from balcaprl.errors import InputError
from balcaprl.evaluate.score import read_caption_file
from balcaprl.evaluate.summary import bootstrap_mean_ci
from balcaprl.judge import Judgement, OpenAICompatibleJudge
from balcaprl.rewards import score_verdict

FULL = "A red door on the left, a black cat sits on the step."


def b_cap(p, r, ling):
    return 3 / (1 / p + 1 / r + 1 / ling)


@pytest.fixture
def workspace(tmp_path, judge_server):
    server = judge_server()
    images = tmp_path / "images"
    images.mkdir()
    for name in ("a.png", "b.png", "e.png", "f.png"):
        (images / name).write_bytes(png_bytes(colour=(ord(name[0]), 0, 0)))
    (tmp_path / "outside.png").write_bytes(png_bytes())
    judge_yaml = tmp_path / "judge.yaml"
    judge_yaml.write_text(yaml.safe_dump({"base_url": server.base_url, "model": "scripted", "api_key_env": None,
                                          "cache_path": str(tmp_path / "cache.sqlite"), "max_retries": 0}))  # fmt: skip
    captions = tmp_path / "captions.jsonl"
    rows = [("a.png", CAPTION), ("b.png", FULL), ("c.png", FULL), ("../outside.png", FULL), ("e.png", ""),
            ("f.png", FULL)]  # fmt: skip
    captions.write_text("".join(json.dumps({"image": i, "caption": c}) + "\n" for i, c in rows))
    references = tmp_path / "references.json"
    refs = {name: REFERENCE for name in ("a.png", "b.png", "c.png", "../outside.png", "e.png")}  # no f.png
    references.write_text(json.dumps(refs))
    return server, tmp_path, images, judge_yaml, captions, references


def score(images, captions, references, judge_yaml, out, *extra):
    args = ["score", "--images", str(images), "--captions", str(captions), "--references", str(references),
            "--judge", str(judge_yaml), "--out", str(out), *extra]  # fmt: skip
    return CliRunner(env={"COLUMNS": "120"}).invoke(app, args)


def test_score_writes_hand_computed_rows_and_summary(workspace):
    server, tmp, images, judge_yaml, captions, references = workspace
    result = score(images, captions, references, judge_yaml, tmp / "out")
    # 3 of 6 captions could not be scored: the files are written, and the exit status says so
    assert result.exit_code == 1, result.output
    assert (
        "incomplete: only 3 of 6 captions scored (50.0%; --min-scored 1 asks for 100%); fix the bad inputs"
        in (" ".join(result.output.split()))
    )
    assert sorted(p.name for p in (tmp / "out").iterdir()) == [
        ".score",  # the record of scored captions, for --resume
        "scores.jsonl",
        "summary.json",
        "verdicts.jsonl",
    ]  # no temp files
    rows = [json.loads(line) for line in (tmp / "out" / "scores.jsonl").read_text().splitlines()]
    assert [r["image"] for r in rows] == ["a.png", "b.png", "c.png", "../outside.png", "e.png", "f.png"]
    a, b, c, d, e, f = rows
    assert (a["precision"], a["recall"], a["linguistic"]) == pytest.approx((1 / 3, 1 / 2, 21 / 27))
    assert a["b_capscore"] == pytest.approx(b_cap(1 / 3, 1 / 2, 21 / 27)) and a["failure"] is None
    assert (b["precision"], b["recall"]) == (1.0, 1.0) and b["b_capscore"] == pytest.approx(
        b_cap(1, 1, 21 / 27)
    )
    for bad in (c, d, f):
        assert bad["failure"] == "bad_input"
        assert bad["precision"] is bad["recall"] is bad["linguistic"] is bad["b_capscore"] is None
    assert "cannot be read" in c["detail"] and "escapes the image root" in d["detail"]
    assert "no reference" in f["detail"]
    assert (e["precision"], e["recall"], e["linguistic"], e["b_capscore"], e["failure"]) == (0, 0, 0, 0, None)
    assert server.counters.total == 2  # a and b only

    summary = json.loads((tmp / "out" / "summary.json").read_text())
    assert (summary["n_captions"], summary["n_scored"], summary["n_failed"]) == (6, 3, 3)
    assert summary["failures"] == {"bad_input": 3}
    expected = [a["b_capscore"], b["b_capscore"], 0.0]
    assert summary["metrics"]["b_capscore"]["mean"] == pytest.approx(100 * sum(expected) / 3)
    assert summary["metrics"]["precision"]["mean"] == pytest.approx((1 / 3 + 1 + 0) / 3)
    m = summary["metrics"]["recall"]
    assert m["ci95_low"] <= m["mean"] <= m["ci95_high"]
    assert summary["judge"]["rubric_version"].startswith("evaluation-v2-joint+")
    assert summary["accounting"]["calls"] == 2
    assert summary["n_empty_captions"] == 1 and "empty captions (scored 0, in the means): 1" in result.output
    assert "b-CapScore" in result.output and "wrote" in result.output
    # every figure x100 with one decimal, as `evaluate` prints them; and why the first failure failed
    printed = " ".join(result.output.split())
    assert "precision │ 44.4 │" in printed  # (1/3 + 1 + 0) / 3
    assert f"b_capscore │ {100 * sum(expected) / 3:.1f} │" in printed
    assert "first failure: c.png: bad_input (" in printed
    # half scored is enough when the user says so
    again = score(images, captions, references, judge_yaml, tmp / "half", "--min-scored", "0.5")
    assert again.exit_code == 0, again.output


def test_score_resumes_from_the_cache(workspace):
    server, tmp, images, judge_yaml, captions, references = workspace
    assert score(images, captions, references, judge_yaml, tmp / "out1", "--min-scored", "0").exit_code == 0
    hits = server.counters.total
    result = score(images, captions, references, judge_yaml, tmp / "out2", "--min-scored", "0")
    assert result.exit_code == 0
    assert server.counters.total == hits  # nothing judged again
    assert (tmp / "out1" / "scores.jsonl").read_text() == (tmp / "out2" / "scores.jsonl").read_text()
    summary = json.loads((tmp / "out2" / "summary.json").read_text())
    assert summary["accounting"]["cache_hits"] == 2
    # --no-cache judges again
    assert (
        score(
            images, captions, references, judge_yaml, tmp / "out3", "--no-cache", "--min-scored", "0"
        ).exit_code
        == 0
    )
    assert server.counters.total == hits + 2


def test_score_accepts_a_json_object_of_captions(workspace):
    server, tmp, images, judge_yaml, _, references = workspace
    captions = tmp / "captions.json"
    captions.write_text(json.dumps({"a.png": CAPTION, "b.png": FULL}))
    result = score(images, captions, references, judge_yaml, tmp / "out")
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (tmp / "out" / "scores.jsonl").read_text().splitlines()]
    assert [r["image"] for r in rows] == ["a.png", "b.png"]


def test_score_reports_a_bad_config_clearly(workspace):
    _, tmp, images, _, captions, references = workspace
    bad = tmp / "bad.yaml"
    bad.write_text("modle: x\n")
    result = score(images, captions, references, bad, tmp / "out")
    assert result.exit_code == 2 and "modle: unknown key; allowed here:" in " ".join(result.output.split())


def test_caption_files(tmp_path):
    jsonl = tmp_path / "c.jsonl"
    jsonl.write_text('{"image": "a.png", "reference": "r1"}\n\n{"image": "b.png", "caption": "r2"}\n')
    assert read_caption_file(jsonl, keys=("reference", "caption")) == [("a.png", "r1"), ("b.png", "r2")]
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"image": "a.png", "caption": "x"}\nnot json\n')
    with pytest.raises(InputError, match="broken.jsonl:2"):
        read_caption_file(broken)
    missing_field = tmp_path / "m.jsonl"
    missing_field.write_text('{"image": "a.png", "text": "x"}\n')
    with pytest.raises(InputError, match="'caption'"):
        read_caption_file(missing_field)
    # JSON keeps U+2028/U+0085 unescaped with ensure_ascii=False (as `balcaprl caption` writes): they are
    # inside the string, not line breaks
    odd = tmp_path / "odd.jsonl"
    captions = ["a line\u2028separator", "next\u0085line", "form\x0cfeed"]
    odd.write_text("".join(json.dumps({"image": f"{i}.png", "caption": c}, ensure_ascii=False) + "\n"
                           for i, c in enumerate(captions)), encoding="utf-8")  # fmt: skip
    assert read_caption_file(odd) == [(f"{i}.png", c) for i, c in enumerate(captions)]


def test_bootstrap_interval():
    mean, low, high = bootstrap_mean_ci([0.0, 1.0] * 50, resamples=2000, seed=0)
    assert mean == 0.5 and 0.38 < low < 0.5 < high < 0.62
    assert bootstrap_mean_ci([0.7] * 10) == pytest.approx((0.7, 0.7, 0.7))
    assert bootstrap_mean_ci([]) is None


def test_serve_judge_command_serves_the_real_client(tmp_path):
    faults = tmp_path / "faults.json"
    faults.write_text(json.dumps({"rules": {"REFUSE": ["refusal"]}}))
    with judge_serve("--faults", str(faults)) as (base_url, _):
        judge = OpenAICompatibleJudge(config(base_url))
        outcomes = judge_and_close(judge, [request(), request("REFUSE this")])
        assert isinstance(outcomes[0], Judgement)
        assert score_verdict(outcomes[0].verdict).as_tuple() == pytest.approx((1 / 3, 1 / 2, 21 / 27))
        assert outcomes[1].reason == "refused"


def test_serve_judge_rejects_a_bad_fault_script(tmp_path):
    faults = tmp_path / "faults.json"
    faults.write_text(json.dumps({"rules": {"x": ["explode"]}}))
    result = CliRunner(env={"COLUMNS": "120"}).invoke(app, ["judge", "serve", "--faults", str(faults)])
    assert result.exit_code == 2 and "unknown fault 'explode'" in result.output


def test_score_reports_progress_in_a_log(workspace, monkeypatch):
    """Off a terminal (a log file, CI) `score` writes periodic lines with count, rate and ETA."""
    import functools

    import balcaprl.progress

    ticks = iter(range(10, 1000, 10))  # ten seconds pass between two readings of the clock
    clocked = functools.partial(
        balcaprl.progress.Progress, clock=lambda: float(next(ticks)), heartbeat=False, interval_s=10
    )
    monkeypatch.setattr(balcaprl.progress, "Progress", clocked)
    _, tmp, images, judge_yaml, _, references = workspace
    captions = tmp / "two.json"
    captions.write_text(json.dumps({"a.png": CAPTION, "b.png": FULL}))
    result = score(images, captions, references, judge_yaml, tmp / "out")
    assert result.exit_code == 0, result.output
    # readings: start 10; the total is set (check at 20: a line, nothing done yet); each caption
    # reads twice (30/40, 50/60), and a line is due 10 s after the last; the end at 70
    assert [line for line in result.output.splitlines() if line.startswith("judging:")] == [
        "judging: started",
        "judging: 0/2 captions (0%), elapsed 0:00:10, no progress for 0:00:10",
        "judging: 1/2 captions (50%), 0.1 captions/s, elapsed 0:00:30, ETA 0:00:20",
        "judging: 2/2 captions (100%), 0.1 captions/s, elapsed 0:00:50, ETA 0:00:00",
        "judging: done, 2/2 captions in 0:01:00 (0.0 captions/s)",
    ]


def test_captions_written_by_caption_meet_references_keyed_in_the_image_folder(workspace, monkeypatch):
    """`balcaprl caption` names images as paths from the working folder (or absolute): they are matched
    on their path in --images, where the references name them (before, every row failed as bad_input)."""
    server, tmp, images, judge_yaml, _, references = workspace
    monkeypatch.chdir(tmp)
    captions = tmp / "from-caption.jsonl"
    rows = [{"key": "a.png", "image": str(images / "a.png"), "caption": CAPTION},  # absolute
            {"key": "b.png", "image": "images/b.png", "caption": FULL}]  # fmt: skip
    captions.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = score(images, captions, references, judge_yaml, tmp / "matched")
    assert result.exit_code == 0, result.output
    scored = [json.loads(line) for line in (tmp / "matched" / "scores.jsonl").read_text().splitlines()]
    assert [(r["image"], r["failure"]) for r in scored] == [("a.png", None), ("b.png", None)]
