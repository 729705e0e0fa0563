"""The advantage step of both backends: exactly ``balcaprl.c_gdpo_advantages`` (or ``grpo_advantages``),
then the linear length penalty (eq. A.5), in :class:`AdvantageStep`.

TRL's ``multi_objective_aggregation="normalize_then_sum"`` is GDPO, but it differs from the pinned
contract in ways that change numbers: it adds 1e-4 to the std (we add 1e-6), it assumes each group is
``num_generations`` consecutive rows (we group by the prompt's row id, so any layout of groups works),
and a reward that failed for one rollout but not another is handled row-wise rather than per reward
column. So both backends replace their library's advantages with :class:`AdvantageStep`'s, called by the
one batch step (``train/step.py``) on the batch's rollout records.

One generation batch, all processes gathered:
    rewards (N, 3)  ->  eqs. 2.4-2.6 (c-GDPO) or sum-then-normalise (GRPO)  ->  A (N,)
    length mode "linear":  A~ = A - p_len                                      (eq. A.5)
p_len = lambda_len * d(rho) is scored per rollout with its rewards (``balcaprl.rewards.score_rollout``),
0 in the other modes. A rollout whose judge failed (all rewards NaN) gets exactly 0 and no penalty.

The estimators are a registry with one signature, ``(rewards, group_index, weights, eps) -> A``, as
verl's ``register_adv_est``: a new estimator is one entry in :data:`ESTIMATOR_FUNCTIONS`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import torch

from balcaprl.advantages import c_gdpo_advantages, grpo_advantages

# The estimators a recipe can choose (``advantage.estimator``): the paper's, and its Table 3 ablation.
Estimator = Literal["c_gdpo", "grpo"]
ESTIMATORS: tuple[str, ...] = get_args(Estimator)
ESTIMATOR_FUNCTIONS: dict[str, Callable[..., torch.Tensor]] = {
    "c_gdpo": c_gdpo_advantages,  # eqs. 2.4-2.6: per-reward group normalisation, weighted sum, batch step
    "grpo": grpo_advantages,  # Table 3, 'w/o c-GDPO': weighted sum, then one group normalisation
}


def group_index_from_ids(row_ids: Sequence[str]) -> torch.Tensor:
    """Rollouts of the same prompt (same dataset row id) share a group id; order of first appearance."""
    first_seen: dict[str, int] = {}
    return torch.tensor([first_seen.setdefault(str(i), len(first_seen)) for i in row_ids], dtype=torch.long)


def subtract_length_penalty(
    advantages: torch.Tensor, rewards: torch.Tensor, length_penalty: torch.Tensor | Sequence[float]
) -> torch.Tensor:
    """Eq. A.5: A~ = A - p_len for judged rollouts; a failed rollout (all rewards NaN) keeps its 0."""
    penalty = torch.as_tensor(length_penalty, dtype=advantages.dtype, device=advantages.device)
    if penalty.shape != advantages.shape:
        raise ValueError(
            f"length_penalty must have shape {tuple(advantages.shape)}, got {tuple(penalty.shape)}"
        )
    judged = ~torch.isnan(torch.as_tensor(rewards)).all(dim=1).to(advantages.device)
    return torch.where(judged, advantages - torch.nan_to_num(penalty, nan=0.0), advantages)


@dataclass(frozen=True)
class AdvantageStep:
    """The recipe's advantage estimator, applied to one generation batch (the batch step's step 3).

    Args:
        weights: (w_prec, w_rec, w_ling), eq. 2.5.
        estimator: "c_gdpo" (the paper) or "grpo" (the 'w/o c-GDPO' ablation).
        eps: added to every std (1e-6 by contract).
    """

    weights: tuple[float, float, float]
    estimator: Estimator = "c_gdpo"
    eps: float = 1e-6

    def __post_init__(self) -> None:
        if self.estimator not in ESTIMATOR_FUNCTIONS:
            raise ValueError(f"estimator must be one of {', '.join(ESTIMATORS)}, got {self.estimator!r}")

    def __call__(
        self,
        rewards: torch.Tensor,
        group_index: torch.Tensor | Sequence[int],
        length_penalty: torch.Tensor | Sequence[float] | None = None,
    ) -> torch.Tensor:
        """(N,) advantages for the (N, 3) rewards (NaN = failed judge), then eq. A.5 with each rollout's
        p_len (None or zeros unless the recipe's length mode is "linear")."""
        advantages = ESTIMATOR_FUNCTIONS[self.estimator](rewards, group_index, self.weights, eps=self.eps)
        if length_penalty is None:
            return advantages
        return subtract_length_penalty(advantages, rewards, length_penalty)
