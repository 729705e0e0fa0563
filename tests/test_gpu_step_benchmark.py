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
    assert list(figures["variants"]) == ["before", "after", "mix"]
    # the mix variant's update sees shorter captions than the all-at-the-cap batch it runs beside
    at_cap, mix = (figures["variants"][v]["steps"][0]["generated_tokens"] for v in ("after", "mix"))
    assert mix < at_cap
    assert figures["variants"]["mix"]["caption_mix"]["source"].startswith("STAND_IN_CAPTION_MIX")
    assert figures["judge"] == {"latency_s": 1.0, "concurrency": 128, "server": "balcaprl.testing loopback"}
    assert figures["batch"]["updates_per_batch"] == 4  # the recipe's, not the one update of the first run
    for name, variant in figures["variants"].items():
        steps = variant["steps"]
        assert [s["step"] for s in steps] == [1, 2, 3, 4]  # one generation batch feeds 4 updates
        first, *updates = steps
        # the judge's 1 s, less what overlapped generation and the old log-probs (train.judge_overlap)
        assert 0 < first["judge_s"] <= first["wall_s"] and first["generation_s"] > 0
        assert first["generated_tokens"] > 0
        assert first["captions"] == 8 and first["advantages_max_abs_diff_vs_c_gdpo"] <= 1e-6
        assert all(s["judge_s"] == 0 and s["generation_s"] == 0 for s in updates)
        for step in steps:
            assert step["update_s"] > 0 and step["update_model_tflop"] > 0
            parts = (
                step["generation_s"]
                + step["judge_s"]
                + step["old_logprobs_and_advantages_s"]
                + step["update_s"]
            )
            assert parts == pytest.approx(step["wall_s"], rel=1e-6)
        assert [s["profiled"] for s in steps] == [False, False, False, True]
        assert variant["profile"]["step"] == 4 and variant["profile"]["top"]
        assert "balcaprl train" in figures["train_commands"][name]
        # the run's own metrics file: the trainer logged the steps through the normal path
        metrics = [
            json.loads(line)
            for line in (tmp_path / "work" / f"run-{name}" / "metrics.jsonl").read_text().splitlines()
        ]
        assert [m["step"] for m in metrics if m["kind"] == "step"] == [1, 2, 3, 4]
    before, after = (figures["variants"][v]["profile"]["attention_calls"] for v in ("before", "after"))
    # one SDPA call per vision layer after, one per window (and per image) before
    assert 0 < after["vision"]["calls"] < before["vision"]["calls"]
    assert "model.vision_attention=varlen_sdpa" in figures["train_commands"]["after"]
    assert "model.layers_without_recompute=0" in figures["train_commands"]["before"]
    assert figures["model"]["architecture"].startswith("Qwen/Qwen2.5-VL-3B-Instruct")


def test_the_full_architecture_is_qwen2_5_vl_3b_and_the_batch_follows_the_plan():
    import torch
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from balcaprl.plan.memory import Launcher, model_shape, plan_memory
    from balcaprl.recipe import load_recipe

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


def test_the_update_flops_count_the_vision_attention_and_the_merger_by_hand():
    bench = load_benchmark()
    info = {
        "layers": 2, "hidden_size": 8, "vocab_size": 10, "vision_hidden_size": 4, "vision_layers": 3,
        "vision_full_attention_layers": 1,
        "parameters_by_part": {"language_model_layers": 100, "vision_blocks": 50, "vision_merger": 20},
    }  # fmt: skip
    # two rows of 5 and 7 tokens, 3 caption tokens, 256 patches (128 an image: windows of 64)
    forward = 2 * 100 * 12 + 2 * 10 * 8 * 3 + 2 * 50 * 256 + 2 * 20 * 64
    forward += 2 * 2 * 8 * (25 + 49) + 4 * 4 * 256 * (2 * 64 + 1 * 128)
    assert bench.batch_flops(info, [5, 7], 3, 256) == 3 * forward


def test_a_caption_is_cut_to_its_drawn_length_and_ends_as_a_finished_one():
    bench = load_benchmark()
    ids = [[5, 6, 7, 8, 9], [5, 6], [1, 2, 3, 4, 5, 6]]
    logprobs = [[-1.0] * 5, [-2.0] * 2, [-3.0] * 6]
    cut, cut_logprobs = bench.cut_to_mix(ids, logprobs, [3], eos_id=0)
    # every draw is 3: a longer caption keeps 2 tokens and ends in EOS; a shorter one is kept whole
    assert cut == [[5, 6, 0], [5, 6], [1, 2, 0]]
    assert cut_logprobs == [[-1.0] * 3, [-2.0] * 2, [-3.0] * 3]
    assert bench.cut_to_mix(ids, None, [3], eos_id=0)[1] is None
    # draws follow the seed: the same seed cuts the same way, over a mix of lengths
    long = [list(range(1, 50))] * 20
    first, _ = bench.cut_to_mix(long, None, [4, 10, 30], eos_id=0, seed=7)
    assert first == bench.cut_to_mix(long, None, [4, 10, 30], eos_id=0, seed=7)[0]
    assert {len(c) for c in first} <= {4, 10, 30} and len({len(c) for c in first}) > 1


def test_each_variant_runs_what_its_plan_is_made_for():
    bench = load_benchmark()
    assert bench.variant_overrides("before", 8) == [
        "model.vision_attention=default", "model.layers_without_recompute=0", "train.padding_free=false",
    ]  # fmt: skip
    assert bench.variant_overrides("after", 8)[1:] == [
        "model.layers_without_recompute=8",
        "train.padding_free=true",
    ]
    assert bench.variant_overrides("padded", 8)[-1] == "train.padding_free=false"
    assert bench.variant_overrides("mix", 8) == bench.variant_overrides("after", 8)
    assert bench.missing_serve_extra() == []  # the dev install has the [serve] extra the judge needs
