"""The real-token share of padded micro-batches: by hand on a small batch, and on the prepared
ShareGPT4V fixture (image tokens from the Qwen2.5-VL grid, caption lengths from the references)."""

from __future__ import annotations

from pathlib import Path

import pytest

from balcaprl.data.sharegpt4v.prepare import PrepareOptions, prepare_sharegpt4v
from balcaprl.plan.memory import launcher_from_accelerate, plan_memory
from balcaprl.plan.token_share import Lengths, dataset_lengths, expected_share, padded_batches
from balcaprl.recipe import load_recipe
from balcaprl.testing.sharegpt4v_fixture import make_sharegpt4v_fixture

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_padded_batches_by_hand():
    lengths = [Lengths(10, 5), Lengths(20, 1), Lengths(4, 4)]
    # two prompts a generation batch, 2 rollouts each: widths 20 + 5 and 4 + 4
    share = padded_batches(lengths, prompts_per_generation=2, rollouts=2)
    assert share.real == 2 * (15 + 21) + 2 * 8 and share.padded == 4 * 25 + 2 * 8 and share.rows == 6
    assert share.share == pytest.approx(88 / 116)
    assert padded_batches([Lengths(7, 3)] * 4, 4, 8).share == 1.0  # equal lengths: no padding


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("share")
    fixture = make_sharegpt4v_fixture(root / "src", n_good=40, bad=False, size=(640, 480))
    out = root / "data"
    prepare_sharegpt4v(
        fixture.json_path, fixture.image_root, out, options=PrepareOptions(eval_size=4, workers=0)
    )
    return out


def test_the_fixtures_lengths_and_the_plans_note(prepared):
    recipe = load_recipe(CONFIGS / "qwen2_5_vl_3b.yaml", [f"data.path={prepared}"])
    lengths, counted = dataset_lengths(prepared, recipe)
    # 640 x 480 on the 28-pixel grid: 644 x 476, 23 x 17 = 391 image tokens, + 64 of chat template.
    assert {s.prompt for s in lengths} == {391 + 64} and not counted
    assert all(1 <= s.caption <= 1024 for s in lengths)
    share = expected_share(prepared, recipe, gpus=8)  # 256 prompts / 8 GPUs: 32 a generation batch
    real = sum(s.prompt + s.caption for s in lengths)
    widest = 455 + max(s.caption for s in lengths)
    assert share.real == 8 * real and share.padded == 8 * len(lengths) * widest  # 36 prompts: one batch
    plan = plan_memory(recipe, launcher_from_accelerate(CONFIGS / "accelerate/fsdp.yaml"))
    note = next(n for n in plan.notes if n.startswith("real tokens"))
    assert f"padded rows would hold {share.share:.0%} real tokens" in note and "packed rows, 100%" in note
