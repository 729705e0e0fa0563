"""Clipping that binds: with several optimizer updates per generation batch the importance ratio leaves 1
after the first update, and every step logs the ratio's mean and max and the clipped and dual-clipped
shares (TRL's own clip share under the shared name; train/loss.py: ratio_statistics for the rest)."""

from __future__ import annotations

import math

import pytest
import torch
from train_testkit import ScriptedJudge, tiny_recipe_dict

from balcaprl.recipe import recipe_from_dict
from balcaprl.train.loss import POLICY_METRICS, RatioStatistics, ratio_statistics
from balcaprl.train.metrics import read_jsonl


def test_ratio_statistics_by_hand():
    # Two sequences, three tokens each, the last token of the second masked out.
    old = torch.zeros(2, 3)
    ratios = torch.tensor([[0.5, 1.1, 3.5], [1.3, 0.7, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    advantages = torch.tensor([-1.0, 2.0])
    sums = ratio_statistics(ratios.log(), old, advantages, mask, 3.0)
    # Tokens 5; ratios 0.5 + 1.1 + 3.5 + 1.3 + 0.7 = 7.1; max 3.5 (9.0 is masked).
    # Dual-clipped: A < 0 and r > 3 -> 3.5.
    torch.testing.assert_close(sums, torch.tensor([5.0, 7.1, 3.5, 1.0], dtype=torch.float64))
    on_policy = ratio_statistics(ratios.log(), None, advantages, mask, 3.0)
    torch.testing.assert_close(on_policy, torch.tensor([5.0, 5.0, 1.0, 0.0], dtype=torch.float64))
    # Per-token advantages; no dual-clip, no dual-clipped tokens; a higher c leaves 3.5 alone.
    wide = ratio_statistics(ratios.log(), old, advantages.unsqueeze(1).expand(2, 3), mask, None)
    assert (
        wide[3].item() == 0.0 and ratio_statistics(ratios.log(), old, advantages, mask, 4.0)[3].item() == 0.0
    )


def test_statistics_accumulate_over_micro_batches():
    stats = RatioStatistics()
    assert stats.pop() == {}
    stats.add(torch.tensor([2.0, 2.4, 1.5, 0.0], dtype=torch.float64))
    stats.add(torch.tensor([3.0, 2.7, 1.1, 1.0], dtype=torch.float64))
    assert stats.pop() == pytest.approx(
        {"policy/ratio_mean": 5.1 / 5, "policy/ratio_max": 1.5, "policy/dual_clipped_share": 0.2}
    )
    assert stats.pop() == {}  # a fresh start for the next step


def test_the_clip_binds_from_the_second_update_of_a_batch(tiny_policy, tiny_dataset, tmp_path):
    """Two updates per batch of 8 captions (4 each); a large step so the policy moves visibly."""
    from balcaprl.train import build_trainer

    recipe = recipe_from_dict(
        tiny_recipe_dict(
            tiny_policy,
            tiny_dataset,
            tmp_path,
            train={"updates_per_batch": 2, "max_steps": 2, "learning_rate": 0.05},
            run={"save_steps": 2, "log_rollouts_every": 2},
        )
    )
    judge = ScriptedJudge(fail_every=None)
    trainer = build_trainer(recipe, judge)
    assert trainer.args.gradient_accumulation_steps == 1 and trainer.args.steps_per_generation == 2
    trainer.train()
    assert judge.calls == 1  # one generation batch feeds both updates
    # Logged under the first step it feeds, because it also feeds step 2 (a multiple of 2).
    assert {row["step"] for row in read_jsonl(tmp_path / "rollouts.jsonl")} == {1}
    first, second = (r for r in read_jsonl(tmp_path / "metrics.jsonl") if r["kind"] == "step")
    assert all(key in first and key in second for key in POLICY_METRICS)
    # First update: the policy that sampled the batch (ratio 1 up to float noise): nothing is clipped.
    assert first["policy/ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert first["policy/ratio_max"] == pytest.approx(1.0, abs=1e-4)
    assert first["policy/clipped_share"] == 0.0
    # Second update: the policy moved; the clip binds.
    assert second["policy/clipped_share"] > 0
    assert abs(second["policy/ratio_mean"] - 1) > 1e-3 and second["policy/ratio_max"] > 1.0
    # TRL's own region metric, under the name both backends share.
    assert second["policy/clipped_share"] == pytest.approx(second["clip_ratio/region_mean"], abs=1e-6)
    assert 0 <= second["policy/dual_clipped_share"] <= 1
    assert all(math.isfinite(second[key]) for key in POLICY_METRICS)
