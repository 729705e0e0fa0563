"""TRL's loss as configured by the recipe is the paper's: dual-clip PPO, token-sum-sequence-mean, no KL."""

from __future__ import annotations

import math

import pytest
import torch
from train_testkit import ScriptedJudge, tiny_recipe_dict

from balcaprl.recipe import recipe_from_dict
from balcaprl.train.loss import LOSS_TYPES, reference_policy_loss, trl_loss_settings


@pytest.fixture(scope="module")
def trainer(tiny_policy, tiny_dataset, tmp_path_factory):
    from balcaprl.train import build_trainer

    recipe = recipe_from_dict(
        tiny_recipe_dict(tiny_policy, tiny_dataset, tmp_path_factory.mktemp("loss-run"))
    )
    return build_trainer(recipe, ScriptedJudge())


def crafted(batch: int = 8, length: int = 6, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    # Ratios spread over every clip region: below 1-eps, inside, between 1+eps and c=3, above c.
    log_ratios = torch.log(torch.tensor([0.5, 0.9, 1.0, 1.1, 1.5, 2.9, 3.5, 10.0]))
    old = -torch.rand(batch, length, generator=g) * 3
    pick = torch.randint(0, len(log_ratios), (batch, length), generator=g)
    logps = (old + log_ratios[pick]).clone().requires_grad_(True)
    advantages = torch.tensor([1.3, -0.7, 0.0, -2.1, 0.4, -0.2, 2.2, -1.0])[:batch]
    lengths = torch.tensor([6, 3, 1, 5, 6, 2, 4, 6])[:batch]
    mask = (torch.arange(length).unsqueeze(0) < lengths.unsqueeze(1)).long()
    return logps, old, advantages, mask


def trl_loss(trainer, logps, old, advantages, mask, micro_batches: int):
    """Run TRL's _compute_loss over micro-batches as gradient accumulation does, with crafted log-probs."""
    batch, length = logps.shape
    size = batch // micro_batches
    trainer.current_gradient_accumulation_steps = micro_batches
    trainer.model.train()
    total = 0.0
    for start in range(0, batch, size):
        part = slice(start, start + size)

        def fake_logps(*args, _part=part, **kwargs):
            return logps[_part], torch.zeros_like(logps[_part]), None

        trainer._get_per_token_logps_and_entropies = fake_logps
        inputs = {
            "prompt_ids": torch.zeros(size, 2, dtype=torch.long),
            "prompt_mask": torch.ones(size, 2, dtype=torch.long),
            "completion_ids": torch.zeros(size, length, dtype=torch.long),
            "completion_mask": mask[part],
            "advantages": advantages[part],
            "old_per_token_logps": old[part],
            "num_items_in_batch": mask.sum(),
        }
        total = total + trainer._compute_loss(trainer.model, inputs)
    del trainer._get_per_token_logps_and_entropies
    return total


@pytest.mark.parametrize("micro_batches", [1, 2, 4])
def test_trl_loss_is_the_papers_token_sum_sequence_mean_dual_clip(trainer, micro_batches):
    assert trainer.loss_type == "luspo" and trainer.importance_sampling_level == "token"
    assert trainer.args.delta == 3.0 and trainer.beta == 0.0 and trainer.ref_model is None
    logps, old, advantages, mask = crafted()
    ours = trl_loss(trainer, logps, old, advantages, mask, micro_batches)
    (ours_grad,) = torch.autograd.grad(ours, logps)
    reference = reference_policy_loss(logps, old, advantages, mask, clip_epsilon=0.2, dual_clip_c=3.0)
    (reference_grad,) = torch.autograd.grad(reference, logps)
    torch.testing.assert_close(ours, reference, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(ours_grad, reference_grad, atol=1e-6, rtol=1e-6)
    assert reference_grad.abs().sum() > 0


def test_dual_clip_bounds_negative_advantages_only():
    """The reference itself: for A < 0 and ratio above c the per-token loss is -c A, constant."""
    old = torch.zeros(2, 1)
    mask = torch.ones(2, 1)
    for ratio in (3.5, 10.0):
        logps = torch.log(torch.tensor([[ratio], [ratio]]))
        loss = reference_policy_loss(logps, old, torch.tensor([-1.0, -1.0]), mask)
        assert loss.item() == pytest.approx(3.0)
        positive = reference_policy_loss(logps, old, torch.tensor([1.0, 1.0]), mask)
        assert positive.item() == pytest.approx(-1.2)  # PPO clip at 1 + eps
    no_dual = reference_policy_loss(
        torch.log(torch.tensor([[10.0]])),
        torch.zeros(1, 1),
        torch.tensor([-1.0]),
        torch.ones(1, 1),
        dual_clip_c=None,
    )
    assert no_dual.item() == pytest.approx(10.0)


def test_aggregation_is_a_sum_over_tokens_then_a_mean_over_sequences():
    old = torch.zeros(2, 4)
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]])
    loss = reference_policy_loss(old.clone(), old, torch.tensor([1.0, 1.0]), mask)
    assert loss.item() == pytest.approx(-(4 + 1) / 2)  # not -(4 + 1) / 5 (token mean), not -1 (seq mean)


def test_loss_settings_map_the_recipe_onto_trl():
    assert trl_loss_settings("token_sum_sequence_mean", 0.2, None, 3.0, 0.0) == {
        "loss_type": "luspo",
        "importance_sampling_level": "token",
        "epsilon": 0.2,
        "epsilon_high": None,
        "delta": 3.0,
        "beta": 0.0,
    }
    assert LOSS_TYPES["token_mean"] == "dapo" and LOSS_TYPES["sequence_mean_token_mean"] == "grpo"
    with pytest.raises(ValueError, match="loss_aggregation"):
        trl_loss_settings("mean", 0.2, None, 3.0, 0.0)
    assert math.isfinite(3.0)
