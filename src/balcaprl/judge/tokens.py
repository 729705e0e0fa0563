"""Token estimates without a tokenizer: ~4 characters a token, and each model's published image cost.

One estimate for both ends of the wire: the client's token-rate limiter budgets a call with it before
sending, the cost plan prices a step with it, and the loopback judge server reports it as the usage of
what it answered. Text is ~4 characters a token (not any model's tokenizer); an image costs what its
model bills for it, which differs by model far more than text does: gpt-4o-mini bills an image at
about 33x gpt-4o's tokens (the same dollar price at a 33x lower token price), so a limiter set to an
organisation's tokens-per-minute that counted images at gpt-4o's rate would let 20-30x the budget
through.

The image rules (:data:`IMAGE_COSTS`), high detail, as OpenAI's vision guide ("Calculating costs",
platform.openai.com/docs/guides/images-vision) states them for its models, and Qwen2.5-VL's processor
for a local Qwen judge:

- ``tiles``: fit within 2048 x 2048, shrink until the short side is at most 768, then ``base + tile``
  per 512-pixel tile;
- ``patches``: 32-pixel patches, at most 1536 (the image shrunk to fit), times the model's multiplier;
- ``qwen2.5-vl``: one token per 28 x 28 pixels (14-pixel patches merged 2 x 2), each side rounded to a
  multiple of 28, plus the two vision start/end tokens.

A model not in the table is estimated at gpt-4o's rate, and :func:`image_cost_rule` says so
(``known`` False) so a plan can print it.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal


def approx_tokens(text: str) -> int:
    """~4 characters a token."""
    return math.ceil(len(text) / 4)


@dataclass(frozen=True)
class ImageCost:
    """How one model bills an image (see the module docstring for the three kinds)."""

    kind: Literal["tiles", "patches", "qwen2.5-vl"]
    base: int = 0  # tiles: tokens per image
    tile: int = 0  # tiles: tokens per 512-pixel tile
    multiplier: float = 1.0  # patches: tokens per 32-pixel patch
    source: str = "OpenAI vision guide, 'Calculating costs'"
    known: bool = True

    def tokens(self, width: int, height: int) -> int:
        if self.kind == "tiles":
            return _tile_tokens(width, height, self.base, self.tile)
        if self.kind == "patches":
            return math.ceil(_patches(width, height) * self.multiplier)
        return _qwen_tokens(width, height)


_QWEN_SOURCE = "Qwen2.5-VL processor: 14-px patches merged 2x2 (smart_resize to multiples of 28)"

# Longest name first when matching: "gpt-4o-mini-2024-07-18" is gpt-4o-mini, not gpt-4o.
IMAGE_COSTS: dict[str, ImageCost] = {
    "gpt-4o-mini": ImageCost("tiles", base=2833, tile=5667),
    "gpt-4o": ImageCost("tiles", base=85, tile=170),
    "gpt-4.1-mini": ImageCost("patches", multiplier=1.62),
    "gpt-4.1-nano": ImageCost("patches", multiplier=2.46),
    "gpt-4.1": ImageCost("tiles", base=85, tile=170),
    "gpt-5-mini": ImageCost("patches", multiplier=1.62),
    "gpt-5-nano": ImageCost("patches", multiplier=2.46),
    "gpt-5": ImageCost("tiles", base=70, tile=140),
    "o4-mini": ImageCost("patches", multiplier=1.72),
    "o1": ImageCost("tiles", base=75, tile=150),
    "o3": ImageCost("tiles", base=75, tile=150),
    "qwen2.5-vl": ImageCost("qwen2.5-vl", source=_QWEN_SOURCE),
}
_FALLBACK = IMAGE_COSTS["gpt-4o"]


def image_cost_rule(model: str | None) -> ImageCost:
    """The image rule of ``model`` (a served name such as ``openai/gpt-4o-mini-2024-07-18`` or
    ``Qwen/Qwen2.5-VL-72B-Instruct`` is matched by its family); an unknown model gets gpt-4o's rule
    with ``known=False`` and a ``source`` that says it is a guess."""
    if model is None:
        return _FALLBACK
    name = model.lower().rsplit("/", 1)[-1]
    for family in sorted(IMAGE_COSTS, key=len, reverse=True):
        if name == family or name.startswith(family + "-"):
            return IMAGE_COSTS[family]
    return ImageCost(
        "tiles", base=85, tile=170, known=False,
        source=f"model {model!r} is not in the image-cost table: estimated at gpt-4o's rate",
    )  # fmt: skip


def _tile_tokens(width: int, height: int, base: int, tile: int) -> int:
    if width <= 0 or height <= 0:
        return base
    scale = min(1.0, 2048 / max(width, height))
    w, h = width * scale, height * scale
    scale = min(1.0, 768 / min(w, h))
    w, h = w * scale, h * scale
    return base + tile * math.ceil(w / 512) * math.ceil(h / 512)


def _patches(width: int, height: int, cap: int = 1536) -> int:
    if width <= 0 or height <= 0:
        return 0
    if math.ceil(width / 32) * math.ceil(height / 32) <= cap:
        return math.ceil(width / 32) * math.ceil(height / 32)
    # Shrink to fit the cap, then further so the width is a whole number of patches (the height
    # follows the aspect ratio; rounded first, so 1408.0000001 pixels are 44 patches, not 45).
    columns = math.floor(width * math.sqrt(cap * 32 * 32 / (width * height)) / 32)
    rows = math.ceil(round(columns * height / width, 6))
    return min(cap, columns * rows)


def _qwen_tokens(width: int, height: int) -> int:
    if width <= 0 or height <= 0:
        return 2
    return max(1, round(width / 28)) * max(1, round(height / 28)) + 2


def approx_image_tokens(width: int, height: int, model: str | None = None) -> int:
    """What ``model`` bills for one high-detail image (gpt-4o's rule for None or an unknown model)."""
    return image_cost_rule(model).tokens(width, height)


def approx_prompt_tokens(messages: list[dict[str, Any]], image_side: int, model: str | None = None) -> int:
    """The prompt tokens of a conversation: its text parts, and each image part counted as a square of
    ``image_side`` pixels (the client passes ``max_image_side``, an upper bound of every image it
    sends; the loopback server the largest side of the images it received), at ``model``'s image
    rule."""
    image = image_cost_rule(model).tokens(image_side, image_side)
    return sum(image if text is None else approx_tokens(text) for text in _parts(messages))


def prompt_chars(messages: list[dict[str, Any]]) -> int:
    """The characters of a conversation's text parts (what an answer's length grows with)."""
    return sum(len(text) for text in _parts(messages) if text is not None)


def _parts(messages: list[dict[str, Any]]) -> Iterator[str | None]:
    """A conversation's text parts, and None for each image part."""
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            yield content
        elif isinstance(content, list):
            for part in content:
                if part.get("type") == "text":
                    yield part.get("text", "")
                elif part.get("type") == "image_url":
                    yield None


class CompletionBudget:
    """The completion tokens a token-rate limiter reserves for a call before it is sent.

    Providers count ``max_tokens`` against the budget up front, but a judge's answer is a fraction of
    it (a verdict is hundreds of tokens, ``max_tokens`` is 4,096): reserving the whole of it paces
    the client at a fraction of its real rate. This reserves the 95th percentile of the last
    ``window`` answers' completion tokens (``first_guess`` until ``min_seen`` have been seen), never
    more than the call's ``max_tokens``.
    """

    def __init__(self, first_guess: int = 1024, window: int = 512, min_seen: int = 16):
        self.first_guess = first_guess
        self.min_seen = min_seen
        self._seen: deque[int] = deque(maxlen=window)

    def observe(self, completion_tokens: int) -> None:
        if completion_tokens > 0:
            self._seen.append(completion_tokens)

    def reserve(self, max_tokens: int) -> int:
        if len(self._seen) < self.min_seen:
            return min(max_tokens, self.first_guess)
        ordered = sorted(self._seen)
        return min(max_tokens, ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)])
