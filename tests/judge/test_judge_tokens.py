"""Token estimates (balcaprl.judge.tokens): OpenAI's published image costs, worked by hand."""

from __future__ import annotations

import math

import pytest

from balcaprl.judge.tokens import (
    CompletionBudget,
    approx_image_tokens,
    approx_prompt_tokens,
    approx_tokens,
    image_cost_rule,
)


@pytest.mark.parametrize(
    ("width", "height", "tokens"),
    [
        (1024, 1024, 765),  # short side to 768: 768 x 768, 2 x 2 tiles -> 85 + 170 * 4
        (2048, 4096, 1105),  # fit 2048: 1024 x 2048; short side 768: 768 x 1536, 2 x 3 tiles
        (48, 48, 255),  # never enlarged: one tile
        (513, 100, 425),  # 2 x 1 tiles
        (0, 10, 85),  # no pixels: the base cost only
    ],
)
def test_image_costs(width, height, tokens):
    assert approx_image_tokens(width, height) == tokens


def test_prompt_tokens_count_text_parts_and_images():
    messages = [
        {"role": "system", "content": "x" * 9},  # 3 tokens
        {"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            {"type": "text", "text": "y" * 8},  # 2 tokens
        ]},
        {"role": "assistant", "content": "z"},  # 1 token
    ]  # fmt: skip
    assert approx_tokens("") == 0 and approx_tokens("abcde") == 2
    assert approx_prompt_tokens(messages, 1024) == 3 + 765 + 2 + 1
    assert approx_prompt_tokens(messages, 48) == 3 + 255 + 2 + 1


@pytest.mark.parametrize(
    ("model", "width", "height", "tokens"),
    [
        # gpt-4o-mini bills the same tiles at 2833 + 5667 per tile: a 128 x 64 image is one tile, 8,500
        # tokens (a published measurement: 8,512 prompt tokens with the request's text).
        ("gpt-4o-mini", 128, 64, 2833 + 5667),
        ("gpt-4o-mini-2024-07-18", 1024, 1024, 2833 + 5667 * 4),  # a dated name is its family
        ("openai/gpt-4o", 1024, 1024, 765),  # a provider prefix is dropped
        ("gpt-5", 1024, 1024, 70 + 140 * 4),
        # patches: 1024 x 1024 is 32 x 32 = 1024 patches, x 1.62
        ("gpt-4.1-mini", 1024, 1024, 1659),
        # 1800 x 2400 is 57 x 75 > 1536 patches: shrunk to 33 patches wide (1056 px), 1408 px = 44 high
        ("gpt-5-mini", 1800, 2400, math.ceil(33 * 44 * 1.62)),
        ("o4-mini", 64, 64, math.ceil(4 * 1.72)),
        # Qwen2.5-VL: 1024 / 28 = 36.6 -> 37 per side, plus the vision start/end tokens
        ("Qwen/Qwen2.5-VL-72B-Instruct", 1024, 1024, 37 * 37 + 2),
    ],
)
def test_image_costs_per_model(model, width, height, tokens):
    assert image_cost_rule(model).known
    assert approx_image_tokens(width, height, model) == tokens


def test_an_unknown_model_says_so_and_is_priced_like_gpt_4o():
    rule = image_cost_rule("gpt-5.4")
    assert not rule.known and "gpt-5.4" in rule.source and "not in the image-cost table" in rule.source
    assert approx_image_tokens(1024, 1024, "gpt-5.4") == approx_image_tokens(1024, 1024) == 765


def test_the_prompt_estimate_uses_the_models_image_rate():
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    assert approx_prompt_tokens(messages, 128, "gpt-4o-mini") == 2833 + 5667
    assert approx_prompt_tokens(messages, 128, "gpt-4o") == 255


def test_completion_budget_reserves_the_observed_p95_not_max_tokens():
    budget = CompletionBudget(first_guess=1024, min_seen=4, window=100)
    assert budget.reserve(4096) == 1024 and budget.reserve(512) == 512  # before enough answers
    for tokens in range(1, 101):  # 1..100: the 95th of 100 sorted values is 95
        budget.observe(tokens)
    assert budget.reserve(4096) == 95
    assert budget.reserve(50) == 50  # never more than the call's own max_tokens
    budget.observe(0)  # an answer without usage tells nothing
    assert budget.reserve(4096) == 95
