"""The policy loss: the paper's objective (Sec. 2.3 and Appendix "Implementation Details") on TRL.

The paper optimises, per generation batch of B sequences with advantages A_i and token ratios
s_it = pi_theta / pi_old,

    L = (1/B) sum_i sum_t  -max( min(s_it A_i, clip(s_it, 1-eps, 1+eps_h) A_i),  c A_i  [A_i < 0 only] )

that is PPO-clip with dual-clip (Ye et al. 2020), no KL term, and "token-sum-sequence-mean" aggregation
(sum over a sequence's tokens, then mean over sequences; verl's ``seq-mean-token-sum``). The paper names
dual-clip and the aggregation (Appendix A.1) but gives neither eps nor c; the recipe's eps = 0.2 and
c = 3 are verl's defaults (``actor.clip_ratio``, ``actor.clip_ratio_c``), the framework the paper used.

The clip and the dual-clip bind only when the ratio moves away from 1, that is from the second
optimizer update of a generation batch on (``train.updates_per_batch`` > 1). Both backends log how
often they do under the same names (``policy/ratio_mean``, ``policy/ratio_max``, ``policy/clipped_share``,
``policy/dual_clipped_share``): the clipped share is each library's own metric under the shared name,
:func:`ratio_statistics` adds what the libraries lack.

Why TRL's ``loss_type="luspo"`` with ``importance_sampling_level="token"`` and ``delta=c`` is exactly
this (TRL 1.16, ``GRPOTrainer._compute_loss``):

* Aggregation. For ``luspo`` TRL computes ``(per_token_loss * mask).sum(-1).mean()`` on each
  micro-batch of b sequences and divides by the number of gradient-accumulation micro-batches m.
  Every micro-batch holds the same b = per_device_train_batch_size sequences, so the accumulated
  gradient is (1/m) sum_j (1/b) sum_{i in j} sum_t = (1/(m b)) sum_i sum_t, and data-parallel
  averaging over P processes makes it 1/(P m b) = 1/B: the token-sum-sequence-mean over the batch.
  (TRL's ``dr_grpo`` is the same divided by max_completion_length, a constant; ``dapo`` and ``bnpo``
  divide by token counts, which is a different objective.) ``luspo`` was introduced with
  sequence-level ratios; TRL only warns when it is used with token-level ones, and the arithmetic
  above does not depend on that level. With token-level ratios, ``luspo`` *is* the paper's loss.
* Dual-clip. TRL's two-sided clipping (``delta``) clamps the ratio from above before the PPO min:
  -min(min(s, delta) A, clip(s) A). For A >= 0, clip(s) <= 1+eps_h < delta, so this equals
  -min(s A, clip(s) A): plain PPO, as dual-clip leaves positive advantages alone. For A < 0,
  min(x A, y A) = A max(x, y), so TRL gives -A max(min(s, delta), clip(s)) and dual-clip gives
  -A min(max(s, clip(s)), c); both equal -A s between 1+eps_h and c, -A c above c and
  -A clip(s) below 1+eps_h (s <= 1 - eps gives clip(s) = 1 - eps >= s). Equal whenever
  delta = c > 1 + eps_h (the recipe enforces it), so values and gradients agree.
* No KL. ``beta=0``: TRL loads no reference model and adds no KL term.

``tests/train/test_train_loss.py`` checks TRL's ``_compute_loss`` against :func:`reference_policy_loss`
numerically, values and gradients, with several micro-batches and negative and positive advantages.
"""

from __future__ import annotations

import torch

# Recipe name -> TRL 1.16 loss_type.
LOSS_TYPES = {
    "token_sum_sequence_mean": "luspo",  # the paper; see the module docstring
    "token_mean": "dapo",
    "sequence_mean_token_mean": "grpo",
}


def trl_loss_settings(
    loss_aggregation: str,
    clip_epsilon: float,
    clip_epsilon_high: float | None,
    dual_clip_c: float | None,
    kl_beta: float,
) -> dict:
    """GRPOConfig keyword arguments for the recipe's loss."""
    if loss_aggregation not in LOSS_TYPES:
        raise ValueError(
            f"unknown loss_aggregation {loss_aggregation!r}; expected one of {sorted(LOSS_TYPES)}"
        )
    return {
        "loss_type": LOSS_TYPES[loss_aggregation],
        "importance_sampling_level": "token",
        "epsilon": clip_epsilon,
        "epsilon_high": clip_epsilon_high,
        "delta": dual_clip_c,
        "beta": kl_beta,
    }


def reference_policy_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_epsilon: float = 0.2,
    clip_epsilon_high: float | None = None,
    dual_clip_c: float | None = 3.0,
) -> torch.Tensor:
    """The paper's loss written out directly (for tests): dual-clip PPO, token-sum-sequence-mean.

    ``logps``, ``old_logps``, ``mask``: (B, T); ``advantages``: (B,). Returns a scalar.
    """
    high = clip_epsilon if clip_epsilon_high is None else clip_epsilon_high
    ratio = torch.exp(logps - old_logps)
    adv = advantages.unsqueeze(1)
    surrogate = torch.minimum(ratio * adv, torch.clamp(ratio, 1 - clip_epsilon, 1 + high) * adv)
    if dual_clip_c is not None:
        # Dual-clip: for negative advantages the objective is bounded below by c * A.
        surrogate = torch.where(adv < 0, torch.maximum(surrogate, dual_clip_c * adv), surrogate)
    per_token_loss = -surrogate * mask
    return per_token_loss.sum(dim=1).mean()


# The per-step metrics of the importance ratio and of the clips, in both backends.
POLICY_METRICS = (
    "policy/ratio_mean",
    "policy/ratio_max",
    "policy/clipped_share",
    "policy/dual_clipped_share",
)


def ratio_statistics(
    logps: torch.Tensor,
    old_logps: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    dual_clip_c: float | None,
) -> torch.Tensor:
    """Sums over the masked tokens of one micro-batch: ``[tokens, sum of ratios, max ratio, dual-clipped]``
    (float64; max is -inf without tokens). ``old_logps`` None means on-policy (ratio 1).

    What neither library logs: the ratio itself, and on TRL the *dual-clipped* tokens, A < 0 and
    ratio > c, where dual-clip caps the loss at -c A (verl's ``pg_clipfrac_lower``). The PPO clip's
    share is each library's own (TRL's ``clip_ratio/region_mean``, verl's ``pg_clipfrac``).
    ``advantages``: (B,) or (B, T).
    """
    logps = logps.detach()
    ratio = torch.ones_like(logps) if old_logps is None else torch.exp(logps - old_logps.detach())
    adv = advantages.detach()
    adv = adv.unsqueeze(1) if adv.dim() == 1 else adv
    keep = mask.bool()
    dual = (ratio > dual_clip_c) & (adv < 0) if dual_clip_c is not None else torch.zeros_like(keep)
    kept = ratio[keep].double()
    largest = (
        kept.max() if kept.numel() else torch.tensor(float("-inf"), dtype=torch.float64, device=kept.device)
    )
    return torch.stack([keep.sum().double(), kept.sum(), largest, (dual & keep).sum().double()])


class RatioStatistics:
    """Accumulates :func:`ratio_statistics` over the micro-batches of one optimizer step (already summed,
    or maxed, over processes) and turns them into the ratio's metrics."""

    def __init__(self) -> None:
        self.totals: torch.Tensor | None = None

    def add(self, sums: torch.Tensor) -> None:
        sums = sums.detach().double().cpu()
        if self.totals is None:
            self.totals = sums.clone()
        else:
            self.totals[[0, 1, 3]] += sums[[0, 1, 3]]
            self.totals[2] = torch.maximum(self.totals[2], sums[2])

    def pop(self) -> dict[str, float]:
        """The metrics since the last call (empty when no token was seen), and a fresh start."""
        totals, self.totals = self.totals, None
        if totals is None or totals[0] <= 0:
            return {}
        tokens = float(totals[0])
        return {
            "policy/ratio_mean": float(totals[1]) / tokens,
            "policy/ratio_max": float(totals[2]),
            "policy/dual_clipped_share": float(totals[3]) / tokens,
        }
