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
the prompt uid, ``config`` = the algorithm section) and read the three reward columns (NaN = failed
judge), the length penalty column and the row uids from one of two places:

1. ``non_tensor_batch`` when verl passes it (a verl with PR #7473), keys ``algorithm.gdpo_reward_keys``;
2. otherwise :func:`provide_rollout_rewards`, a context the balcaprl trainer
   (``trainer.v1.trainer_mode=balcaprl_sync``, see ``trainer.py``) opens around verl's advantage step
   after reading the columns that ``compute_score`` returned.

The uids of the columns must equal ``index`` row for row; anything else is an error, never a guess.
The result is one scalar per rollout, broadcast over its response tokens (verl's convention).
The weights are those of the recipe's reward config, ``algorithm.balcaprl.rewards`` (the rendering
makes it an interpolation of the reward function's ``reward_kwargs.rewards``, so both read one JSON
string); ``algorithm.balcaprl.eps`` (default 1e-6) is added to every std. The linear length penalty
p_len arrives per rollout in the ``length_penalty`` column, scored with the rewards (0 unless the
recipe chose ``length.mode: linear``); the advantage step is the TRL backend's own function,
``balcaprl.train.advantages.rollout_advantages`` (eqs. 2.4-2.6, then A~ = A - p_len for judged
rollouts, eq. A.5); a rollout whose judge failed gets exactly 0.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from balcaprl.rewards import REWARD_NAMES, RewardConfig
from balcaprl.train.advantages import ESTIMATORS as ESTIMATOR_NAMES
from balcaprl.train.advantages import group_index_from_ids, rollout_advantages

LENGTH_PENALTY_KEY = "length_penalty"
# verl estimator name -> the recipe's advantage.estimator
ESTIMATORS = {f"balcaprl_{name}": name for name in ESTIMATOR_NAMES}


@dataclass(frozen=True)
class RolloutRewards:
    """The reward columns of one training batch, row-aligned with verl's ``DataProto``.

    ``rewards`` is ``(N, K)`` float64 (NaN = failed judge, or a padding row verl added), ``uids`` the
    prompt uid of each row, ``length_penalty`` ``(N,)`` (0 unless the linear penalty is on).
    """

    uids: tuple[str, ...]
    rewards: torch.Tensor
    length_penalty: torch.Tensor
    keys: tuple[str, ...] = REWARD_NAMES

    def __post_init__(self) -> None:
        n = len(self.uids)
        if self.rewards.shape != (n, len(self.keys)):
            raise ValueError(
                f"rewards must have shape ({n}, {len(self.keys)}) for {n} uids, got {tuple(self.rewards.shape)}"
            )
        if self.length_penalty.shape != (n,):
            raise ValueError(f"length_penalty must have shape ({n},), got {tuple(self.length_penalty.shape)}")

    @classmethod
    def from_columns(
        cls, uids: Sequence[Any], columns: Mapping[str, Sequence[Any]], keys: Sequence[str] = REWARD_NAMES
    ) -> RolloutRewards:
        """From per-key sequences (``non_tensor_batch`` or ``compute_score`` dicts gathered by key).

        ``None`` counts as NaN. A missing length penalty column counts as 0.
        """
        missing = [k for k in keys if k not in columns]
        if missing:
            raise KeyError(
                f"reward columns {missing} are missing (have {sorted(columns)}); the reward function must be "
                "balcaprl.train.verl_backend.reward.compute_score, whose dict return carries them"
            )
        rewards = torch.tensor(
            [[_as_float(v) for v in columns[k]] for k in keys], dtype=torch.float64
        ).T.reshape(len(uids), len(keys))
        penalty = columns.get(LENGTH_PENALTY_KEY)
        length_penalty = (
            torch.zeros(len(uids), dtype=torch.float64)
            if penalty is None
            else torch.tensor([_as_float(v) for v in penalty], dtype=torch.float64)
        )
        return cls(tuple(str(u) for u in uids), rewards, length_penalty, tuple(keys))


def _as_float(value: Any) -> float:
    return float("nan") if value is None else float(value)


_CURRENT: contextvars.ContextVar[RolloutRewards | None] = contextvars.ContextVar(
    "balcaprl_rollout_rewards", default=None
)


@contextlib.contextmanager
def provide_rollout_rewards(rewards: RolloutRewards) -> Iterator[RolloutRewards]:
    """Make ``rewards`` visible to the balcaprl estimators called inside this block (same thread)."""
    token = _CURRENT.set(rewards)
    try:
        yield rewards
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


def _columns_for(index: Any, config: Any, non_tensor_batch: Mapping[str, Any] | None) -> RolloutRewards:
    keys = tuple(_get(config, "gdpo_reward_keys") or REWARD_NAMES)
    uids = [str(u) for u in (index if index is not None else [])]
    if non_tensor_batch is not None and all(k in non_tensor_batch for k in keys):
        columns = RolloutRewards.from_columns(uids, non_tensor_batch, keys)
    else:
        columns = _CURRENT.get()
        if columns is None:
            raise RuntimeError(
                "the balcaprl advantage estimator got no reward columns: verl 0.9.1 passes per-reward values "
                "only to its own 'gdpo' estimator. Run the balcaprl trainer (trainer.v1.trainer_mode="
                "balcaprl_sync, as `balcaprl verl launch` renders it) or call verl's compute_advantage "
                "inside balcaprl.train.verl_backend.estimator.provide_rollout_rewards(...)"
            )
        if columns.keys != keys:
            raise ValueError(f"reward columns {columns.keys} do not match algorithm.gdpo_reward_keys {keys}")
    if index is not None and list(columns.uids) != uids:
        raise ValueError(
            "the reward columns are not row-aligned with the batch (their uids differ from verl's `index`); "
            "refusing to guess which reward belongs to which rollout"
        )
    return columns


def verl_rollout_advantages(
    columns: RolloutRewards,
    weights: Sequence[float],
    estimator: str = "c_gdpo",
    eps: float = 1e-6,
    response_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """(N,) float64 advantages of verl's batch: :func:`balcaprl.train.advantages.rollout_advantages` on
    the columns. Rows with no response token (verl's padding rows) are left out like failed judges."""
    rewards = columns.rewards.clone()
    if response_mask is not None:
        empty = response_mask.reshape(len(columns.uids), -1).sum(dim=-1).cpu() == 0
        rewards[empty] = float("nan")
    return rollout_advantages(
        rewards,
        group_index_from_ids(columns.uids),
        weights,
        estimator=estimator,
        eps=eps,
        length_penalty=columns.length_penalty,
    )


def reward_config(config: Any) -> RewardConfig:
    """The recipe's reward config from the algorithm section (``algorithm.balcaprl.rewards``, JSON)."""
    text = algorithm_setting(config, "rewards", None)
    if text is None:
        raise ValueError(
            "algorithm.balcaprl.rewards (the recipe's reward config as JSON, as `balcaprl verl launch` "
            "renders it) is required by the balcaprl estimators: it holds the weights w_prec, w_rec, w_ling"
        )
    return RewardConfig.from_json(str(text), "algorithm.balcaprl.rewards")


def _estimate(
    estimator: str,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any = None,
    config: Any = None,
    non_tensor_batch: Mapping[str, Any] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    weights = reward_config(config).weights.as_list()
    columns = _columns_for(index, config, non_tensor_batch)
    if len(columns.uids) != token_level_rewards.shape[0]:
        raise ValueError(
            f"{len(columns.uids)} reward rows for a batch of {token_level_rewards.shape[0]} rollouts"
        )
    eps = float(algorithm_setting(config, "eps", 1e-6))
    scalars = verl_rollout_advantages(columns, weights, estimator, eps, response_mask)
    # One scalar per rollout, on every response token (verl's outcome-advantage convention).
    scalars = scalars.to(device=token_level_rewards.device, dtype=token_level_rewards.dtype)
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
    return _estimate("c_gdpo", token_level_rewards, response_mask, index, config, non_tensor_batch)


def balcaprl_grpo_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray | None = None,
    config: Any = None,
    non_tensor_batch: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Vanilla multi-reward GRPO (the 'w/o c-GDPO' ablation); returns (advantages, returns)."""
    return _estimate("grpo", token_level_rewards, response_mask, index, config, non_tensor_batch)


def register_estimators() -> None:
    """Register both estimators with verl's ``register_adv_est`` (idempotent)."""
    from verl.trainer.ppo.core_algos import register_adv_est

    register_adv_est("balcaprl_c_gdpo")(balcaprl_c_gdpo_advantage)
    register_adv_est("balcaprl_grpo")(balcaprl_grpo_advantage)
