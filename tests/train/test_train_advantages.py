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
    caption = [10.0, 40.0, 2.0, 100.0, 20.0, 21.0, 5.0, 19.0, 60.0, 20.0, 20.0]
    penalty = torch.tensor([linear_length_penalty(n, 20.0, 0.5, 2.0, 0.7) for n in caption])
    got = AdvantageStep(weights=WEIGHTS)(rewards, groups, penalty)
    base = c_gdpo_advantages(rewards, groups, WEIGHTS)
    failed = torch.isnan(rewards).all(dim=1)
    torch.testing.assert_close(got[~failed], (base - penalty)[~failed], atol=1e-6, rtol=0)
    assert torch.all(got[failed] == 0)  # a failed rollout is left out, penalty included
    assert penalty[2] > 0 and penalty[8] > 0 and penalty[0] == 0  # 2/20 < 0.5, 60/20 > 2, 10/20 in band


def test_without_a_penalty_advantages_are_the_estimators():
    ids, rewards = crafted_batch()
    groups = group_index_from_ids(ids)
    expected = c_gdpo_advantages(rewards, groups, WEIGHTS)
    step = AdvantageStep(weights=WEIGHTS)
    torch.testing.assert_close(step(rewards, groups), expected)
    torch.testing.assert_close(step(rewards, groups, torch.zeros(len(ids))), expected)


def test_invalid_settings_are_refused():
    with pytest.raises(ValueError, match="estimator"):
        AdvantageStep(weights=WEIGHTS, estimator="ppo")
    with pytest.raises(ValueError, match="length_penalty must have shape"):
        AdvantageStep(weights=WEIGHTS)(torch.rand(4, 3), [0, 0, 1, 1], torch.zeros(3))


def test_both_backends_give_identical_advantages_with_the_linear_penalty():
    """The same captions, judged and scored once: the TRL trainer's path (scorer records -> batch step)
    and verl's (compute_score's row form -> records read back -> the batch step built from verl's
    algorithm section) give the same numbers, and both equal the reference c-GDPO minus p_len on judged
    rollouts (eq. A.5)."""
    import asyncio

    from train_testkit import ScriptedJudge

    from balcaprl.rewards import LengthControlConfig, RewardConfig, RewardWeights, RolloutRecord
    from balcaprl.train.rewards import SharedVerdictScorer
    from balcaprl.train.step import BatchStep, reward_table
    from balcaprl.train.verl_backend import reward as verl_reward
    from balcaprl.train.verl_backend.estimator import batch_step_for

    config = RewardConfig(
        weights=RewardWeights(precision=0.2, recall=0.3, linguistic=0.5),
        length=LengthControlConfig(mode="linear", tau_low=0.5, tau_high=1.5, linear_strength=0.7),
    )
    reference = "a red circle on the left ."
    captions = [
        "a red circle", "a red circle on the left .", "blue", "a red circle on the left on the left on the left",
        "green triangle on the left", "a red square", "this image shows a red circle", "red", "left circle",
    ]  # fmt: skip
    ids = ["p", "q", "p", "q", "p", "r", "q", "r", "p"]
    judge = ScriptedJudge(fail_every=4, check_images=False)
    scorer = SharedVerdictScorer(judge, config)
    columns = {
        "id": ids,
        "image_path": ["x.png"] * 9,
        "reference": [reference] * 9,
        "reference_tokens": [7] * 9,
    }
    completion_ids = [[1] * len(c.split()) for c in captions]
    batch = asyncio.run(scorer.score(captions, completion_ids, **columns))
    assert any(r.failure for r in batch.rollouts) and any(r.length_penalty > 0 for r in batch.rollouts)

    # TRL: the scorer's records, the batch step build_trainer makes.
    trl = BatchStep(AdvantageStep(weights=tuple(config.weights.as_list())))(batch.rollouts, ids).advantages
    # verl: what compute_score returns per rollout, read back by the trainer, its batch step.
    settings = verl_reward.RewardSettings(rewards=config, tokenizer="policy", judge_factory="x:y")
    rows = [verl_reward._result(r, settings) for r in batch.rollouts]
    read_back = [RolloutRecord.from_row(row) for row in rows]
    verl = batch_step_for({"balcaprl": {"rewards": config.to_json()}}, "balcaprl_c_gdpo")(read_back, ids)
    assert torch.equal(trl, verl.advantages)
    # Both are the reference estimator minus the penalty, judged rollouts only.
    rewards, penalty = reward_table(read_back)
    expected = c_gdpo_advantages(rewards, group_index_from_ids(ids), config.weights.as_list())
    failed = torch.isnan(rewards).all(dim=1)
    torch.testing.assert_close(trl, torch.where(failed, expected, expected - penalty))
    assert torch.all(trl[failed] == 0) and penalty[failed].sum() == 0


def test_the_batch_step_runs_the_advantage_step_on_the_records():
    """BatchStep: the records' (N, 3) table and p_len through AdvantageStep, grouped by the given ids;
    its stop rule counts only batches whose every rollout failed, and a judged batch starts it over."""
    from balcaprl.rewards import RolloutRecord
    from balcaprl.train.step import BatchStep

    ids, rewards = crafted_batch()
    penalty = [0.1 * i for i in range(len(ids))]
    records = [
        RolloutRecord(id=i, precision=p, recall=r, linguistic=g, length_penalty=pen,
                      failure="timeout" if math.isnan(p) else None)
        for i, (p, r, g), pen in zip(ids, rewards.double().tolist(), penalty, strict=True)
    ]  # fmt: skip
    step = BatchStep(AdvantageStep(weights=WEIGHTS), max_failed_batches_in_a_row=2)
    result = step(records, ids)
    expected = AdvantageStep(weights=WEIGHTS)(
        rewards.double(), group_index_from_ids(ids), torch.tensor(penalty, dtype=torch.float64)
    )
    assert (
        torch.equal(result.advantages, expected)
        and result.group_index.tolist() == group_index_from_ids(ids).tolist()
    )
    assert result.metrics["judge/failures"] == 2.0 and result.metrics["length/penalty_mean"] == pytest.approx(
        0.5
    )
    failed = [r for r in records if not r.judged]
    step(failed, ["c", "a"])
    step(records, ids)  # a judged rollout: the count starts over
    step(failed, ["c", "a"])
    assert step.failed_in_a_row == 1
    with pytest.raises(RuntimeError, match="2 batches in a row"):
        step(failed, ["c", "a"])
