"""Token estimates (balcaprl.judge.tokens): OpenAI's published image costs, worked by hand."""

from __future__ import annotations

import pytest

from balcaprl.judge.tokens import approx_image_tokens, approx_prompt_tokens, approx_tokens


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
