"""Length control: the paper's length-conditional reward mask (Sec. 2.3) and the linear length
penalty it is compared against (Appendix A, eqs. A.2-A.5).

Both take one rollout's token lengths, counted with the *policy's* tokenizer.
"""

from __future__ import annotations

from balcaprl.rewards.bcapscore import float_tensors, is_tensor

# The paper's length band [tau_l, tau_u] (Sec. 2.3): the defaults of every config that holds one.
TAU_LOW = 0.5
TAU_HIGH = 2.0


def length_ratio(pred_len: float, ref_len: float) -> float:
    """rho = l_pred / l_ref (eq. A.2); a non-positive reference length is an error, not an inf."""
    if ref_len <= 0:
        raise ValueError(
            "ref_len must be > 0: a reference caption with no tokens gives no length ratio "
            "(check the dataset's `reference_tokens` column)"
        )
    return pred_len / ref_len


def _check_band(tau_low: float, tau_high: float) -> None:
    if not tau_low <= tau_high:
        raise ValueError(f"tau_low ({tau_low}) must not exceed tau_high ({tau_high})")


def mask_linguistic_by_length(
    linguistic, pred_len, ref_len, tau_low: float = TAU_LOW, tau_high: float = TAU_HIGH
):
    """R~_ling = R_ling if tau_l <= rho <= tau_u else 0 (Sec. 2.3, bounds inclusive).

    A NaN linguistic reward (a failed judge) stays NaN in range and is also masked to 0 outside it,
    which is exactly what the paper's gate does: out of range the judge's opinion is not used.
    Tensors (torch) are taken element by element, each element as the scalar form gives it.
    """
    _check_band(tau_low, tau_high)
    if any(is_tensor(x) for x in (linguistic, pred_len, ref_len)):
        import torch

        ling, pred, ref = float_tensors(linguistic, pred_len, ref_len)
        if bool((ref <= 0).any()):
            length_ratio(0.0, 0.0)  # the scalar form's error for a reference without tokens
        rho = pred / ref  # eq. A.2
        return torch.where((tau_low <= rho) & (rho <= tau_high), ling, torch.zeros_like(ling))
    rho = length_ratio(pred_len, ref_len)
    return float(linguistic) if tau_low <= rho <= tau_high else 0.0


def linear_length_penalty(
    pred_len: float, ref_len: float, tau_low: float, tau_high: float, strength: float
) -> float:
    """p_len = lambda_len * d(rho), d(rho) = max(rho - tau_u, 0) + max(tau_l - rho, 0) (eqs. A.3-A.4).

    The caller subtracts it from the normalised advantage: A~ = A - p_len (eq. A.5).
    """
    _check_band(tau_low, tau_high)
    if strength < 0:
        raise ValueError(f"strength must be >= 0, got {strength}")
    rho = length_ratio(pred_len, ref_len)
    return strength * (max(rho - tau_high, 0.0) + max(tau_low - rho, 0.0))
