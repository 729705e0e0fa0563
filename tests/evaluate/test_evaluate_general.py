"""General benchmarks through lmms-eval: the command we build, and importing a results file in
lmms-eval's own format (``<output_path>/<model>/<date>_results.json``) into eval.json."""

from __future__ import annotations

import json
import sys

import pytest
from typer.testing import CliRunner

from balcaprl.cli import app
from balcaprl.evaluate.general import (
    find_results_file,
    import_lmms_eval_results,
    lmms_eval_command,
    record_general,
    select,
)
from balcaprl.evaluate.suite import read_eval

# The shape lmms-eval writes (EvaluationTracker.save_results_aggregated): "results" per task with
# "<metric>,<filter>" keys and their stderr, plus configs, versions, n-samples, config, dates...
LMMS_RESULTS = {
    "results": {
        "blink": {"alias": "blink", "blink_acc,none": 0.4791, "blink_acc_stderr,none": "N/A"},
        "chartqa": {
            "alias": "chartqa",
            "relaxed_overall,none": 0.8328,
            "relaxed_overall_stderr,none": 0.0074,
            "relaxed_human_split,none": 0.75,
            "relaxed_augmented_split,none": 0.91,
        },  # fmt: skip
        "docvqa_val": {"alias": "docvqa_val", "anls,none": 0.9285, "anls_stderr,none": 0.003},
        "infovqa_val": {"alias": "infovqa_val", "anls,none": 0.7422, "anls_stderr,none": 0.007},
        "mmbench_en_dev": {
            "alias": "mmbench_en_dev",
            "gpt_eval_score,none": 55.88,
            "gpt_eval_score_stderr,none": "N/A",
        },
        "mmstar": {"alias": "mmstar", "coarse perception,none": 0.7, "average,none": 0.5579},
        "ocrbench": {"alias": "ocrbench", "ocrbench_accuracy,none": 0.787},
        "scienceqa_img": {
            "alias": "scienceqa_img",
            "exact_match,none": 0.8335,
            "exact_match_stderr,none": 0.008,
        },
        "seedbench": {"alias": "seedbench", "seed_image,none": 0.7494, "seed_all,none": 0.70},
        # textvqa_val missing: the run was cut short
    },
    "group_subtasks": {"chartqa": []},
    "configs": {"chartqa": {"task": "chartqa"}},
    "versions": {"chartqa": "Yaml"},
    "n-shot": {"chartqa": 0},
    "higher_is_better": {"chartqa": {"relaxed_overall": True}},
    "n-samples": {"chartqa": {"original": 2500, "effective": 2500}},
    "config": {"model": "qwen2_5_vl", "model_args": "pretrained=/ckpt/balcaprl-3b", "batch_size": "1"},
    "git_hash": "abc123",
    "date": "20260101_120000",
    "task_hashes": {},
    "model_source": "qwen2_5_vl",
    "model_name": "/ckpt/balcaprl-3b",
    "model_name_sanitized": "__ckpt__balcaprl-3b",
}


def write_results(root):
    folder = root / "lmms_eval" / "__ckpt__balcaprl-3b"
    folder.mkdir(parents=True)
    path = folder / "20260101_120000_results.json"
    path.write_text(json.dumps(LMMS_RESULTS))
    (folder / "20260101_120000_samples_chartqa.jsonl").write_text("{}\n")
    return path


def test_command_construction(tmp_path):
    argv = lmms_eval_command("/ckpt/x", tmp_path / "out", python="python")
    assert argv[:3] == ["python", "-m", "lmms_eval"]
    assert argv[argv.index("--tasks") + 1] == (
        "blink,chartqa,docvqa_val,infovqa_val,mmbench_en_dev,mmstar,ocrbench,scienceqa_img,seedbench,textvqa_val"
    )
    assert argv[argv.index("--model") + 1] == "qwen2_5_vl"
    assert argv[argv.index("--model_args") + 1] == "pretrained=/ckpt/x"
    assert argv[argv.index("--output_path") + 1] == str(tmp_path / "out") and "--log_samples" in argv
    argv = lmms_eval_command("/ckpt/x", tmp_path, benchmarks=select(["ChartQA", "ocrbench"]), model_type="llava_hf",
                             model_args="device_map=auto", num_processes=4, limit=8, python="py", extra=["--seed", "1"])  # fmt: skip
    assert argv[:6] == ["py", "-m", "accelerate.commands.launch", "--num_processes=4", "-m", "lmms_eval"]
    assert argv[argv.index("--tasks") + 1] == "chartqa,ocrbench"
    assert argv[argv.index("--model_args") + 1] == "pretrained=/ckpt/x,device_map=auto"
    assert argv[argv.index("--limit") + 1] == "8" and argv[-2:] == ["--seed", "1"]
    with pytest.raises(ValueError, match="unknown general benchmark"):
        select(["MMMU"])


def test_import_results_in_lmms_eval_format(tmp_path):
    path = write_results(tmp_path)
    assert find_results_file(tmp_path / "lmms_eval") == path
    imported = import_lmms_eval_results(path)
    scores = imported["scores"]
    assert scores == {
        "BLINK": pytest.approx(47.91), "ChartQA": pytest.approx(83.28), "DocVQA": pytest.approx(92.85),
        "InfoVQA": pytest.approx(74.22), "MMBench": 55.88, "MMStar": pytest.approx(55.79),
        "OCRBench": pytest.approx(78.7), "ScienceQA": pytest.approx(83.35), "SEEDBench": pytest.approx(74.94),
    }  # fmt: skip
    assert (
        imported["missing"] == ["TextVQA"]
        and imported["metrics_used"]["SEEDBench"] == "seedbench:seed_image,none"
    )
    assert imported["average"] == pytest.approx(sum(scores.values()) / 9)
    assert imported["model"] == "/ckpt/balcaprl-3b"
    eval_json = record_general(tmp_path / "eval", imported, label="balcaprl-3b")
    record = read_eval(tmp_path / "eval")
    assert eval_json.is_file() and record["headline"]["general"]["ChartQA"] == pytest.approx(83.28)
    assert record["label"] == "balcaprl-3b"
    with pytest.raises(ValueError, match="not an lmms-eval results file"):
        bad = tmp_path / "bad.json"
        bad.write_text("{}")
        import_lmms_eval_results(bad)


def test_cli_dry_run_and_import(tmp_path):
    result = CliRunner(env={"COLUMNS": "120"}).invoke(app, ["evaluate-general", "--model", "/ckpt/x", "--out",
                                                            str(tmp_path / "e"), "--benchmarks", "ChartQA,TextVQA",
                                                            "--dry-run"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert f"{sys.executable} -m lmms_eval --model qwen2_5_vl" in result.output
    assert "--tasks chartqa,textvqa_val" in result.output and not (tmp_path / "e").exists()
    write_results(tmp_path)
    result = CliRunner(env={"COLUMNS": "120"}).invoke(app, ["evaluate-general", "--out", str(tmp_path / "e"),
                                                            "--import-only", str(tmp_path / "lmms_eval")])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "ChartQA: 83.28" in result.output and "not in the results: TextVQA" in result.output
    assert read_eval(tmp_path / "e")["results"]["general"]["scores"]["OCRBench"] == pytest.approx(78.7)
    result = CliRunner(env={"COLUMNS": "120"}).invoke(
        app, ["evaluate-general", "--model", "/ckpt/x", "--out", str(tmp_path / "f")]
    )
    # lmms-eval is not installed here: nothing is run and nothing is faked
    assert result.exit_code == 2 and "lmms-eval is not installed" in result.output


def test_a_mistyped_local_model_path_is_refused_before_lmms_eval_runs(tmp_path, monkeypatch):
    # lmms-eval installed (pretended): the model is loaded here, so runs/nope (runs/ exists here)
    # can only be a local path; it is refused at once, never run, never looked up on the hub.
    import importlib.util
    import subprocess

    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: object() if name == "lmms_eval" else real_find_spec(name, *a),
    )
    ran = []
    monkeypatch.setattr(subprocess, "call", lambda argv, *a, **k: ran.append(argv) or 0)
    result = CliRunner(env={"COLUMNS": "120", "HF_HUB_OFFLINE": "1"}).invoke(
        app, ["evaluate-general", "--model", "runs/nope", "--out", "e", "--benchmarks", "ChartQA"]
    )
    assert result.exit_code == 2, result.output
    assert "error: --model runs/nope: no such folder; give a checkpoint folder or a hub id" in result.output
    assert ran == []
