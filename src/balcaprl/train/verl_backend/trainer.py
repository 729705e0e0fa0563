"""The balcaprl trainer for verl 0.9.1's V1 trainer: verl's synchronous PPO trainer plus one step.

verl's V1 trainer (``trainer.use_v1=true``, the default) keeps every rollout in TransferQueue and its
advantage step (``PPOTrainer._compute_advantage``) reads only ``uid``, ``response_mask``, ``rm_scores``
and log-probs from it: the per-reward values that ``compute_score`` returned (stored with each rollout
under ``extra_fields["reward_extra_info"]``) never reach an estimator, not even verl's own ``gdpo``.

``BalancedPPOTrainerSync`` (``trainer.v1.trainer_mode=balcaprl_sync``) changes that step: it reads
each rollout's reward columns from TransferQueue, in the batch's order, marks verl's synthetic padding
rows as failed (they copy a real row's rewards and must not enter the batch statistics), logs reward
and judge metrics, stops the run when the judge failed on every rollout of too many batches in a row
(at once when the endpoint rejected the judge's key or model: ``judge_rejected``), and then runs
verl's own advantage step with the columns provided to the balcaprl estimator
(``estimator.provide_rollout_rewards``). After each actor update it also reports the clipping and ratio
metrics under the names the TRL backend uses (``policy/...``, see ``policy_loss.py``). Everything else is
verl's ``PPOTrainerSync``.

verl branches on the literal trainer mode ``"sync"`` in several places (replay buffer, refills), so
the trainer sets ``trainer.v1.trainer_mode`` back to ``"sync"`` once verl has picked this class.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from omegaconf import open_dict
from verl.trainer.ppo.v1 import trainer_base
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from balcaprl.errors import ConfigError
from balcaprl.rewards import REWARD_NAMES
from balcaprl.train.judge_overlap import judge_stage_metrics
from balcaprl.train.rewards import JUDGE_REJECTED
from balcaprl.train.verl_backend.estimator import (
    LENGTH_PENALTY_KEY,
    RolloutRewards,
    algorithm_setting,
    provide_rollout_rewards,
    register_estimators,
)
from balcaprl.train.verl_backend.policy_loss import VERL_POLICY_METRICS

__all__ = [
    "TRAINER_MODE",
    "BalancedAdvantageStep",
    "BalancedPPOTrainerSync",
    "policy_metrics",
    "reward_columns",
]

TRAINER_MODE = "balcaprl_sync"
_NAN = float("nan")

register_estimators()  # the trainer mode is useless without them


def _as_list(values: Any) -> list[Any]:
    """TransferQueue returns non-tensor fields as a list, a tensordict stack or a numpy array."""
    if values is None:
        return []
    tolist = getattr(values, "tolist", None)
    return list(tolist()) if callable(tolist) else list(values)


def reward_columns(
    keys: Sequence[str],
    tags: Sequence[Mapping[str, Any]],
    extra_fields: Sequence[Any],
    reward_keys: Sequence[str] = REWARD_NAMES,
) -> tuple[RolloutRewards, list[Mapping[str, Any] | None]]:
    """The reward columns of a V1 batch and each real row's ``compute_score`` dict (None for padding).

    ``keys`` are TransferQueue keys ``{uid}_{session}_{index}``; ``tags`` their tags (``is_padding``);
    ``extra_fields`` each row's ``extra_fields`` (``reward_extra_info`` holds the reward dict).
    """
    if not len(keys) == len(tags) == len(extra_fields):
        raise ValueError(f"{len(keys)} keys, {len(tags)} tags and {len(extra_fields)} extra_fields differ")
    uids = [str(key).rsplit("_", 2)[0] for key in keys]
    columns: dict[str, list[Any]] = {k: [] for k in (*reward_keys, LENGTH_PENALTY_KEY)}
    infos: list[Mapping[str, Any] | None] = []
    for key, tag, extra in zip(keys, tags, extra_fields, strict=True):
        if tag.get("is_padding", False):
            infos.append(None)
            for values in columns.values():
                values.append(_NAN)
            continue
        info = extra.get("reward_extra_info") if isinstance(extra, Mapping) else None
        if not isinstance(info, Mapping) or any(k not in info for k in reward_keys):
            raise KeyError(
                f"rollout {key!r} has no balcaprl reward columns ({list(reward_keys)}) in its "
                "extra_fields.reward_extra_info; set reward.custom_reward_function.path="
                "pkg://balcaprl.train.verl_backend.reward and .name=compute_score"
            )
        infos.append(info)
        for name, values in columns.items():
            values.append(info.get(name, 0.0 if name == LENGTH_PENALTY_KEY else _NAN))
    return RolloutRewards.from_columns(uids, columns, reward_keys), infos


def batch_metrics(columns: RolloutRewards, infos: Sequence[Mapping[str, Any] | None]) -> dict[str, float]:
    """Reward and judge metrics of one batch (real rows only), under ``balcaprl/``."""
    real = [i for i, info in enumerate(infos) if info is not None]
    metrics: dict[str, float] = {"balcaprl/rollouts": float(len(real))}
    if not real:
        return metrics
    rewards = columns.rewards[real]
    judged = ~torch.isnan(rewards).all(dim=1)
    metrics["balcaprl/judge_failure_rate"] = float(1.0 - judged.double().mean())
    reasons = Counter(str(infos[i].get("failure") or "") for i in real)
    for reason, count in sorted(reasons.items()):
        if reason:
            metrics[f"balcaprl/judge_failures/{reason}"] = float(count)
    for k, name in enumerate(columns.keys):
        values = rewards[:, k]
        values = values[~torch.isnan(values)]
        metrics[f"balcaprl/reward/{name}/mean"] = float(values.mean()) if values.numel() else _NAN
    for name in ("masked", "length_ratio", "non_pointable_share", "non_visible_share", "length_penalty"):
        values = [float(infos[i].get(name, _NAN)) for i in real]
        values = [v for v in values if not math.isnan(v)]
        metrics[f"balcaprl/{name}/mean"] = sum(values) / len(values) if values else _NAN
    metrics.update(judge_stage_metrics([infos[i] for i in real]))  # judge/wall_s, judge/exposed_s
    return metrics


def policy_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """verl's clipping and ratio metrics under the names the TRL backend logs them (those present)."""
    return {name: float(metrics[key]) for key, name in VERL_POLICY_METRICS.items() if key in metrics}


class BalancedAdvantageStep:
    """Mixin for a verl V1 ``PPOTrainer``: the contract's advantages (see the module docstring)."""

    _balcaprl_failed_in_a_row = 0

    def _balcaprl_columns(self, batch: Any) -> tuple[RolloutRewards, list[Mapping[str, Any] | None]]:
        data = trainer_base.tq.kv_batch_get(
            keys=batch.keys, partition_id=batch.partition_id, select_fields=["extra_fields"]
        )
        reward_keys = tuple(self.config.algorithm.get("gdpo_reward_keys") or REWARD_NAMES)
        return reward_columns(batch.keys, batch.tags, _as_list(data["extra_fields"]), reward_keys)

    def _balcaprl_check_judge(self, columns: RolloutRewards, infos: Sequence[Any]) -> None:
        real = [i for i, info in enumerate(infos) if info is not None]
        rejected = next(
            (infos[i].get("failure_detail") for i in real if infos[i].get("failure") == JUDGE_REJECTED), None
        )
        if rejected is not None:  # the endpoint refused the key or the model: no later batch does better
            raise ConfigError(
                f"{rejected}; training stopped before this batch's update (fix the judge, then restart: verl "
                "resumes from the newest checkpoint)"
            )
        if real and bool(torch.isnan(columns.rewards[real]).all()):
            self._balcaprl_failed_in_a_row += 1
            limit = int(algorithm_setting(self.config.algorithm, "max_failed_batches_in_a_row", 3))
            if self._balcaprl_failed_in_a_row >= limit:
                reasons = sorted({str(infos[i].get("failure")) for i in real})
                raise RuntimeError(
                    f"the judge failed on every rollout of {self._balcaprl_failed_in_a_row} batches in a row "
                    f"(reasons: {', '.join(reasons)}). Check the judge endpoint, then restart: verl resumes "
                    "from the newest checkpoint (trainer.resume_mode=auto)."
                )
        else:
            self._balcaprl_failed_in_a_row = 0

    def _compute_advantage(self, batch: Any, metrics: dict) -> Any:
        columns, infos = self._balcaprl_columns(batch)
        metrics.update(batch_metrics(columns, infos))
        self._balcaprl_check_judge(columns, infos)
        with provide_rollout_rewards(columns):
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
