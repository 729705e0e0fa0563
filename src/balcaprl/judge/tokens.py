"""Token estimates without a tokenizer: ~4 characters a token, and OpenAI's high-detail image cost.

One estimate for both ends of the wire: the client's token-rate limiter budgets a call with it before
sending, and the loopback judge server reports it as the usage of what it answered. Neither is a
measurement of a real model's tokenizer; both are deliberately the same arithmetic.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["approx_image_tokens", "approx_prompt_tokens", "approx_tokens"]


def approx_tokens(text: str) -> int:
    """~4 characters a token."""
    return math.ceil(len(text) / 4)


def approx_image_tokens(width: int, height: int) -> int:
    """OpenAI's high-detail image cost: fit within 2048 x 2048, then shrink until the short side is at
    most 768, then 85 + 170 per 512-pixel tile (85 alone for an image without pixels)."""
    if width <= 0 or height <= 0:
        return 85
    scale = min(1.0, 2048 / max(width, height))
    w, h = width * scale, height * scale
    scale = min(1.0, 768 / min(w, h))
    w, h = w * scale, h * scale
    return 85 + 170 * math.ceil(w / 512) * math.ceil(h / 512)


def approx_prompt_tokens(messages: list[dict[str, Any]], image_side: int) -> int:
    """The prompt tokens of a conversation: its text parts, and each image part counted as a square of
    ``image_side`` pixels (the client passes ``max_image_side``, an upper bound of every image it
    sends; the loopback server the largest side of the images it received)."""
    total = 0
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            total += approx_tokens(content)
        elif isinstance(content, list):
            for part in content:
                if part.get("type") == "text":
                    total += approx_tokens(part.get("text", ""))
                elif part.get("type") == "image_url":
                    total += approx_image_tokens(image_side, image_side)
    return total
