"""Qwen2/2.5-VL vision attention in one SDPA call per layer instead of one per window.

transformers 5.17's vision attention (``Qwen2_5_VLVisionAttention.forward``) hands the packed patch
sequence and its ``cu_seqlens`` (window or image boundaries) only to implementations whose name contains
"flash" (``utils.generic.is_flash_attention_requested``); any other implementation, sdpa included,
gets one call per window: about 88 windows per 1280x960 image in 28 of the 32 layers, thousands of tiny
launch-bound kernels per batch. flash-attn needs a source build, and transformers' ``kernels-community``
routes download kernels at run time.

:data:`VARLEN_SDPA` is an attention function registered in transformers' ``AttentionInterface`` under a
name with "flash" in it, so the vision attention passes it ``cu_seqlens``. On CUDA it runs the windows
through the language model's variable-length kernel (``train/varlen_attention.py``: flash-attn or
torch's ``varlen_attn``; no padding, no mask, the flash kernel). On CPU it runs PyTorch's own SDPA once
over all segments, padded to the longest and batched, with a key mask for the padding. Either way each
query attends to exactly the keys of its own window (or image), as the per-window loop does. Nothing to
install. Only the vision tower's config gets it (the language model keeps its own implementation):
:func:`use_varlen_vision_attention`, set by ``model.vision_attention: varlen_sdpa`` (the GPU recipes);
models without such a vision tower (LLaVA) keep ``model.attn_implementation``, the fall-back.

Cost on CPU: the padded batch holds ``segments x longest`` tokens. Windows are at most 64 patches (112 px
windows, 14 px patches) and most are full, so little is padding; the few full-attention layers pad
every image to the largest of the batch.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.nn.functional as F

from balcaprl.train.varlen_attention import packed_attention, varlen_route

logger = logging.getLogger(__name__)

VARLEN_SDPA = "flash_route_varlen_sdpa"  # "flash" selects the cu_seqlens path; the work is torch SDPA
VISION_ATTENTION_CLASSES = ("Qwen2_5_VLVisionAttention", "VisionAttention")  # Qwen2.5-VL, Qwen2-VL


def varlen_sdpa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    scaling: float | None = None,
    dropout: float = 0.0,
    cu_seq_lens_q: torch.Tensor | None = None,
    max_length_q: int | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention within each ``cu_seq_lens_q`` segment of a packed sequence, in one SDPA call.

    ``query``/``key``/``value``: ``[1, heads, tokens, head_dim]`` (the vision attention's layout). Returns
    ``[1, tokens, heads, head_dim]``, what transformers' sdpa function returns.
    """
    if cu_seq_lens_q is None:  # not a packed call: plain attention over the whole sequence
        out = F.scaled_dot_product_attention(query, key, value, scale=scaling, dropout_p=dropout)
        return out.transpose(1, 2).contiguous(), None
    if varlen_route(query.device) != "loop":  # CUDA: the windows through a variable-length kernel
        return packed_attention(query, key, value, cu_seq_lens_q.to(torch.int32), scaling, causal=False), None
    lengths = cu_seq_lens_q[1:] - cu_seq_lens_q[:-1]
    segments = lengths.shape[0]
    longest = int(max_length_q) if max_length_q is not None else int(lengths.max())
    tokens = query.shape[2]
    # Each token's segment and place in it: the padded batch is [segments, heads, longest, head_dim].
    segment = torch.repeat_interleave(
        torch.arange(segments, device=query.device), lengths, output_size=tokens
    )
    place = torch.arange(tokens, device=query.device) - cu_seq_lens_q[segment]

    def padded(x: torch.Tensor) -> torch.Tensor:
        out = x.new_zeros(segments, longest, x.shape[1], x.shape[3])
        out[segment, place] = x[0].transpose(0, 1)  # [tokens, heads, head_dim]
        return out.transpose(1, 2)

    keys_present = (
        torch.arange(longest, device=query.device)[None, :] < lengths[:, None]
    )  # [segments, longest]
    out = F.scaled_dot_product_attention(
        padded(query),
        padded(key),
        padded(value),
        attn_mask=keys_present[:, None, None, :],
        scale=scaling,
        dropout_p=dropout,
    )  # [segments, heads, longest, head_dim]
    return out.transpose(1, 2)[segment, place].unsqueeze(0), None


def register() -> None:
    """Add :data:`VARLEN_SDPA` to transformers' global ``AttentionInterface`` (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(VARLEN_SDPA, varlen_sdpa_attention)


def use_varlen_vision_attention(model: torch.nn.Module) -> bool:
    """Switch ``model``'s Qwen2/2.5-VL vision tower to :data:`VARLEN_SDPA`; False (and the model unchanged)
    when it has no such tower. The language model keeps its implementation."""
    configs = {
        id(module.config): module.config
        for module in model.modules()
        if type(module).__name__ in VISION_ATTENTION_CLASSES and hasattr(module, "config")
    }
    if not configs:
        logger.info("model.vision_attention: no Qwen2/2.5-VL vision tower; its attention stays as it is")
        return False
    register()
    for config in configs.values():
        config._attn_implementation = VARLEN_SDPA
    return True
