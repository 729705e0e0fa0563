"""What a decoder layer really keeps for the backward pass, counted by autograd itself.

:func:`saved_bytes_per_layer` builds a few decoder layers of the real transformers class at a model's
real widths (random initialisation, nothing downloaded), runs one forward under
``torch.autograd.graph.saved_tensors_hooks`` and counts, per layer, the bytes of every distinct storage
autograd saves (parameters excluded: they are the weights, counted elsewhere). Views of one storage count
once, at the size of the whole storage; a storage first saved by an earlier layer (the rotary tables, the
mask when it is shared) counts there. The last layer is the steady state the plan multiplies.

Used by the tests that hold :meth:`balcaprl.plan.memory.Stack.layer_activation_bytes` to this count and
by the GPU check (``benchmarks/gpu_check.py``), which counts the same way on CUDA.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch

Masking = Literal["none", "padding", "packed"]


@dataclass(frozen=True)
class LayerWidths:
    """A language model's decoder-layer widths (what the plan's :class:`Stack` holds)."""

    family: Literal["qwen2_5_vl", "llama"]
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int


def mrope_sections(widths: LayerWidths) -> list[int]:
    """Qwen2.5-VL's split of the rotary frequencies over time, height and width ([16, 24, 24] at head
    size 128), scaled to ``widths``' head size."""
    half = widths.hidden // widths.heads // 2
    time = half // 4
    return [time, (half - time) // 2, half - time - (half - time) // 2]


def text_model(widths: LayerWidths, layers: int = 2, attn: str = "sdpa", dtype=torch.bfloat16) -> Any:
    """The real transformers language model at ``widths`` with ``layers`` layers (random init, small vocab)."""
    common = dict(
        hidden_size=widths.hidden,
        intermediate_size=widths.intermediate,
        num_hidden_layers=layers,
        num_attention_heads=widths.heads,
        num_key_value_heads=widths.kv_heads,
        vocab_size=256,
        max_position_embeddings=32768,
    )
    if widths.family == "qwen2_5_vl":
        from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLTextConfig
        from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLTextModel

        config = Qwen2_5_VLTextConfig(
            **common, rope_parameters={"rope_type": "default", "mrope_section": mrope_sections(widths)}
        )
        model_class = Qwen2_5_VLTextModel
    else:
        from transformers import LlamaConfig, LlamaModel

        config, model_class = LlamaConfig(**common), LlamaModel
    if attn == "balcaprl_varlen":
        from balcaprl.train.varlen_attention import register

        register()
    config._attn_implementation = attn
    from transformers.initialization import no_init_weights

    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # allocated in dtype at once (a 7B-wide fp32 copy costs seconds)
    try:
        with no_init_weights():  # allocation only: transformers' initialisation of 7B widths takes ~20 s
            model = model_class(config)
    finally:
        torch.set_default_dtype(previous)
    model = model.to(dtype)
    # Our own random weights, cheaply: norms at 1, the rest from 2^20 N(0, 0.02) values, repeated in
    # tensors larger than that (byte counts do not depend on values).
    base = (0.02 * torch.randn(1 << 20, generator=torch.Generator().manual_seed(0))).to(dtype)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.fill_(1.0)
            else:
                n = parameter.numel()
                parameter.view(-1).copy_(base.repeat(n // base.numel() + 1)[:n])
    model.train()
    return model


def saved_bytes_per_layer(
    model: Any, batch: int, length: int, masking: Masking, device: str = "cpu", real: list[int] | None = None
) -> list[int]:
    """Bytes each decoder layer of ``model`` saves for backward in one forward of ``batch x length`` tokens.

    ``masking``: ``none`` (no mask: causal attention), ``padding`` (a padding mask with one pad token per
    row, so the model builds a 4-D mask), ``packed`` (``batch`` sequences of ``real`` lengths packed in one
    row, position ids restarting at 0 for each: the model's packed-sequence route).
    """
    layers = list(model.layers)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: set[int] = set()
    counts = [0] * len(layers)
    current = [-1]

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        pointer = storage.data_ptr()
        if current[0] >= 0 and pointer not in params and pointer not in seen and storage.nbytes() > 0:
            seen.add(pointer)
            counts[current[0]] += storage.nbytes()
        return tensor

    handles = []
    for index, layer in enumerate(layers):
        handles.append(layer.register_forward_pre_hook(lambda _m, _a, i=index: current.__setitem__(0, i)))
        handles.append(layer.register_forward_hook(lambda _m, _a, _o: current.__setitem__(0, -1)))
    kwargs: dict[str, Any] = {}
    if masking == "packed":
        lengths = real or [length] * batch
        ids = torch.randint(0, 256, (1, sum(lengths)), device=device)
        kwargs["position_ids"] = torch.cat([torch.arange(n, device=device) for n in lengths])[None]
        if hasattr(model, "rotary_emb") and getattr(model.config, "rope_parameters", {}).get("mrope_section"):
            text = kwargs["position_ids"]
            kwargs["position_ids"] = torch.cat([text[None], text[None].expand(3, -1, -1)], dim=0)
    else:
        ids = torch.randint(0, 256, (batch, length), device=device)
        if masking == "padding":
            mask = torch.ones(batch, length, dtype=torch.long, device=device)
            mask[:, -1] = 0
            kwargs["attention_mask"] = mask
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            out = model(input_ids=ids, use_cache=False, **kwargs).last_hidden_state
    finally:
        for handle in handles:
            handle.remove()
    del out
    return counts
