"""Checking one ShareGPT4V entry: its id, image path and conversation, before any image is opened.

An entry as published::

    {"id": "000000000009", "image": "coco/train2017/000000000009.jpg",
     "conversations": [{"from": "human", "value": "<image>\\nDescribe this image in detail."},
                       {"from": "gpt", "value": "The image shows ..."}]}

The prompt is the first human turn without its ``<image>`` tag; the reference caption is the first
gpt turn after it. Anything else becomes a :class:`~balcaprl.data.validation.Rejection` with one of
the entry-level reasons of :data:`~balcaprl.data.validation.REASONS`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from balcaprl.data.validation import Rejection, lexical_path_problem, normalise_path

_IMAGE_TAG = re.compile(r"\s*<image>\s*")
_HUMAN = {"human", "user"}
_GPT = {"gpt", "assistant"}


@dataclass(slots=True)
class ParsedEntry:
    """An entry whose text fields are usable; the image is still to be checked."""

    index: int  # position in the JSON list
    id: str
    image: str  # normalised path relative to the image root
    prompt: str
    caption: str


def _prompt_from(value: str) -> str:
    """The human turn without its ``<image>`` tag(s) and the newlines around them."""
    parts = [p.strip() for p in _IMAGE_TAG.split(value)]
    return "\n".join(p for p in parts if p)


def parse_entry(index: int, entry: Any) -> ParsedEntry | Rejection:
    """Read one ShareGPT4V entry; a :class:`Rejection` says what is wrong with it."""

    def reject(reason: str, detail: str, sample_id: Any = None, image: Any = None) -> Rejection:
        return Rejection(
            index=index,
            id=None if sample_id is None else str(sample_id),
            image=image if isinstance(image, str) else None,
            reason=reason,
            detail=detail,
        )

    if not isinstance(entry, dict):
        return reject("malformed_entry", f"expected an object, got {type(entry).__name__}")
    sample_id, image = entry.get("id"), entry.get("image")
    if not isinstance(sample_id, str | int) or isinstance(sample_id, bool) or str(sample_id).strip() == "":
        return reject("malformed_entry", "no `id`", image=image)
    sample_id = str(sample_id).strip()
    if not isinstance(image, str) or not image.strip():
        return reject(
            "malformed_entry", "no `image` path (text-only entries have no image to caption)", sample_id
        )
    problem = lexical_path_problem(image)
    if problem:
        return reject("unsafe_path", problem, sample_id, image)
    image = normalise_path(image)
    turns = entry.get("conversations")
    if not isinstance(turns, list) or not turns:
        return reject("missing_conversations", "no `conversations` list, or an empty one", sample_id, image)
    if not all(isinstance(t, dict) for t in turns):
        return reject("malformed_entry", "a conversation turn is not an object", sample_id, image)
    human = next((i for i, t in enumerate(turns) if t.get("from") in _HUMAN), None)
    if human is None:
        return reject("no_human_turn", "no turn from 'human'", sample_id, image)
    gpt = next((i for i, t in enumerate(turns) if i > human and t.get("from") in _GPT), None)
    if gpt is None:
        return reject("no_gpt_turn", "no turn from 'gpt' after the human turn", sample_id, image)
    prompt_value, caption_value = turns[human].get("value"), turns[gpt].get("value")
    if not isinstance(prompt_value, str) or not isinstance(caption_value, str):
        return reject("malformed_entry", "a turn's `value` is not text", sample_id, image)
    prompt = _prompt_from(prompt_value)
    if not prompt:
        return reject("empty_prompt", "the human turn holds only the <image> tag", sample_id, image)
    caption = caption_value.strip()
    if not caption:
        return reject("empty_caption", "the gpt turn is empty", sample_id, image)
    return ParsedEntry(index=index, id=sample_id, image=image, prompt=prompt, caption=caption)
