"""Every command that pays a judge stops at a rejected key (issue 23): a key revoked after a few calls
ends `evaluate`, `data recaption` and `judge audit` with one line on stderr and exit status 2, no
traceback, whatever protocol was running (`score` and `train`: tests/judge/test_judge_trust.py and
tests/train/test_train_judge_rejected.py); and `evaluate` says how many answers came from the cache."""

from __future__ import annotations

import json
import shutil

import pytest
from evaluate_testkit import synthetic_benchmarks, write_judge_yaml
from typer.testing import CliRunner

from balcaprl.cli import app
from balcaprl.testing.judge_server import JudgeServer
from balcaprl.testing.revocation import RevokedKey
from balcaprl.testing.scripted_judge import ScriptedJudge


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from balcaprl.data.format import read_split_rows
    from balcaprl.synthetic.build import build_dataset

    tmp = tmp_path_factory.mktemp("rejected")
    dataset = build_dataset(tmp / "ds", n_train=2, n_eval=4, seed=7)
    rows = read_split_rows(dataset, "eval")
    (tmp / "captions.json").write_text(json.dumps({r["image"].split("/")[-1]: r["reference"] for r in rows}))
    audit = "".join(json.dumps({"image": r["id"], "caption": r["reference"]}) + "\n" for r in rows)
    (tmp / "audit.jsonl").write_text(audit)
    return tmp, dataset, synthetic_benchmarks(dataset, tmp)


def commands(tmp, dataset, bench, judge, out) -> dict[str, list]:
    images = dataset / "images"
    benchmarks = ["--decapbench", bench["decapbench"], "--decapbench-images", images, "--captionqa",
                  bench["captionqa"], "--caparena", bench["caparena"], "--caparena-images", images]  # fmt: skip
    evaluate = ["evaluate", "--captions", tmp / "captions.json", "--judge", judge, "--out", out, *benchmarks]
    recaption = ["data", "recaption", "--data", dataset, "--model", "m", "--judge-config", judge]
    audit = ["judge", "audit", "--data", dataset, "--captions", tmp / "audit.jsonl", "--judge", judge,
             "--sample", "4", "--reference", "none", "--out", out]  # fmt: skip
    return {
        **{f"evaluate {suite}": [*evaluate, "--suite", suite, "--no-progress"] for suite in PROTOCOLS},
        "data recaption": [*recaption, "--no-progress"],
        "judge audit": audit,
    }


PROTOCOLS = ("dcscore", "captionqa", "caparena")


@pytest.mark.parametrize("command", [*(f"evaluate {p}" for p in PROTOCOLS), "data recaption", "judge audit"])
def test_a_key_revoked_mid_run_stops_the_command_in_one_line(world, tmp_path, command):
    tmp, dataset, bench = world
    script = RevokedKey(after=2)
    with JudgeServer(ScriptedJudge(), script, handler=lambda call: "Yes") as server:
        judge = write_judge_yaml(tmp_path / "judge.yaml", server.base_url, cache_path=None, concurrency=1)
        if command == "data recaption":  # it rewrites its dataset: a copy of its own
            dataset = shutil.copytree(dataset, tmp_path / "ds")
        args = commands(tmp, dataset, bench, judge, tmp_path / "out")[command]
        result = CliRunner(env={"COLUMNS": "60"}).invoke(app, [str(a) for a in args])
    assert script.answered == 2 and script.revoked  # it was revoked mid-run, after paid calls
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "HTTP 401" in errors[0], result.output
    assert "Traceback" not in result.output


def test_evaluate_says_how_many_answers_came_from_the_cache(world, tmp_path):
    tmp, dataset, bench = world
    with JudgeServer(ScriptedJudge(), handler=lambda call: "Yes") as server:
        judge = write_judge_yaml(
            tmp_path / "judge.yaml", server.base_url, cache_path=str(tmp_path / "c.sqlite")
        )
        outputs = []
        for out in ("first", "second"):
            args = commands(tmp, dataset, bench, judge, tmp_path / out)["evaluate captionqa"]
            result = CliRunner(env={"COLUMNS": "60"}).invoke(app, [*map(str, args), "--min-scored", "0"])
            assert result.exit_code == 0, result.output
            outputs.append(" ".join(result.output.split()))
        calls = server.counters.total
    assert calls > 0
    assert f"{calls} judge calls, 0 answers from the cache" in outputs[0]
    assert f"0 judge calls, {calls} answers from the cache" in outputs[1]
