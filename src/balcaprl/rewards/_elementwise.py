"""Tiny helpers so the reward formulas accept Python numbers, NumPy arrays and torch tensors alike."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def is_tensor_like(*values: Any) -> bool:
    return any(isinstance(v, torch.Tensor | np.ndarray) for v in values)


def where(cond: Any, a: Any, b: Any) -> Any:
    """``a`` where ``cond`` else ``b``, in the library of the inputs."""
    if any(isinstance(v, torch.Tensor) for v in (cond, a, b)):
        ref = next(v for v in (a, b, cond) if isinstance(v, torch.Tensor))
        dtype = ref.dtype if ref.is_floating_point() else torch.get_default_dtype()
        as_t = lambda v: torch.as_tensor(v, dtype=dtype, device=ref.device)  # noqa: E731
        return torch.where(torch.as_tensor(cond, device=ref.device), as_t(a), as_t(b))
    if any(isinstance(v, np.ndarray) for v in (cond, a, b)):
        return np.where(cond, a, b).astype(float)
    return float(a) if cond else float(b)


def any_true(cond: Any) -> bool:
    if isinstance(cond, torch.Tensor):
        return bool(cond.any())
    return bool(np.any(cond))


def clamp_min0(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.clamp_min(0)
    if isinstance(x, np.ndarray):
        return np.maximum(x, 0.0)
    return max(float(x), 0.0)
