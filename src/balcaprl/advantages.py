"""Group-relative advantages: c-GDPO (the paper's method) and vanilla multi-reward GRPO (its ablation).

Reference implementations, vectorised in torch: no Python loop over groups. Every trainer backend
must reproduce these numbers exactly (tests compare). Equation numbers refer to the paper (Sec. 2.3).

Conventions of the pinned public contract (see docs/method.md):
- ``rewards`` is ``(N, K)``; ``group_index`` gives each rollout's prompt group (any integers; groups
  may differ in size and be interleaved).
- std is the unbiased sample std (``torch.std``'s default) and eps is added to it, not to the variance.
- NaN marks a failed judge: it is left out of statistics and contributes 0; never a fake reward.
- Arithmetic runs in float64 whatever the rewards' dtype (the result comes back in that dtype): TRL
  hands over float32 rewards, and dividing float32 rounding noise by a std of 0 + eps turned a reward
  that did not vary within a group into advantages of up to +-0.1 instead of 0.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def _as_inputs(
    rewards: torch.Tensor, group_index: torch.Tensor | Sequence[int], weights: torch.Tensor | Sequence[float]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Validated (rewards, group_index, weights), rewards and weights in float64."""
    rewards = torch.as_tensor(rewards)
    if not rewards.is_floating_point():
        raise TypeError(f"rewards must be a floating-point tensor, got dtype {rewards.dtype}")
    rewards = rewards.to(torch.float64)
    if rewards.ndim != 2:
        raise ValueError(f"rewards must have shape (N, K), got {tuple(rewards.shape)}")
    n, k = rewards.shape
    group_index = torch.as_tensor(group_index, device=rewards.device)
    if group_index.shape != (n,) or group_index.is_floating_point():
        raise ValueError(
            f"group_index must hold N={n} integers (one group id per rollout), got shape "
            f"{tuple(group_index.shape)} and dtype {group_index.dtype}"
        )
    weights = torch.as_tensor(weights, dtype=rewards.dtype, device=rewards.device)
    if weights.shape != (k,):
        raise ValueError(
            f"weights must have K={k} entries (one per reward column), got shape {tuple(weights.shape)}"
        )
    return rewards, group_index, weights


def group_normalize(values: torch.Tensor, group_index: torch.Tensor, eps: float) -> torch.Tensor:
    """Per group and column: (x - mean) / (std + eps), NaN entries left out and given 0.

    ``values`` is ``(N, C)``. A column of a group with fewer than two valid entries carries no
    relative signal (its std is undefined) and gives 0 to every rollout of that group; so does a
    column whose valid entries are all equal (deviations exactly 0, not rounding noise over eps).
    """
    _, group = torch.unique(group_index, return_inverse=True)
    n_groups = int(group.max()) + 1 if group.numel() else 0
    valid = ~torch.isnan(values)
    x = torch.where(valid, values, torch.zeros((), dtype=values.dtype, device=values.device))

    def per_group_sum(t: torch.Tensor) -> torch.Tensor:
        out = torch.zeros((n_groups, t.shape[1]), dtype=t.dtype, device=t.device)
        return out.index_add_(0, group, t)

    count = per_group_sum(valid.to(values.dtype))
    # Shift each group by one of its own values (its largest) before averaging: equal values then
    # give deviations of exactly 0, and the sums stay small (better rounding).
    largest = torch.full((n_groups, values.shape[1]), -torch.inf, dtype=values.dtype, device=values.device)
    largest = largest.scatter_reduce(
        0, group.unsqueeze(1).expand_as(x), values.masked_fill(~valid, -torch.inf), "amax"
    )
    shifted = torch.where(
        valid, x - largest[group], torch.zeros((), dtype=values.dtype, device=values.device)
    )
    mean_shift = per_group_sum(shifted) / count.clamp_min(1)
    deviation = torch.where(
        valid, shifted - mean_shift[group], torch.zeros((), dtype=values.dtype, device=values.device)
    )
    # Unbiased variance: sum of squared deviations / (n - 1); two passes for numerical stability.
    variance = per_group_sum(deviation.square()) / (count - 1).clamp_min(1)
    std = variance.sqrt()
    normalized = deviation / (std[group] + eps)
    informative = valid & (count[group] >= 2)
    return torch.where(informative, normalized, torch.zeros((), dtype=values.dtype, device=values.device))


def decoupled_group_advantages(
    rewards: torch.Tensor,
    group_index: torch.Tensor | Sequence[int],
    weights: torch.Tensor | Sequence[float],
    eps: float = 1e-6,
) -> torch.Tensor:
    """c-GDPO before its batch step: the weighted sum of per-group, per-reward normalised rewards."""
    return _weighted_group_sums(rewards, group_index, weights, eps).to(torch.as_tensor(rewards).dtype)


def _weighted_group_sums(
    rewards: torch.Tensor,
    group_index: torch.Tensor | Sequence[int],
    weights: torch.Tensor | Sequence[float],
    eps: float,
) -> torch.Tensor:
    rewards, group_index, weights = _as_inputs(rewards, group_index, weights)
    # Eq. 2.4: A_k^(j) = (R_k^(j) - mu_k) / sigma_k, per group and per reward (+ eps on the std).
    per_reward = group_normalize(rewards, group_index, eps)
    # Eq. 2.5: A_sum^(j) = sum_k w_k A_k^(j).
    return per_reward @ weights


def c_gdpo_advantages(
    rewards: torch.Tensor,
    group_index: torch.Tensor | Sequence[int],
    weights: torch.Tensor | Sequence[float],
    eps: float = 1e-6,
) -> torch.Tensor:
    """c-GDPO: normalise each reward within its group, weight and sum, then normalise over the batch.

    Returns the ``(N,)`` advantages in the rewards' dtype. A rollout whose rewards are all NaN is
    left out of the batch statistics and gets exactly 0.
    """
    dtype = torch.as_tensor(rewards).dtype
    summed = _weighted_group_sums(rewards, group_index, weights, eps)
    # Eq. 2.6: A^_sum = (A_sum - mu_batch) / (sigma_batch + eps), over rollouts (not tokens).
    judged = ~torch.isnan(torch.as_tensor(rewards)).all(dim=1)
    kept = summed[judged]
    if kept.numel() == 0:
        return torch.zeros_like(summed, dtype=dtype)
    mean = kept.mean()
    std = kept.std() if kept.numel() >= 2 else torch.zeros((), dtype=kept.dtype, device=kept.device)
    batch_normalized = (summed - mean) / (std + eps)
    return torch.where(judged, batch_normalized, torch.zeros_like(summed)).to(dtype)


def grpo_advantages(
    rewards: torch.Tensor,
    group_index: torch.Tensor | Sequence[int],
    weights: torch.Tensor | Sequence[float],
    eps: float = 1e-6,
) -> torch.Tensor:
    """Vanilla multi-reward GRPO (the paper's "w/o c-GDPO"): s = sum_k w_k r_k, then per group
    (s - mean) / (std + eps); no batch step (Appendix A, proof of Proposition 1).

    A rollout with any NaN reward has no aggregate: it is left out and gets 0.
    """
    dtype = torch.as_tensor(rewards).dtype
    rewards, group_index, weights = _as_inputs(rewards, group_index, weights)
    # Zero-weight NaN columns still poison the sum, on purpose: a partial verdict is no verdict.
    aggregate = (rewards * weights).sum(dim=1, keepdim=True)
    return group_normalize(aggregate, group_index, eps).squeeze(1).to(dtype)
