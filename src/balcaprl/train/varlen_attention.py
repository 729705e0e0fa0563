"""The language model's attention on packed rows without a dense mask (``train.padding_free``).

A packed row holds several samples one after another; their text positions restart at 0 for each
(``train/packing.py``). Under sdpa, transformers turns those positions into a block-diagonal
``tokens x tokens`` mask that every layer converts and keeps for the backward pass (2 bytes per token
per token of the row: ~1.1 GiB per layer for a 16 x 2,368-token micro-batch), and the masked kernel does
not skip the blocks above the diagonal. :data:`VARLEN` is an attention implementation that instead reads
the samples' boundaries from the positions (cumulative lengths) and runs a variable-length kernel:

* CUDA: flash-attn's ``flash_attn_varlen_func`` when it is installed, else PyTorch's own
  ``torch.nn.attention.varlen.varlen_attn`` (flash kernels shipped in the torch wheel; nothing to build);
* CPU (and CUDA without either): one causal SDPA call per sample, the reference the kernels must equal.

Calls that are not packed rows (a 2-D padding mask: generation, the padded log-prob pass; one sequence)
go to transformers' sdpa unchanged, with the mask sdpa builds: :data:`VARLEN` is registered with sdpa's
mask function for padded inputs and with none for packed ones. Only the language model's config gets
it (:func:`use_varlen_text_attention`); the vision tower keeps its own (``train/vision_attention.py``).
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

import torch
import torch.nn.functional as F

logger = logging.getLogger(__name__)

VARLEN = "balcaprl_varlen"


def cumulative_lengths(position_ids: torch.Tensor) -> torch.Tensor:
    """``[0, end of sample 1, end of sample 2, ..., tokens]`` (int32) from one packed row's positions."""
    positions = position_ids.reshape(-1)
    starts = torch.nonzero(positions == 0).flatten()
    if starts.numel() == 0 or int(starts[0]) != 0:
        starts = torch.cat([starts.new_zeros(1), starts])
    end = torch.tensor([positions.numel()], device=positions.device)
    return torch.cat([starts, end]).to(torch.int32)


def _kernel() -> tuple[str, Any]:
    """The variable-length kernel CUDA has here: ("flash_attn", fn), ("torch", fn) or ("loop", None)."""
    try:
        from flash_attn import flash_attn_varlen_func

        return "flash_attn", flash_attn_varlen_func
    except ImportError:
        pass
    try:
        from torch.nn.attention.varlen import varlen_attn

        return "torch", varlen_attn
    except ImportError:
        return "loop", None


def varlen_route(device: torch.device) -> str:
    """Which kernel packed rows take on ``device``: flash_attn, torch or loop (the per-sample SDPA)."""
    return _kernel()[0] if device.type == "cuda" else "loop"


def packed_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu: torch.Tensor,
    scaling: float | None,
    causal: bool = True,
) -> torch.Tensor:
    """Attention within each ``cu`` segment (causal, or full for the vision tower's windows).
    ``query [1, heads, tokens, d]``, ``key``/``value`` ``[1, kv_heads, tokens, d]``; returns
    ``[1, tokens, heads, d]`` (what transformers' sdpa returns)."""
    route = varlen_route(query.device)
    longest = int((cu[1:] - cu[:-1]).max())
    if route == "loop":
        bounds = cu.tolist()
        outs = [
            F.scaled_dot_product_attention(
                query[:, :, s:e], key[:, :, s:e], value[:, :, s:e], is_causal=causal, scale=scaling,
                enable_gqa=key.shape[1] != query.shape[1],
            )
            for s, e in zip(bounds[:-1], bounds[1:], strict=False)
        ]  # fmt: skip
        return torch.cat(outs, dim=2).transpose(1, 2)
    q, k, v = (x[0].transpose(0, 1) for x in (query, key, value))  # [tokens, heads, d]
    name, kernel = _kernel()
    if name == "flash_attn":
        out = kernel(q, k, v, cu, cu, longest, longest, softmax_scale=scaling, causal=causal)
    else:
        params = inspect.signature(kernel).parameters
        kwargs: dict[str, Any] = {}
        if "scale" in params:
            kwargs["scale"] = scaling
        elif scaling is not None:  # an older torch without ``scale``: its default is 1/sqrt(d)
            q = q * (scaling * q.shape[-1] ** 0.5)
        if "window_size" in params:
            kwargs["window_size"] = (-1, 0) if causal else (-1, -1)
        else:
            kwargs["is_causal"] = causal
        if k.shape[1] != q.shape[1]:
            if "enable_gqa" in params:
                kwargs["enable_gqa"] = True
            else:  # an older torch: expand k and v to every head (more memory, same result)
                k, v = (x.repeat_interleave(q.shape[1] // x.shape[1], dim=1) for x in (k, v))
        out = kernel(q, k, v, cu, cu, longest, longest, **kwargs)
    return out.unsqueeze(0)


def varlen_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    position_ids: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: packed rows (one row, positions restarting at 0, no
    mask) through :func:`packed_attention`; anything else through transformers' sdpa."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if attention_mask is None and position_ids is not None and query.shape[0] == 1 and query.shape[2] > 1:
        cu = cumulative_lengths(position_ids)
        if cu.numel() > 2:
            return packed_attention(query, key, value, cu, scaling), None
    return sdpa_attention_forward(
        module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
    )


def varlen_mask(*args: Any, attention_mask: torch.Tensor | None = None, **kwargs: Any) -> Any:
    """sdpa's mask for padded inputs; none when there is no 2-D mask (causal, or packed rows whose
    boundaries :func:`varlen_attention` reads from the positions)."""
    from transformers.masking_utils import sdpa_mask

    if attention_mask is None:
        return None
    return sdpa_mask(*args, attention_mask=attention_mask, **kwargs)


def register() -> None:
    """Add :data:`VARLEN` to transformers' attention and mask interfaces (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(VARLEN, varlen_attention)
    AttentionMaskInterface.register(VARLEN, varlen_mask)


def use_varlen_text_attention(model: torch.nn.Module) -> bool:
    """Switch the language model of ``model`` (its text config) from sdpa to :data:`VARLEN`; False and
    nothing changed when it does not use sdpa (flash-attention already takes packed rows; eager stays)."""
    config = getattr(model, "config", None)
    text = getattr(config, "text_config", None) or config
    if text is None or getattr(text, "_attn_implementation", None) not in ("sdpa", VARLEN):
        return False
    register()
    text._attn_implementation = VARLEN
    return True
