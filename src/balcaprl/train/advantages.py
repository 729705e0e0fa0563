"""The trainer's advantage step: exactly ``balcaprl.c_gdpo_advantages`` (or ``grpo_advantages``).

TRL's ``multi_objective_aggregation="normalize_then_sum"`` is GDPO, but it differs from the pinned
contract (DESIGN.md) in ways that change numbers: it adds 1e-4 to the std (we add 1e-6), it assumes
each group is ``num_generations`` consecutive rows (we group by the prompt's row id, so any layout of
groups works), and a reward that failed for one rollout but not another is handled row-wise rather
than per reward column. So the trainer lets TRL compute its rewards tensor, then replaces TRL's
advantages with the ones below, computed on the same gathered tensor. Nothing else in TRL changes.

One generation batch, all processes gathered:
    rewards (N, 3)  ->  eqs. 2.4-2.6 (c-GDPO) or sum-then-normalise (GRPO)  ->  A (N,)
    mode "linear":      A~ = A - lambda_len * d(rho)                          (eq. A.5)
A rollout whose judge failed (all rewards NaN) gets exactly 0 and no length penalty.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from balcaprl.advantages import c_gdpo_advantages, grpo_advantages
from balcaprl.rewards import linear_length_penalty

__all__ = ["AdvantageStep", "group_index_from_ids"]


def group_index_from_ids(row_ids: Sequence[str]) -> torch.Tensor:
    """Rollouts of the same prompt (same dataset row id) share a group id; order of first appearance."""
    first_seen: dict[str, int] = {}
    return torch.tensor([first_seen.setdefault(str(i), len(first_seen)) for i in row_ids], dtype=torch.long)


@dataclass(frozen=True)
class AdvantageStep:
    """The recipe's advantage estimator, applied to one generation batch.

    Args:
        weights: (w_prec, w_rec, w_ling), eq. 2.5.
        estimator: "c_gdpo" (the paper) or "grpo" (the 'w/o c-GDPO' ablation).
        eps: added to every std (1e-6 by contract).
        length_mode: "linear" subtracts the linear length penalty (eq. A.5); "mask" and "none" do not
            touch advantages (the mask acts on the linguistic reward, before this step).
        tau_low, tau_high, linear_strength: eqs. A.3-A.4.
    """

    weights: tuple[float, float, float]
    estimator: str = "c_gdpo"
    eps: float = 1e-6
    length_mode: str = "mask"
    tau_low: float = 0.5
    tau_high: float = 2.0
    linear_strength: float = 1.0

    def __post_init__(self) -> None:
        if self.estimator not in ("c_gdpo", "grpo"):
            raise ValueError(f"estimator must be 'c_gdpo' or 'grpo', got {self.estimator!r}")
        if self.length_mode not in ("mask", "linear", "none"):
            raise ValueError(f"length_mode must be mask, linear or none, got {self.length_mode!r}")

    def __call__(
        self,
        rewards: torch.Tensor,
        group_index: torch.Tensor | Sequence[int],
        caption_tokens: torch.Tensor | Sequence[float] | None = None,
        reference_tokens: torch.Tensor | Sequence[float] | None = None,
    ) -> torch.Tensor:
        """(N,) advantages for the (N, 3) rewards (NaN = failed judge) of one generation batch."""
        if self.estimator == "c_gdpo":
            # Eqs. 2.4-2.6: per-reward group normalisation, weighted sum, batch normalisation.
            advantages = c_gdpo_advantages(rewards, group_index, self.weights, eps=self.eps)
        else:
            # Table 3, 'w/o c-GDPO': weighted sum, then one group normalisation.
            advantages = grpo_advantages(rewards, group_index, self.weights, eps=self.eps)
        if self.length_mode == "linear":
            if caption_tokens is None or reference_tokens is None:
                raise ValueError("the linear length penalty needs caption_tokens and reference_tokens")
            pred = torch.as_tensor(caption_tokens, dtype=advantages.dtype, device=advantages.device)
            ref = torch.as_tensor(reference_tokens, dtype=advantages.dtype, device=advantages.device)
            # Eq. A.5: A~ = A - lambda_len * d(rho); failed rollouts keep their 0.
            penalty = linear_length_penalty(pred, ref, self.tau_low, self.tau_high, self.linear_strength)
            judged = ~torch.isnan(torch.as_tensor(rewards)).all(dim=1).to(advantages.device)
            advantages = torch.where(judged, advantages - penalty, advantages)
        return advantages

    def length_penalty(
        self, caption_tokens: torch.Tensor | Sequence[float], reference_tokens: torch.Tensor | Sequence[float]
    ) -> torch.Tensor:
        """p_len per rollout (zeros unless length_mode is "linear"), for logging."""
        pred = torch.as_tensor(caption_tokens, dtype=torch.float32)
        ref = torch.as_tensor(reference_tokens, dtype=torch.float32)
        if self.length_mode != "linear":
            return torch.zeros_like(pred)
        return linear_length_penalty(pred, ref, self.tau_low, self.tau_high, self.linear_strength)
