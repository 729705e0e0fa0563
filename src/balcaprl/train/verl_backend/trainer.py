"""The balcaprl trainer for verl 0.9.1's V1 trainer: verl's synchronous PPO trainer plus one step.

verl's V1 trainer (``trainer.use_v1=true``, the default) keeps every rollout in TransferQueue and its
advantage step (``PPOTrainer._compute_advantage``) reads only ``uid``, ``response_mask``, ``rm_scores``
and log-probs from it: the per-reward values that ``compute_score`` returned (stored with each rollout
under ``extra_fields["reward_extra_info"]``) never reach an estimator, not even verl's own ``gdpo``.

``BalancedPPOTrainerSync`` (``trainer.v1.trainer_mode=balcaprl_sync``) changes that step: it reads
each rollout's record from TransferQueue, in the batch's order, leaves verl's synthetic padding rows
out (they copy a real row's rewards and must not enter the batch statistics), runs the batch step that
the TRL backend runs too (``balcaprl.train.step``: the judge-failure stop rule, the advantages, the
metrics under the same names), and then runs verl's own advantage step with those advantages provided
to the balcaprl estimator (``estimator.provide_advantages``; padding rows get 0). After each actor
update it also reports the clipping and ratio metrics under the names the TRL backend uses
(``policy/...``, see ``policy_loss.py``). Everything else is verl's ``PPOTrainerSync``.

verl branches on the literal trainer mode ``"sync"`` in several places (replay buffer, refills), so
the trainer sets ``trainer.v1.trainer_mode`` back to ``"sync"`` once verl has picked this class.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omegaconf import open_dict
from verl.trainer.ppo.v1 import trainer_base
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from balcaprl.train.step import BatchStep
from balcaprl.train.verl_backend.estimator import (
    batch_step_for,
    provide_advantages,
    register_estimators,
    verl_batch_step,
)
from balcaprl.train.verl_backend.policy_loss import VERL_POLICY_METRICS

TRAINER_MODE = "balcaprl_sync"

register_estimators()  # the trainer mode is useless without them


def _as_list(values: Any) -> list[Any]:
    """TransferQueue returns non-tensor fields as a list, a tensordict stack or a numpy array."""
    if values is None:
        return []
    tolist = getattr(values, "tolist", None)
    return list(tolist()) if callable(tolist) else list(values)


def policy_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """verl's clipping and ratio metrics under the names the TRL backend logs them (those present)."""
    return {name: float(metrics[key]) for key, name in VERL_POLICY_METRICS.items() if key in metrics}


class BalancedAdvantageStep:
    """Mixin for a verl V1 ``PPOTrainer``: the batch step's advantages (see the module docstring)."""

    _balcaprl_step: BatchStep | None = None

    def _compute_advantage(self, batch: Any, metrics: dict) -> Any:
        data = trainer_base.tq.kv_batch_get(
            keys=batch.keys, partition_id=batch.partition_id, select_fields=["extra_fields"]
        )
        if self._balcaprl_step is None:  # one per run: it counts the batches the judge failed on
            algorithm = self.config.algorithm  # type: ignore[attr-defined]
            self._balcaprl_step = batch_step_for(algorithm, str(algorithm.adv_estimator))
        extra = _as_list(data["extra_fields"])
        uids, advantages, step_metrics = verl_batch_step(self._balcaprl_step, batch.keys, batch.tags, extra)
        metrics.update(step_metrics)
        with provide_advantages(uids, advantages):
            return super()._compute_advantage(batch, metrics)  # type: ignore[misc]

    def _update_actor(self, batch: Any, metrics: dict) -> Any:
        batch = super()._update_actor(batch, metrics)  # type: ignore[misc]
        metrics.update(policy_metrics(metrics))
        return batch


@register_trainer(TRAINER_MODE)
class BalancedPPOTrainerSync(BalancedAdvantageStep, PPOTrainerSync):
    """verl's ``PPOTrainerSync`` with the balcaprl advantage step."""

    def __init__(self, config: Any, *args: Any, **kwargs: Any):
        with open_dict(config):
            config.trainer.v1.trainer_mode = "sync"  # verl compares the mode with the literal "sync"
        super().__init__(config, *args, **kwargs)
