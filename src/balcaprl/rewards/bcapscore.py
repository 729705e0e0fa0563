"""b-CapScore: the harmonic mean of precision, recall and linguistic quality (Appendix A, eq. A.1)."""

from __future__ import annotations


def is_tensor(value) -> bool:
    """A torch tensor (checked by its type's module: torch is imported only when one is given)."""
    return type(value).__module__.split(".")[0] == "torch"


def float_tensors(*values):
    """``values`` as broadcast torch tensors of one floating dtype: the widest floating dtype among
    the tensors given (float32 stays float32), else torch's default."""
    import torch

    tensors = [torch.as_tensor(v) for v in values]
    dtype = torch.get_default_dtype()
    floating = [t.dtype for t in tensors if is_tensor(t) and t.is_floating_point()]
    if floating:
        dtype = floating[0]
        for other in floating[1:]:
            dtype = torch.promote_types(dtype, other)
    return torch.broadcast_tensors(*(t.to(dtype) for t in tensors))


def b_capscore(precision, recall, linguistic):
    """3 / (1/p + 1/r + 1/l), in [0, 1]; 0 when any component is 0 (the harmonic mean's limit).

    Subnormal inputs overflow 1/x to inf and give 0, as they should. Dataset-level b-CapScore (as the
    paper reports it) is 100 x the mean of the per-caption values. Tensors (torch) are taken element
    by element, with the same value at each element as the scalar form gives.
    """
    if any(is_tensor(x) for x in (precision, recall, linguistic)):
        import torch

        p, r, ling = float_tensors(precision, recall, linguistic)
        zero = (p == 0) | (r == 0) | (ling == 0)
        return torch.where(zero, torch.zeros_like(p), 3 / (1 / p + 1 / r + 1 / ling))  # eq. A.1
    if precision == 0 or recall == 0 or linguistic == 0:
        return 0.0
    return 3 / (1 / precision + 1 / recall + 1 / linguistic)
