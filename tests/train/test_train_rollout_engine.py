"""What the vLLM rollout engine is given (``balcaprl.train.rollout_engine``), on the tests' tokenizer:
the special-token mask, the refusal of a completion that holds one anyway, the engine and server
arguments, and LLaVA's parameter names as vLLM loads them. The real engine runs these in
tests/vllm_engine (make test-vllm)."""

from __future__ import annotations

import json
import shlex

import pytest
from train_testkit import SPECIALS, word_level_tokenizer

from balcaprl.train.rollout_engine import (
    IMAGE_ONLY,
    SpecialTokenInCaption,
    banned_tokens,
    check_completions,
    engine_kwargs,
    sampling_ban,
    server_command,
    stop_token_ids,
    vllm_param_name,
)


@pytest.fixture(scope="module")
def tokenizer():
    return word_level_tokenizer(SPECIALS)[0]


def test_every_special_token_but_the_stop_tokens_is_banned(tokenizer):
    stops = stop_token_ids(tokenizer, [tokenizer.convert_tokens_to_ids("<|endoftext|>")])
    banned = banned_tokens(tokenizer, stops)
    assert set(banned.values()) == set(SPECIALS) - {"<|im_end|>", "<|endoftext|>"} | {"[UNK]"}
    assert all(tokenizer.convert_tokens_to_ids(text) == i for i, text in banned.items())
    # vLLM's bad_words are texts (each encodes to its one id); transformers' suppress_tokens are ids
    assert sampling_ban(banned, "vllm") == {"bad_words": list(banned.values())}
    assert sampling_ban(banned, "transformers") == {"suppress_tokens": list(banned)}
    assert all(tokenizer.encode(text, add_special_tokens=False) == [i] for i, text in banned.items())


def test_a_completion_holding_a_banned_token_is_refused_with_the_token_named(tokenizer):
    banned = banned_tokens(tokenizer, stop_token_ids(tokenizer, None))
    pad = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    words = tokenizer.encode("a red circle", add_special_tokens=False)
    check_completions([words + [tokenizer.eos_token_id]], banned)  # plain text, then a stop: fine
    with pytest.raises(SpecialTokenInCaption, match=r"rollout 1 .*'<\|image_pad\|>' \(id \d+\)"):
        check_completions([words, words[:1] + [pad] + words[1:]], banned)


def test_engine_and_server_get_the_same_settings():
    limits = {"min_pixels": 3136, "max_pixels": 12544}
    kwargs = engine_kwargs("bf16", limits, model_type="qwen2_5_vl")
    assert kwargs == {"limit_mm_per_prompt": IMAGE_ONLY, "dtype": "bfloat16", "mm_processor_kwargs": limits}
    assert engine_kwargs("fp32", None, model_type="llava") == {
        "limit_mm_per_prompt": {"image": 1, "video": 0}, "dtype": "float32", "load_format": "dummy"}  # fmt: skip
    line = shlex.split(server_command("/ckpt", "bf16", limits))
    flags = dict(zip(line[4::2], line[5::2], strict=True))
    assert line[:4] == ["trl", "vllm-serve", "--model", "/ckpt"]
    assert flags["--dtype"] == kwargs["dtype"]
    assert json.loads(flags["--limit-mm-per-prompt"]) == kwargs["limit_mm_per_prompt"]
    assert json.loads(flags["--mm-processor-kwargs"]) == kwargs["mm_processor_kwargs"]


@pytest.mark.parametrize(
    ("trainer", "vllm"),
    [
        ("model.vision_tower.embeddings.patch_embedding.weight",
         "model.vision_tower.vision_model.embeddings.patch_embedding.weight"),
        ("model.vision_tower.vision_model.post_layernorm.bias", "model.vision_tower.vision_model.post_layernorm.bias"),
        ("model.language_model.layers.0.self_attn.q_proj.weight", "model.language_model.layers.0.self_attn.q_proj.weight"),
        ("model.visual.blocks.0.attn.qkv.weight", "model.visual.blocks.0.attn.qkv.weight"),
        ("model.multi_modal_projector.linear_1.weight", "model.multi_modal_projector.linear_1.weight"),
    ],
)  # fmt: skip
def test_llava_tower_names_get_the_level_vllm_expects(trainer, vllm):
    assert vllm_param_name(trainer) == vllm
