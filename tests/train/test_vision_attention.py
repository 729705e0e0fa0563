"""The one-call vision attention on the tiny Qwen2.5-VL: image-token outputs and gradients equal sdpa's
per-window loop (float32, tight tolerance), in one attention call per layer instead of one per window."""

from __future__ import annotations

import pytest
import torch

from balcaprl.recipe import ModelConfig
from balcaprl.train.modeling import load_processor
from balcaprl.train.vision_attention import VARLEN_SDPA, use_varlen_vision_attention, varlen_sdpa_attention

# Two images on grids of 16 x 24 and 8 x 12 patches: 112-px windows (8 x 8 patches) cut them into 6 full
# windows and 1 full + 1 half window; the tiny tower's block 1 attends over whole images.
GRID = torch.tensor([[1, 16, 24], [1, 8, 12]])


def load(path):
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")


def pixels(model):
    vision = model.config.vision_config
    width = vision.in_channels * vision.temporal_patch_size * vision.patch_size**2
    return torch.randn(int(GRID.prod(-1).sum()), width, generator=torch.Generator().manual_seed(0))


def count_sdpa(monkeypatch):
    calls = []
    real = torch.nn.functional.scaled_dot_product_attention

    def counted(*args, **kwargs):
        calls.append(args[0].shape)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", counted)
    return calls


def vision_step(model, x):
    x = x.clone().requires_grad_(True)
    out = model.model.visual(x, grid_thw=GRID)
    embeds = out.pooler_output if hasattr(out, "pooler_output") else out  # the image tokens
    embeds.pow(2).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.model.visual.named_parameters() if p.grad is not None}
    return embeds.detach(), x.grad, grads


def test_image_token_outputs_and_gradients_equal_sdpas(tiny_policy, monkeypatch):
    reference_model, model = load(tiny_policy), load(tiny_policy)
    x = pixels(model)
    calls = count_sdpa(monkeypatch)
    expected, expected_dx, expected_grads = vision_step(reference_model, x)
    per_window = len(calls)
    assert per_window == 8 + 2  # block 0: one call per window; block 1 (full attention): one per image

    calls.clear()
    assert use_varlen_vision_attention(model) is True
    assert model.config.vision_config._attn_implementation == VARLEN_SDPA
    assert model.config.text_config._attn_implementation == "sdpa"  # the language model keeps its own
    got, dx, grads = vision_step(model, x)
    assert len(calls) == 2  # one call per layer
    assert calls[0][0] == 8 and calls[1][0] == 2  # the padded batches: 8 windows, then 2 images

    assert got.shape == expected.shape == (int(GRID.prod(-1).sum()) // 4, 64)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(dx, expected_dx, rtol=1e-5, atol=1e-6)
    assert grads.keys() == expected_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected_grads[name], rtol=1e-5, atol=1e-6, msg=name)


def test_the_whole_model_on_a_processed_image_equals_sdpa(tiny_policy):
    from PIL import Image

    processor = load_processor(ModelConfig(path=str(tiny_policy)))
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "describe"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    batch = processor(text=[text], images=[Image.new("RGB", (56, 56), (10, 200, 30))], return_tensors="pt")
    reference_model, model = load(tiny_policy), load(tiny_policy)
    use_varlen_vision_attention(model)
    with torch.no_grad():
        torch.testing.assert_close(
            model(**batch).logits, reference_model(**batch).logits, rtol=1e-5, atol=1e-6
        )


def segments_by_hand(q, k, v, cu, scale):
    """The per-window loop, written out: softmax(q k^T * scale) v within each segment."""
    outs = []
    for start, end in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
        scores = torch.einsum("hqd,hkd->hqk", q[0, :, start:end], k[0, :, start:end]) * scale
        outs.append(torch.einsum("hqk,hkd->qhd", scores.softmax(-1), v[0, :, start:end]))
    return torch.cat(outs).unsqueeze(0)


@pytest.mark.parametrize("lengths", [[5], [1, 7, 3], [4, 4, 4, 4], [2, 9]])
def test_varlen_attention_equals_segments_by_hand(lengths):
    generator = torch.Generator().manual_seed(len(lengths))
    tokens, heads, dim = sum(lengths), 3, 8
    q, k, v = (torch.randn(1, heads, tokens, dim, generator=generator) for _ in range(3))
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    out, weights = varlen_sdpa_attention(
        None, q, k, v, scaling=0.3, cu_seq_lens_q=cu, max_length_q=max(lengths)
    )
    assert weights is None
    torch.testing.assert_close(out, segments_by_hand(q, k, v, cu, 0.3), rtol=1e-5, atol=1e-6)


def test_a_model_without_a_qwen_vision_tower_is_left_alone(tiny_llava):
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(tiny_llava, dtype=torch.float32)
    before = model.config.vision_config._attn_implementation
    assert use_varlen_vision_attention(model) is False
    assert model.config.vision_config._attn_implementation == before


def test_a_training_run_uses_it_when_the_recipe_asks(tiny_policy, tiny_dataset, tmp_path):
    from train_testkit import ScriptedJudge, tiny_recipe_dict
    from transformers import TrainerCallback

    from balcaprl.recipe import recipe_from_dict
    from balcaprl.train import train

    seen = []

    class Probe(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            config = model.config
            seen.append((config.vision_config._attn_implementation, config.text_config._attn_implementation))

    recipe = recipe_from_dict(
        tiny_recipe_dict(
            tiny_policy,
            tiny_dataset,
            tmp_path / "run",
            model={"vision_attention": "varlen_sdpa", "attn_implementation": "sdpa"},
            train={"max_steps": 1},
        )
    )
    train(recipe, ScriptedJudge(), callbacks=[Probe()])
    assert seen == [(VARLEN_SDPA, "sdpa")]
