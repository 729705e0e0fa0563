"""The verl loss mode balcaprl_dual_clip: verl's own dual-clip PPO loss and metrics, unchanged, plus the
ratio's mean and max; its clip shares agree with balcaprl.train.loss.ratio_statistics (the TRL backend's);
the trainer reports all four under the TRL backend's names."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("verl")

from omegaconf import OmegaConf  # noqa: E402
from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla, get_policy_loss_fn  # noqa: E402

import balcaprl.train.verl_backend.plugin  # noqa: E402, F401  (registers the loss mode)
from balcaprl.train.loss import POLICY_METRICS, ratio_statistics  # noqa: E402
from balcaprl.train.verl_backend.policy_loss import LOSS_MODE, VERL_POLICY_METRICS  # noqa: E402
from balcaprl.train.verl_backend.render import POLICY_LOSS  # noqa: E402


def actor_config():
    return OmegaConf.create(
        {
            "clip_ratio": 0.2,
            "clip_ratio_low": 0.2,
            "clip_ratio_high": 0.2,
            "clip_ratio_c": 3.0,
            "global_batch_info": {"dp_size": 1, "batch_num_tokens": None, "global_batch_size": None},
        }
    )


def crafted():
    # Token-level advantages as verl passes them (B, T); ratios in every region; the last token masked.
    ratios = torch.tensor([[0.5, 1.1, 3.5, 2.0], [1.3, 0.7, 9.0, 1.0]])
    old = -torch.rand(2, 4, generator=torch.Generator().manual_seed(0))
    advantages = torch.tensor([[-1.0] * 4, [2.0] * 4])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]], dtype=torch.bool)
    return old, old + ratios.log(), advantages, mask


def test_the_loss_mode_is_verls_vanilla_loss_with_the_ratio_metrics():
    assert LOSS_MODE == POLICY_LOSS and get_policy_loss_fn(LOSS_MODE).__module__.endswith("policy_loss")
    old, new, advantages, mask = crafted()
    kwargs = dict(old_log_prob=old, log_prob=new, advantages=advantages, response_mask=mask)
    kwargs.update(loss_agg_mode="seq-mean-token-sum", config=actor_config())
    loss, metrics = get_policy_loss_fn(LOSS_MODE)(**kwargs)
    vanilla_loss, vanilla_metrics = compute_policy_loss_vanilla(**kwargs)
    torch.testing.assert_close(loss, vanilla_loss)
    assert {k: v for k, v in metrics.items() if k in vanilla_metrics} == vanilla_metrics
    # 7 unmasked tokens: ratios 0.5 1.1 3.5 2.0 1.3 0.7 9.0.
    assert metrics["actor/ratio_mean"] == pytest.approx(
        (0.5 + 1.1 + 3.5 + 2.0 + 1.3 + 0.7 + 9.0) / 7, rel=1e-5
    )
    assert metrics["actor/ratio_max"] == pytest.approx(9.0, rel=1e-5)


def test_verls_clip_shares_are_the_ones_the_trl_backend_logs():
    old, new, advantages, mask = crafted()
    _, metrics = compute_policy_loss_vanilla(
        old_log_prob=old, log_prob=new, advantages=advantages, response_mask=mask, config=actor_config()
    )
    tokens, _, _, dual = ratio_statistics(new, old, advantages, mask, 3.0).tolist()
    # Clipped (TRL's clip_ratio/region_mean counts the same tokens): A < 0 and r < 0.8 (0.5);
    # A > 0 and r > 1.2 (1.3, 9.0). Dual: A < 0 and r > 3 (3.5).
    ratio, adv = torch.exp(new - old), advantages
    clipped = float(((((ratio < 0.8) & (adv < 0)) | ((ratio > 1.2) & (adv > 0))) & mask.bool()).sum())
    assert (clipped, dual) == (3.0, 1.0)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(clipped / tokens)
    assert metrics["actor/pg_clipfrac_lower"] == pytest.approx(dual / tokens)


def test_the_trainer_reports_them_under_the_shared_names():
    from balcaprl.train.verl_backend.trainer import policy_metrics

    assert sorted(VERL_POLICY_METRICS.values()) == sorted(POLICY_METRICS)
    verl = {
        "actor/pg_clipfrac": 0.25,
        "actor/pg_clipfrac_lower": 0.05,
        "actor/ratio_mean": 1.01,
        "actor/ppo_kl": 0.0,
    }
    assert policy_metrics(verl) == {
        "policy/clipped_share": 0.25,
        "policy/dual_clipped_share": 0.05,
        "policy/ratio_mean": 1.01,
    }
