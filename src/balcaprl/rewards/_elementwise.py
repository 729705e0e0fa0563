"""Tiny helpers so the reward formulas accept Python numbers, NumPy arrays and torch tensors alike.

torch is never imported here: a value can only be a tensor if its caller already imported torch, so
``sys.modules`` answers "is torch loaded?" for free and scoring a verdict stays light (the judge,
``balcaprl score`` and the command line's start-up do not pay torch's import).
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np


def _tensor_type() -> type | None:
    torch = sys.modules.get("torch")
    return None if torch is None else torch.Tensor


def _is_tensor(value: Any) -> bool:
    tensor = _tensor_type()
    return tensor is not None and isinstance(value, tensor)


def is_tensor_like(*values: Any) -> bool:
    return any(_is_tensor(v) or isinstance(v, np.ndarray) for v in values)


def where(cond: Any, a: Any, b: Any) -> Any:
    """``a`` where ``cond`` else ``b``, in the library of the inputs."""
    if any(_is_tensor(v) for v in (cond, a, b)):
        import torch

        ref = next(v for v in (a, b, cond) if isinstance(v, torch.Tensor))
        dtype = ref.dtype if ref.is_floating_point() else torch.get_default_dtype()
        as_t = lambda v: torch.as_tensor(v, dtype=dtype, device=ref.device)  # noqa: E731
        return torch.where(torch.as_tensor(cond, device=ref.device), as_t(a), as_t(b))
    if any(isinstance(v, np.ndarray) for v in (cond, a, b)):
        return np.where(cond, a, b).astype(float)
    return float(a) if cond else float(b)


def any_true(cond: Any) -> bool:
    if _is_tensor(cond):
        return bool(cond.any())
    return bool(np.any(cond))


def clamp_min0(x: Any) -> Any:
    if _is_tensor(x):
        return x.clamp_min(0)
    if isinstance(x, np.ndarray):
        return np.maximum(x, 0.0)
    return max(float(x), 0.0)
