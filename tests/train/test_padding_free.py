"""Padding-free micro-batches: on the tiny Qwen2.5-VL, the packed log-prob pass gives the padded pass's
log-probs, entropies, loss and gradients (float32, tight tolerance), and a training run uses it when the
recipe asks."""

from __future__ import annotations

from contextlib import nullcontext
from types import SimpleNamespace

import pytest
import torch
from PIL import Image
from trl import GRPOTrainer
from trl.trainer.utils import add_fused_lm_head

from balcaprl.recipe import ModelConfig
from balcaprl.train.modeling import load_processor
from balcaprl.train.packing import PackedLogProbs
from balcaprl.train.varlen_attention import VARLEN


class Padded:
    """What TRL's log-prob pass reads of a trainer: its accelerator's autocast."""

    accelerator = SimpleNamespace(autocast=nullcontext, is_main_process=True)
    _get_per_token_logps_and_entropies = GRPOTrainer._get_per_token_logps_and_entropies


class Packed(PackedLogProbs, Padded):
    pass


def grpo_batch(path):
    """Three captions of different lengths for prompts of different lengths, padded as TRL pads them:
    prompts on the left, captions on the right."""
    processor = load_processor(ModelConfig(path=str(path)))
    tokenizer = processor.tokenizer
    prompts, completions = [], []
    for words, caption in (
        ("describe", "red circle"),
        ("describe the picture", "a big blue square on"),
        ("what", "x"),
    ):
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": words}]}]
        prompts.append(processor.apply_chat_template(messages, add_generation_prompt=True))
        completions.append(tokenizer(caption, add_special_tokens=False)["input_ids"])
    images = [Image.new("RGB", (56, 56), colour) for colour in ((200, 0, 0), (0, 0, 200), (0, 150, 0))]
    tokenizer.padding_side = "left"
    prompt = processor(text=prompts, images=images, return_tensors="pt", padding=True)
    width = max(len(c) for c in completions)
    pad = tokenizer.pad_token_id
    completion_ids = torch.tensor([c + [pad] * (width - len(c)) for c in completions])
    completion_mask = torch.tensor([[1] * len(c) + [0] * (width - len(c)) for c in completions])
    inputs = {
        "input_ids": torch.cat([prompt["input_ids"], completion_ids], dim=1),
        "attention_mask": torch.cat([prompt["attention_mask"], completion_mask], dim=1),
        "logits_to_keep": width,
        "pixel_values": prompt["pixel_values"],
        "image_grid_thw": prompt["image_grid_thw"],
        "num_images": [1, 1, 1],
    }
    if "mm_token_type_ids" in prompt:
        types = prompt["mm_token_type_ids"]
        inputs["mm_token_type_ids"] = torch.cat([types, torch.zeros_like(completion_ids)], dim=1)
    return inputs, completion_mask


def load(path):
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")
    add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    return model


def run(host, model, inputs, completion_mask, batch_size):
    model.zero_grad()
    logps, entropies, _ = host._get_per_token_logps_and_entropies(
        model, batch_size=batch_size, compute_entropy=True, **inputs
    )
    # the paper's token-sum-sequence-mean of -log p, what the loss reduces to at ratio 1 and advantage 1
    loss = -(logps * completion_mask).sum(1).mean()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logps * completion_mask, entropies * completion_mask, loss.detach(), grads


@pytest.mark.parametrize("batch_size", [3, 2])  # one micro-batch, or two (pixel rows sliced per sample)
def test_packed_log_probs_loss_and_gradients_equal_the_padded_ones(tiny_policy, batch_size):
    inputs, completion_mask = grpo_batch(tiny_policy)
    assert (inputs["attention_mask"] == 0).any()  # there is padding to leave out
    model = load(tiny_policy)
    expected = run(Padded(), model, inputs, completion_mask, batch_size)
    got = run(Packed(), model, inputs, completion_mask, batch_size)
    assert model.config.text_config._attn_implementation == VARLEN  # no dense mask: the varlen route
    torch.testing.assert_close(got[0], expected[0], rtol=1e-5, atol=1e-5)  # log-probs
    torch.testing.assert_close(got[1], expected[1], rtol=1e-5, atol=1e-5)  # entropies
    torch.testing.assert_close(got[2], expected[2], rtol=1e-5, atol=1e-6)  # loss
    assert got[3].keys() == expected[3].keys()
    for name, grad in got[3].items():
        torch.testing.assert_close(grad, expected[3][name], rtol=1e-4, atol=1e-6, msg=name)


def test_the_packed_row_holds_only_real_tokens_with_positions_restarting(tiny_policy):
    from balcaprl.train.packing import pack_rows, rope_model

    inputs, _ = grpo_batch(tiny_policy)
    model = load(tiny_policy)
    packed = pack_rows(
        rope_model(model),
        inputs["input_ids"],
        inputs["attention_mask"],
        inputs["image_grid_thw"],
        inputs.get("mm_token_type_ids"),
    )
    lengths = inputs["attention_mask"].sum(1).tolist()
    assert packed["input_ids"].shape == (1, sum(lengths))
    text = packed["position_ids"][0, 0]
    starts = [0, lengths[0], lengths[0] + lengths[1]]
    assert [int(text[s]) for s in starts] == [0, 0, 0]  # each sample's text positions start again
    assert packed["position_ids"].shape == (4, 1, sum(lengths))


def test_a_training_run_packs_when_the_recipe_asks(tiny_policy, tiny_dataset, tmp_path, monkeypatch):
    from train_testkit import ScriptedJudge, tiny_recipe_dict

    from balcaprl.recipe import recipe_from_dict
    from balcaprl.train import packing, train

    calls = []
    real = packing.pack_rows

    def counted(*args, **kwargs):
        calls.append(args[1].shape)
        return real(*args, **kwargs)

    monkeypatch.setattr(packing, "pack_rows", counted)
    recipe = recipe_from_dict(
        tiny_recipe_dict(
            tiny_policy, tiny_dataset, tmp_path / "run", train={"max_steps": 1, "padding_free": True}
        )
    )
    result = train(recipe, ScriptedJudge())
    assert result.global_step == 1 and calls  # the old log-probs and the loss ran packed
