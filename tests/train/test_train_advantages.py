"""The trainer's advantage step is exactly the pinned reference (balcaprl.c_gdpo_advantages)."""

from __future__ import annotations

import math

import pytest
import torch

from balcaprl import c_gdpo_advantages, grpo_advantages, linear_length_penalty
from balcaprl.train.advantages import AdvantageStep, group_index_from_ids

NAN = math.nan
WEIGHTS = (0.1, 0.3, 0.3)


def crafted_batch():
    """Three prompts with interleaved rollouts, a failed rollout, a fully failed group, one group of 2."""
    ids = ["a", "b", "a", "c", "b", "a", "c", "b", "a", "d", "d"]
    rewards = torch.tensor(
        [
            [0.9, 0.2, 0.7],
            [0.1, 0.5, 0.6],
            [0.4, 0.4, 0.0],  # masked linguistic
            [NAN, NAN, NAN],  # failed judge
            [0.3, 0.9, 0.8],
            [0.8, 0.1, 0.7],
            [NAN, NAN, NAN],  # group c fails entirely
            [0.6, 0.6, 0.6],
            [0.2, 0.3, 0.9],
            [0.5, 0.5, 0.5],
            [0.7, 0.1, 0.4],
        ],
        dtype=torch.float32,
    )
    return ids, rewards


def test_group_index_from_ids_groups_interleaved_rollouts():
    assert group_index_from_ids(["x", "y", "x", "z", "y"]).tolist() == [0, 1, 0, 2, 1]


def test_c_gdpo_step_matches_reference_on_crafted_rewards():
    ids, rewards = crafted_batch()
    step = AdvantageStep(weights=WEIGHTS, estimator="c_gdpo")
    got = step(rewards, group_index_from_ids(ids))
    expected = c_gdpo_advantages(rewards, group_index_from_ids(ids), WEIGHTS, eps=1e-6)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)
    failed = torch.isnan(rewards).all(dim=1)
    assert torch.all(got[failed] == 0)  # exactly 0, not a small number
    assert torch.isfinite(got).all()
    # Batch-normalised over judged rollouts (eq. 2.6): mean 0, unbiased std 1 (up to eps).
    judged = got[~failed]
    assert judged.mean().abs() < 1e-6
    assert judged.std().item() == pytest.approx(1.0, abs=1e-4)


def test_c_gdpo_step_ignores_the_layout_of_groups():
    ids, rewards = crafted_batch()
    step = AdvantageStep(weights=WEIGHTS)
    permutation = torch.randperm(len(ids), generator=torch.Generator().manual_seed(3))
    shuffled = step(rewards[permutation], group_index_from_ids([ids[i] for i in permutation]))
    torch.testing.assert_close(
        shuffled, step(rewards, group_index_from_ids(ids))[permutation], atol=1e-6, rtol=0
    )


def test_trl_gdpo_would_differ_so_the_override_matters():
    """TRL's normalize_then_sum adds 1e-4 to the std; the contract adds 1e-6. Visible on small spreads."""
    rewards = torch.tensor([[0.5, 0.5, 0.5001], [0.5, 0.5, 0.5], [0.2, 0.4, 0.6], [0.3, 0.1, 0.9]])
    groups = torch.tensor([0, 0, 1, 1])
    ours = AdvantageStep(weights=WEIGHTS)(rewards, groups)
    grouped = rewards.view(-1, 2, 3)
    trl_like = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)).view(-1, 3)
    trl_like = trl_like @ torch.tensor(WEIGHTS)
    trl_like = (trl_like - trl_like.mean()) / (trl_like.std() + 1e-4)
    assert not torch.allclose(ours, trl_like, atol=1e-3)


def test_grpo_switch_is_the_vanilla_reference():
    ids, rewards = crafted_batch()
    got = AdvantageStep(weights=WEIGHTS, estimator="grpo")(rewards, group_index_from_ids(ids))
    expected = grpo_advantages(rewards, group_index_from_ids(ids), WEIGHTS, eps=1e-6)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)


def test_linear_length_penalty_is_subtracted_from_the_normalised_advantage():
    ids, rewards = crafted_batch()
    groups = group_index_from_ids(ids)
    caption = torch.tensor([10.0, 40.0, 2.0, 100.0, 20.0, 21.0, 5.0, 19.0, 60.0, 20.0, 20.0])
    reference = torch.full((11,), 20.0)
    step = AdvantageStep(
        weights=WEIGHTS, length_mode="linear", tau_low=0.5, tau_high=2.0, linear_strength=0.7
    )
    got = step(rewards, groups, caption, reference)
    penalty = linear_length_penalty(caption, reference, 0.5, 2.0, 0.7)
    base = c_gdpo_advantages(rewards, groups, WEIGHTS)
    failed = torch.isnan(rewards).all(dim=1)
    torch.testing.assert_close(got[~failed], (base - penalty)[~failed], atol=1e-6, rtol=0)
    assert torch.all(got[failed] == 0)  # a failed rollout is left out, penalty included
    assert penalty[2] > 0 and penalty[8] > 0 and penalty[0] == 0  # 2/20 < 0.5, 60/20 > 2, 10/20 in band
    assert torch.equal(step.length_penalty(caption, reference), penalty)


def test_mask_and_none_modes_leave_advantages_alone():
    ids, rewards = crafted_batch()
    groups = group_index_from_ids(ids)
    expected = c_gdpo_advantages(rewards, groups, WEIGHTS)
    for mode in ("mask", "none"):
        torch.testing.assert_close(
            AdvantageStep(weights=WEIGHTS, length_mode=mode)(rewards, groups), expected
        )


def test_invalid_settings_are_refused():
    with pytest.raises(ValueError, match="estimator"):
        AdvantageStep(weights=WEIGHTS, estimator="ppo")
    with pytest.raises(ValueError, match="length_mode"):
        AdvantageStep(weights=WEIGHTS, length_mode="soft")
    with pytest.raises(ValueError, match="caption_tokens"):
        AdvantageStep(weights=WEIGHTS, length_mode="linear")(torch.rand(4, 3), [0, 0, 1, 1])
