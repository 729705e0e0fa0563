"""verl advantage estimators that compute exactly ``balcaprl.c_gdpo_advantages`` (or the GRPO ablation).

verl's own ``gdpo`` estimator differs from the pinned contract (docs/method.md) in four ways that change
numbers: its last step whitens over *tokens* (``masked_whiten``: long captions weigh more), a NaN reward
poisons its whole group, a group of one rollout keeps its raw reward instead of 0, and it can only see
per-reward values because ``ray_trainer.compute_advantage`` special-cases the literal name ``"gdpo"``
(verl PR #7473 proposes to pass ``non_tensor_batch`` to every estimator; verl 0.9.1 does not).

So balcaprl registers its own estimators with verl's ``register_adv_est``:

    algorithm.adv_estimator=balcaprl_c_gdpo   eqs. 2.4-2.6, per rollout (the paper)
    algorithm.adv_estimator=balcaprl_grpo     Table 3 'w/o c-GDPO': sum the rewards, then normalise

Both receive what verl passes every estimator (``token_level_rewards``, ``response_mask``, ``index`` =
the prompt uid, ``config`` = the algorithm section) and take each rollout's advantage from
:func:`provide_advantages`, a context the balcaprl trainer (``trainer.v1.trainer_mode=balcaprl_sync``,
see ``trainer.py``) opens around verl's advantage step after running the batch step
(``balcaprl.train.step``, the TRL backend's too) on the whole rollout records ``compute_score``
returned. Reward columns that a verl with PR #7473 would pass in ``non_tensor_batch`` are not read:
advantages from partial records would bypass the batch step's stop rule and metrics.

The uids must equal ``index`` row for row; anything else is an error, never a guess. The result is
one scalar per rollout, broadcast over its response tokens (verl's convention). The settings
(:func:`batch_step_for`) are the recipe's: the reward config ``algorithm.balcaprl.rewards`` (the
rendering makes it an interpolation of the reward function's ``reward_kwargs.rewards``, so both read
one JSON string: weights, length mode), ``algorithm.balcaprl.eps`` (default 1e-6) and
``algorithm.balcaprl.max_failed_batches_in_a_row`` (default 3).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from balcaprl.rewards import RewardConfig, RolloutRecord
from balcaprl.train.advantages import ESTIMATORS as ESTIMATOR_NAMES
from balcaprl.train.advantages import AdvantageStep
from balcaprl.train.early_judge import judge_stage_metrics
from balcaprl.train.step import BatchStep

# verl estimator name -> the recipe's advantage.estimator
ESTIMATORS = {f"balcaprl_{name}": name for name in ESTIMATOR_NAMES}


@dataclass(frozen=True)
class ProvidedAdvantages:
    """The batch step's advantages of one training batch, row-aligned with verl's batch (0 for padding)."""

    uids: tuple[str, ...]
    advantages: torch.Tensor  # (N,) float64


_CURRENT: contextvars.ContextVar[ProvidedAdvantages | None] = contextvars.ContextVar(
    "balcaprl_advantages", default=None
)


@contextlib.contextmanager
def provide_advantages(uids: Sequence[Any], advantages: torch.Tensor) -> Iterator[ProvidedAdvantages]:
    """Make ``advantages`` visible to the balcaprl estimators called inside this block (same thread)."""
    provided = ProvidedAdvantages(tuple(str(u) for u in uids), advantages)
    if provided.advantages.shape != (len(provided.uids),):
        raise ValueError(f"advantages must have shape ({len(provided.uids)},), got {tuple(advantages.shape)}")
    token = _CURRENT.set(provided)
    try:
        yield provided
    finally:
        _CURRENT.reset(token)


def algorithm_setting(config: Any, name: str, default: Any) -> Any:
    """``config.balcaprl.<name>`` from a DictConfig, a dict or a dataclass; ``default`` when absent."""
    section = _get(config, "balcaprl")
    value = _get(section, name)
    return default if value is None else value


def _get(obj: Any, name: str) -> Any:
    if obj is None:
        return None
    if isinstance(obj, Mapping):
        return obj.get(name)
    getter = getattr(obj, "get", None)
    if callable(getter):
        try:
            return getter(name)
        except Exception:  # a dataclass config's .get may raise for unknown keys
            return getattr(obj, name, None)
    return getattr(obj, name, None)


def reward_config(config: Any) -> RewardConfig:
    """The recipe's reward config from the algorithm section (``algorithm.balcaprl.rewards``, JSON)."""
    text = algorithm_setting(config, "rewards", None)
    if text is None:
        raise ValueError(
            "algorithm.balcaprl.rewards (the recipe's reward config as JSON, as `balcaprl verl launch` "
            "renders it) is required by the balcaprl estimators: it holds the weights w_prec, w_rec, w_ling"
        )
    return RewardConfig.from_json(str(text), "algorithm.balcaprl.rewards")


def batch_step_for(config: Any, estimator: str) -> BatchStep:
    """The recipe's batch step from verl's algorithm section, for verl estimator name ``estimator``."""
    rewards = reward_config(config)
    advantage = AdvantageStep(
        tuple(rewards.weights.as_list()), ESTIMATORS[estimator], float(algorithm_setting(config, "eps", 1e-6))
    )
    failed = int(algorithm_setting(config, "max_failed_batches_in_a_row", 3))
    return BatchStep(advantage, length_mode=rewards.length.mode, max_failed_batches_in_a_row=failed)


def rollout_records(
    keys: Sequence[str], tags: Sequence[Mapping[str, Any]], extra_fields: Sequence[Any]
) -> tuple[list[str], list[RolloutRecord | None]]:
    """The prompt uid and the rollout record (None for a padding row) of every row of a V1 batch.

    ``keys`` are TransferQueue keys ``{uid}_{session}_{index}``; ``tags`` their tags (``is_padding``);
    ``extra_fields`` each row's ``extra_fields`` (``reward_extra_info`` holds what ``compute_score``
    returned: the record's row form).
    """
    if not len(keys) == len(tags) == len(extra_fields):
        raise ValueError(f"{len(keys)} keys, {len(tags)} tags and {len(extra_fields)} extra_fields differ")
    uids = [str(key).rsplit("_", 2)[0] for key in keys]
    records: list[RolloutRecord | None] = []
    for key, tag, extra in zip(keys, tags, extra_fields, strict=True):
        if tag.get("is_padding", False):
            records.append(None)
            continue
        row = extra.get("reward_extra_info") if isinstance(extra, Mapping) else None
        if not isinstance(row, Mapping) or "failure" not in row:
            raise KeyError(
                f"rollout {key!r} has no balcaprl rollout record in its extra_fields.reward_extra_info; set "
                "reward.custom_reward_function.path=pkg://balcaprl.train.verl_backend.reward and "
                ".name=compute_score"
            )
        records.append(RolloutRecord.from_row(dict(row)))
    return uids, records


def verl_batch_step(
    step: BatchStep, keys: Sequence[str], tags: Sequence[Mapping[str, Any]], extra_fields: Sequence[Any]
) -> tuple[list[str], torch.Tensor, dict[str, float]]:
    """A V1 batch (see :func:`rollout_records`) through the batch step, on its real rollouts: every row's
    uid, (N,) float64 advantages (0 for padding) and the metrics the balcaprl trainer adds to verl's
    (the step's, and the judge stage's from ``compute_score``'s time stamps)."""
    uids, rollouts = rollout_records(keys, tags, extra_fields)
    real = [i for i, rollout in enumerate(rollouts) if rollout is not None]
    result = step([rollouts[i] for i in real], [uids[i] for i in real])  # type: ignore[misc]
    advantages = torch.zeros(len(rollouts), dtype=torch.float64)
    advantages[real] = result.advantages
    stamps = judge_stage_metrics([extra_fields[i]["reward_extra_info"] for i in real])  # judge/wall_s, ...
    return uids, advantages, {**result.metrics, **stamps}


def _estimate(
    estimator: str,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any = None,
    config: Any = None,
    non_tensor_batch: Mapping[str, Any] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    uids = [str(u) for u in (index if index is not None else [])]
    provided = _CURRENT.get()
    if provided is None:
        raise RuntimeError(
            "the balcaprl advantage estimator got no advantages: verl 0.9.1 passes per-reward values only to "
            "its own 'gdpo' estimator. Run the balcaprl trainer (trainer.v1.trainer_mode=balcaprl_sync, as "
            "`balcaprl verl launch` renders it) or call verl's compute_advantage inside "
            "balcaprl.train.verl_backend.estimator.provide_advantages(...)"
        )
    if len(provided.uids) != token_level_rewards.shape[0]:
        raise ValueError(
            f"{len(provided.uids)} advantages for a batch of {token_level_rewards.shape[0]} rollouts"
        )
    if index is not None and list(provided.uids) != uids:
        raise ValueError(
            "the advantages are not row-aligned with the batch (their uids differ from verl's `index`); "
            "refusing to guess which advantage belongs to which rollout"
        )
    # One scalar per rollout, on every response token (verl's outcome-advantage convention).
    scalars = provided.advantages.to(device=token_level_rewards.device, dtype=token_level_rewards.dtype)
    advantages = scalars.unsqueeze(-1) * response_mask.to(token_level_rewards.dtype)
    return advantages, advantages


def balcaprl_c_gdpo_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray | None = None,
    config: Any = None,
    non_tensor_batch: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """c-GDPO (eqs. 2.4-2.6) per rollout; returns (advantages, returns), both (bs, response_length)."""
    return _estimate("balcaprl_c_gdpo", token_level_rewards, response_mask, index, config, non_tensor_batch)


def balcaprl_grpo_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray | None = None,
    config: Any = None,
    non_tensor_batch: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Vanilla multi-reward GRPO (the 'w/o c-GDPO' ablation); returns (advantages, returns)."""
    return _estimate("balcaprl_grpo", token_level_rewards, response_mask, index, config, non_tensor_batch)


def register_estimators() -> None:
    """Register both estimators with verl's ``register_adv_est`` (idempotent)."""
    from verl.trainer.ppo.core_algos import register_adv_est

    register_adv_est("balcaprl_c_gdpo")(balcaprl_c_gdpo_advantage)
    register_adv_est("balcaprl_grpo")(balcaprl_grpo_advantage)
