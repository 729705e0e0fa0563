"""Checking one ShareGPT4V entry (`parse_entry`): the prompt and caption it yields, or why it is rejected."""

import pytest

from balcaprl.data.sharegpt4v.entries import parse_entry
from balcaprl.data.validation import Rejection


@pytest.mark.parametrize(
    ("human", "prompt"),
    [
        ("<image>\nDescribe this image in detail.", "Describe this image in detail."),
        ("Describe this image in detail.\n<image>", "Describe this image in detail."),
        ("  <image>\n\nWhat is happening?  \n", "What is happening?"),
        ("Look:\n<image>\nWhat is it?", "Look:\nWhat is it?"),
        ("No tag at all.", "No tag at all."),
    ],
)
def test_prompt_is_the_human_turn_without_the_image_tag(human, prompt):
    entry = {
        "id": "x",
        "image": "coco/train2017/x.jpg",
        "conversations": [{"from": "human", "value": human}, {"from": "gpt", "value": " cap \n"}],
    }
    parsed = parse_entry(0, entry)
    assert parsed.prompt == prompt and parsed.caption == "cap"


def test_multi_turn_takes_first_human_and_the_gpt_turn_after_it():
    entry = {
        "id": 7,
        "image": "sam/images/sa_1.jpg",
        "conversations": [
            {"from": "gpt", "value": "stray"},
            {"from": "human", "value": "<image>\nQ1"},
            {"from": "gpt", "value": "A1"},
            {"from": "human", "value": "Q2"},
            {"from": "gpt", "value": "A2"},
        ],
    }
    parsed = parse_entry(3, entry)
    assert (parsed.id, parsed.index, parsed.prompt, parsed.caption) == ("7", 3, "Q1", "A1")


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        (None, "malformed_entry"),
        ({"id": True, "image": "a.jpg", "conversations": []}, "malformed_entry"),
        ({"id": "x", "image": "", "conversations": []}, "malformed_entry"),
        ({"id": "x", "image": "a.jpg", "conversations": "text"}, "missing_conversations"),
        ({"id": "x", "image": "a.jpg", "conversations": ["turn"]}, "malformed_entry"),
        ({"id": "x", "image": "C:\\images\\a.jpg", "conversations": []}, "unsafe_path"),
        ({"id": "x", "image": "a/..\\..\\b.jpg", "conversations": []}, "unsafe_path"),
    ],
)
def test_parse_entry_rejections(entry, reason):
    result = parse_entry(0, entry)
    assert isinstance(result, Rejection) and result.reason == reason


def test_unknown_reason_is_a_programming_error():
    with pytest.raises(ValueError, match="unknown rejection reason"):
        Rejection(0, "x", None, "because", "")
