"""The plan's bytes per token per decoder layer against what autograd really saves: the real transformers
decoder layers at each recipe model's widths (two layers, random weights, bf16, sdpa), counted with
``saved_tensors_hooks`` (balcaprl.plan.measured), without a mask, with a padding mask at two lengths (the
mask's share grows with the padded width), and packed through the variable-length route."""

from __future__ import annotations

import pytest

from balcaprl.plan.measured import LayerWidths, saved_bytes_per_layer, text_model
from balcaprl.plan.memory import BF16, KNOWN_MODELS, model_shape
from balcaprl.train.varlen_attention import VARLEN

TOLERANCE = 0.05  # the bound on plan against measurement
BATCH = 1


def widths(name: str) -> LayerWidths:
    text = model_shape(name).text
    family = "qwen2_5_vl" if KNOWN_MODELS[name][0]["model_type"] == "qwen2_5_vl" else "llama"
    return LayerWidths(family, text.hidden, text.heads, text.kv_heads, text.intermediate)


def per_token(model, length, masking, **kwargs) -> float:
    """The last layer's bytes per token (the first also holds the rotary tables all layers share)."""
    return saved_bytes_per_layer(model, BATCH, length, masking, **kwargs)[-1] / (BATCH * length)


def close(measured: float, planned: int) -> bool:
    return abs(measured - planned) <= TOLERANCE * planned


@pytest.mark.parametrize("name", list(KNOWN_MODELS))
def test_plan_bytes_per_layer_equal_autograds_saved_tensors(name):
    stack = model_shape(name).text
    w = widths(name)
    model = text_model(w, layers=2, attn=VARLEN if w.family == "qwen2_5_vl" else "sdpa")
    measured = {"none 96": per_token(model, 96, "none")}
    for length in (96, 160):  # TRL's padded micro-batch: a padding mask of the padded width
        measured[f"padding {length}"] = per_token(model, length, "padding")
    planned = {
        "none 96": stack.layer_activation_bytes(),
        "padding 96": stack.layer_activation_bytes(mask_width=96),
        "padding 160": stack.layer_activation_bytes(mask_width=160),
    }
    if w.family == "qwen2_5_vl":
        # Packed rows of unequal samples. On CPU the variable-length route is one SDPA call per sample,
        # whose outputs are concatenated: one more 2h-byte copy per token than CUDA's single varlen kernel.
        measured["packed"] = saved_bytes_per_layer(model, 2, 0, "packed", real=[60, 100])[-1] / 160
        planned["packed"] = stack.layer_activation_bytes() + BF16 * stack.hidden
    report = {k: (round(measured[k]), planned[k]) for k in measured}
    assert all(close(measured[k], planned[k]) for k in measured), report
    # The mask's share grows by 2 bytes per token per extra token of padded width (the formula's L term).
    growth = (measured["padding 160"] - measured["padding 96"]) / 64
    assert growth == pytest.approx(BF16, rel=TOLERANCE), report
    # What a mask adds (k and v expanded to every head, the mask itself), on its own.
    added = measured["padding 96"] - measured["none 96"]
    assert added == pytest.approx(planned["padding 96"] - planned["none 96"], rel=TOLERANCE), report
