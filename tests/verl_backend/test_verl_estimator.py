"""The balcaprl estimators run through verl's own ``compute_advantage`` on real ``DataProto`` batches, with
the batch step's advantages (built from verl's algorithm section), and equal
``balcaprl.c_gdpo_advantages`` / ``grpo_advantages`` to 1e-6 per rollout."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("verl")

from omegaconf import OmegaConf  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402
from verl.trainer.ppo.ray_trainer import compute_advantage  # noqa: E402
from verl_testkit import crafted_batch  # noqa: E402

import balcaprl.train.verl_backend.plugin  # noqa: E402,F401  (registers the estimators)
from balcaprl import c_gdpo_advantages, grpo_advantages, linear_length_penalty  # noqa: E402
from balcaprl.rewards import REWARD_NAMES, RewardConfig, RewardWeights, RolloutRecord  # noqa: E402
from balcaprl.train.advantages import group_index_from_ids  # noqa: E402
from balcaprl.train.verl_backend.estimator import batch_step_for, provide_advantages  # noqa: E402

WEIGHTS = [0.1, 0.3, 0.3]


def algorithm_config(weights=WEIGHTS, **balcaprl):
    """The algorithm section as rendered: the recipe's reward config (weights inside) under balcaprl.rewards."""
    rewards = RewardConfig(weights=RewardWeights(**dict(zip(REWARD_NAMES, weights, strict=True))))
    cfg = {"gdpo_reward_keys": list(REWARD_NAMES), "balcaprl": {"rewards": rewards.to_json(), **balcaprl}}
    return OmegaConf.create(cfg)


def data_proto(uids, mask, token_level_rewards=None):
    n, length = mask.shape
    rewards = torch.zeros(n, length) if token_level_rewards is None else token_level_rewards
    return DataProto.from_dict(
        tensors={"token_level_rewards": rewards, "response_mask": mask}, non_tensors={"uid": uids}
    )


def records(rewards, penalty=None):
    """The rollout records of crafted rewards (a row of NaN is a failed judge)."""
    return [
        RolloutRecord(
            precision=p, recall=r, linguistic=g, length_penalty=0.0 if penalty is None else float(penalty[i]),
            failure="timeout" if all(v != v for v in (p, r, g)) else None,
        )
        for i, (p, r, g) in enumerate(rewards.tolist())
    ]  # fmt: skip


def run_verl(estimator, uids, rewards, mask, config=None, penalty=None):
    """What the balcaprl trainer does: the batch step on the records, its advantages provided to verl's step."""
    config = config or algorithm_config()
    step = batch_step_for(config, estimator)(records(rewards, penalty), list(uids))
    with provide_advantages(uids, step.advantages):
        out = compute_advantage(data_proto(uids, mask), adv_estimator=estimator, config=config)
    return out.batch["advantages"], out.batch["returns"]


def per_rollout(advantages, mask):
    """The one value of each rollout; asserts it is the same on every response token and 0 elsewhere."""
    first = advantages[:, 0]
    assert torch.equal(advantages, first.unsqueeze(1) * mask)
    return first.double()


def test_estimators_are_registered_with_verl():
    assert core_algos.get_adv_estimator_fn("balcaprl_c_gdpo").__name__ == "balcaprl_c_gdpo_advantage"
    assert core_algos.get_adv_estimator_fn("balcaprl_grpo").__name__ == "balcaprl_grpo_advantage"


@pytest.mark.parametrize("seed", range(5))
def test_c_gdpo_through_verl_equals_the_contract(seed):
    uids, rewards, mask = crafted_batch(seed)
    advantages, returns = run_verl("balcaprl_c_gdpo", uids, rewards, mask)
    assert torch.equal(advantages, returns)
    got = per_rollout(advantages, mask)
    expected = c_gdpo_advantages(rewards, group_index_from_ids(uids), WEIGHTS)
    assert torch.allclose(got, expected, atol=1e-6, rtol=0)
    # Failed judges (rows 3, 11, 12: all NaN) get exactly 0; a partial NaN (row 9) does not.
    assert got[[3, 11, 12]].tolist() == [0.0, 0.0, 0.0]
    assert got[9] != 0
    # Per rollout, not token-weighted: the judged rollouts' advantages have mean 0 and unbiased std 1.
    judged = ~torch.isnan(rewards).all(dim=1)
    assert abs(float(got[judged].mean())) < 1e-6
    assert abs(float(got[judged].std()) - 1.0) < 1e-5


@pytest.mark.parametrize("seed", range(3))
def test_grpo_ablation_through_verl_equals_the_contract(seed):
    uids, rewards, mask = crafted_batch(seed)
    advantages, _ = run_verl("balcaprl_grpo", uids, rewards, mask)
    expected = grpo_advantages(rewards, group_index_from_ids(uids), WEIGHTS)
    assert torch.allclose(per_rollout(advantages, mask), expected, atol=1e-6, rtol=0)


def test_linear_length_penalty_is_subtracted_from_judged_rollouts_only():
    uids, rewards, mask = crafted_batch(1)
    caption = torch.tensor([3, 40, 12, 5, 90, 20, 8, 16, 1, 30, 25, 60, 2, 10, 11], dtype=torch.float64)
    penalty = torch.tensor([linear_length_penalty(n, 20.0, 0.5, 2.0, 0.7) for n in caption.tolist()])
    advantages, _ = run_verl("balcaprl_c_gdpo", uids, rewards, mask, penalty=penalty)
    judged = ~torch.isnan(rewards).all(dim=1)
    base = c_gdpo_advantages(rewards, group_index_from_ids(uids), WEIGHTS)
    expected = torch.where(judged, base - penalty, base)
    got = per_rollout(advantages, mask)
    assert torch.allclose(got, expected, atol=1e-6, rtol=0)
    assert got[11] == 0 and penalty[11] > 0  # a failed rollout keeps 0 despite its length


def test_eps_and_weights_come_from_the_algorithm_config():
    uids, rewards, mask = crafted_batch(2)
    config = algorithm_config(weights=[1.0, 0.0, 2.0], eps=1e-2)
    advantages, _ = run_verl("balcaprl_c_gdpo", uids, rewards, mask, config=config)
    expected = c_gdpo_advantages(rewards, group_index_from_ids(uids), [1.0, 0.0, 2.0], eps=1e-2)
    assert torch.allclose(per_rollout(advantages, mask), expected, atol=1e-6, rtol=0)


def test_the_weights_are_required_from_the_reward_config():
    uids, rewards, mask = crafted_batch(2)
    config = OmegaConf.create(
        {"gdpo_reward_keys": list(REWARD_NAMES), "gdpo_reward_weights": [1.0, 1.0, 1.0]}
    )
    with pytest.raises(ValueError, match=r"algorithm\.balcaprl\.rewards"):
        run_verl("balcaprl_c_gdpo", uids, rewards, mask, config=config)


def test_verls_own_gdpo_is_not_the_contract():
    """Why balcaprl ships its own estimator: verl's gdpo whitens over tokens, so on the same (NaN-free)
    rewards its advantages differ once captions have different lengths."""
    uids, rewards, mask = crafted_batch(3)
    rewards = torch.nan_to_num(rewards, nan=0.5)
    n, length = mask.shape
    data = data_proto(uids, mask)
    data.batch["prompts"] = torch.zeros(n, 4, dtype=torch.long)
    data.batch["attention_mask"] = torch.cat([torch.ones(n, 4, dtype=torch.long), mask.long()], dim=1)
    for k, name in enumerate(REWARD_NAMES):
        data.non_tensor_batch[name] = rewards[:, k].numpy().astype(np.float32)
    config = algorithm_config()
    config.gdpo_reward_weights = WEIGHTS  # verl's own estimator reads its own key
    out = compute_advantage(data, adv_estimator="gdpo", config=config)
    verl_gdpo = out.batch["advantages"][:, 0].double()
    ours = c_gdpo_advantages(rewards, group_index_from_ids(uids), WEIGHTS)
    assert (verl_gdpo - ours).abs().max() > 1e-3


def test_columns_that_are_not_row_aligned_are_refused():
    uids, rewards, mask = crafted_batch(0)
    shuffled = uids.copy()
    shuffled[[0, 1]] = shuffled[[1, 0]]
    data = data_proto(shuffled, mask)
    advantages = c_gdpo_advantages(rewards, group_index_from_ids(uids), WEIGHTS)
    with provide_advantages(uids, advantages), pytest.raises(ValueError, match="row-aligned"):
        compute_advantage(data, adv_estimator="balcaprl_c_gdpo", config=algorithm_config())


def test_without_reward_columns_the_estimator_says_what_to_do():
    uids, _, mask = crafted_batch(0)
    with pytest.raises(RuntimeError, match="balcaprl_sync"):
        compute_advantage(data_proto(uids, mask), adv_estimator="balcaprl_c_gdpo", config=algorithm_config())


def test_reward_columns_in_non_tensor_batch_are_not_advantages():
    """A verl that passes non_tensor_batch to every estimator (verl PR #7473) still gets its advantages
    from the batch step on whole records (the trainer's context), never from partial reward columns."""
    from balcaprl.train.verl_backend.estimator import balcaprl_c_gdpo_advantage

    uids, rewards, mask = crafted_batch(0)
    non_tensor = {"uid": uids, **{name: rewards[:, k].numpy() for k, name in enumerate(REWARD_NAMES)}}
    with pytest.raises(RuntimeError, match="balcaprl_sync"):
        balcaprl_c_gdpo_advantage(
            torch.zeros_like(mask), mask, index=uids, config=algorithm_config(), non_tensor_batch=non_tensor
        )
