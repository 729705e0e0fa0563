"""verl's dual-clip PPO loss, unchanged, plus the importance-ratio metrics the TRL backend logs.

verl 0.9.1's ``vanilla`` policy loss (``core_algos.compute_policy_loss_vanilla``) is the paper's
objective with ``clip_ratio_c`` as the dual-clip constant; it logs ``actor/pg_clipfrac`` (the PPO clip
binds) and ``actor/pg_clipfrac_lower`` (the dual-clip binds) but not the ratio itself. The loss mode
``balcaprl_dual_clip`` (``actor.policy_loss.loss_mode``) calls that same function and adds
``actor/ratio_mean`` and ``actor/ratio_max`` from :func:`balcaprl.train.loss.ratio_statistics`; the
trainer (``trainer.py``) then reports all four under the TRL backend's names (:data:`VERL_POLICY_METRICS`).

verl averages every loss metric over micro-batches and data-parallel ranks, so ``policy/ratio_max``
on verl is the mean of the micro-batches' maxima (TRL's is the step's maximum), and the shares are
means of per-micro-batch token shares (TRL's are token shares of the whole step).
"""

from __future__ import annotations

from typing import Any

import torch
from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla, register_policy_loss

from balcaprl.train.loss import ratio_statistics
from balcaprl.train.verl_backend.render import POLICY_LOSS as LOSS_MODE

# verl's metric -> the name both backends log it under (balcaprl.train.loss.POLICY_METRICS).
VERL_POLICY_METRICS = {
    "actor/ratio_mean": "policy/ratio_mean",
    "actor/ratio_max": "policy/ratio_max",
    "actor/pg_clipfrac": "policy/clipped_share",
    "actor/pg_clipfrac_lower": "policy/dual_clipped_share",
}


@register_policy_loss(LOSS_MODE)
def dual_clip_loss_with_ratio_metrics(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """verl's ``vanilla`` loss and metrics, and the ratio's mean and max over this micro-batch's tokens."""
    loss, metrics = compute_policy_loss_vanilla(
        old_log_prob=old_log_prob,
        log_prob=log_prob,
        advantages=advantages,
        response_mask=response_mask,
        loss_agg_mode=loss_agg_mode,
        config=config,
        rollout_is_weights=rollout_is_weights,
    )
    tokens, ratio_sum, ratio_max, _ = ratio_statistics(
        log_prob, old_log_prob, advantages, response_mask, config.get("clip_ratio_c", 3.0)
    ).tolist()
    metrics["actor/ratio_mean"] = ratio_sum / tokens if tokens else float("nan")
    metrics["actor/ratio_max"] = ratio_max if tokens else float("nan")
    return loss, metrics
