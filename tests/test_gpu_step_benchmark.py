"""benchmarks/gpu_step.py runs end to end: its CPU smoke run (--tiny: the same script, a 2-layer model) goes
through `balcaprl train` against the loopback judge with 1 s latency, times each step's phases, and checks
the advantages against c_gdpo_advantages; the batch choice for a real GPU follows the memory plan."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_step.py"


def load_benchmark():
    spec = importlib.util.spec_from_file_location("gpu_step", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_the_smoke_run_measures_three_steps(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    env["CUDA_VISIBLE_DEVICES"] = ""  # the CPU path, also on a machine with a GPU
    result = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--tiny",
            "--out",
            str(tmp_path / "out"),
            "--work",
            str(tmp_path / "work"),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    figures = json.loads((tmp_path / "out" / "gpu_step.tiny-cpu.json").read_text())
    assert [s["step"] for s in figures["steps"]] == [1, 2, 3]
    assert figures["judge"] == {"latency_s": 1.0, "concurrency": 128, "server": "balcaprl.testing loopback"}
    for step in figures["steps"]:
        assert step["judge_s"] >= 1.0  # one wave of calls, each answered after 1 s
        assert step["generation_s"] > 0 and step["update_s"] > 0 and step["generated_tokens"] > 0
        assert step["captions"] == 8 and step["advantages_max_abs_diff_vs_c_gdpo"] <= 1e-6
        parts = (
            step["generation_s"] + step["judge_s"] + step["old_logprobs_and_advantages_s"] + step["update_s"]
        )
        assert parts == pytest.approx(step["wall_s"], rel=1e-6)
    assert (
        "balcaprl train" in figures["train_command"] and "rollout.vllm.mode=off" in figures["train_command"]
    )
    assert figures["model"]["architecture"].startswith("Qwen/Qwen2.5-VL-3B-Instruct")
    # the run's own metrics file: the trainer logged the three steps through the normal path
    metrics = [
        json.loads(line) for line in (tmp_path / "work" / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [m["step"] for m in metrics if m["kind"] == "step"] == [1, 2, 3]


def test_the_full_architecture_is_qwen2_5_vl_3b_and_the_batch_follows_the_plan():
    import torch
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from balcaprl.recipe import load_recipe
    from balcaprl.train.memory_plan import Launcher, model_shape, plan_memory

    bench = load_benchmark()
    arch = bench.architecture(tiny=False)
    config = Qwen2_5_VLConfig(
        text_config=arch["text"], vision_config=arch["vision"], tie_word_embeddings=True
    )
    with torch.device("meta"):
        model = Qwen2_5_VLForConditionalGeneration(config)
    assert sum(p.numel() for p in model.parameters()) == model_shape(bench.MODEL_ID).params == 3_754_622_976
    overrides = [
        "model.dtype=bfloat16",
        "rollout.vllm.mode=off",
        "train.updates_per_batch=1",
        "run.save_steps=100",
    ]
    prompts, micro, predicted = bench.choose_batch(overrides, bench.PAPER_RECIPE, 80.0, 256)
    assert prompts & (prompts - 1) == 0 and 1 <= prompts < 256 and predicted <= 72
    bigger = load_recipe(
        bench.PAPER_RECIPE,
        [*overrides, f"train.prompts_per_batch={2 * prompts}", f"train.per_device_batch_size={micro}"],
    )
    assert (
        not plan_memory(bigger, Launcher("single", 1), 80.0).peak <= 0.9 * 80 * 2**30
    )  # the largest that fits
