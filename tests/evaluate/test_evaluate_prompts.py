"""The protocols' judge prompts are package data in our own words, versioned like the rubrics, and
state what each benchmark's step needs."""

from __future__ import annotations

import pytest

from balcaprl.judge.rubrics import load_rubric
from balcaprl.testing.rubrics import packaged_rubric_name

PROTOCOL_RUBRICS = (
    "dcscore_extract",
    "dcscore_match",
    "dcscore_verify",
    "captionqa_answer",
    "caparena_compare",
)

# Sentences of the benchmarks' official prompts (DeCapBench's evaluation script, CaptionQA's qa.py,
# CapArena's vlm_as_a_judge.py): none of them, nor any run of 8 of their words, may appear in ours.
OFFICIAL_SENTENCES = [
    "You are a lingustic expert in extracting atomic facts in the image caption.",
    "refer to the smallest standalone pieces of information that collectively represent the entire meaning of the sentence without losing any detail",
    "The atomic fact should only contain ONE primary element.",
    "You are an extraordinary visual-lingustic expert in verifying the correctness of a set of atomic facts given the image and the corresponding reference caption.",
    "You are now a visual-lingustic expert in matching two set of atomic facts generated from two captions.",
    "Try find the most similar mapping if exists (not need exact matching).",
    "You are given a caption describing an image, and a question about the image. Answer with a SINGLE LETTER (A, B, C, ...), no explanation.",
    "You are a highly capable multimodal AI assistant tasked with evaluating image captions.",
    "Salient information in the image should be reflected in the caption.",
    "Captions that include descriptions of objects or elements that are clearly absent from the image should be significantly penalized.",
    "The content in the reference caption can be considered correct; however, it is not perfect, and descriptions not included in the reference caption can still be reasonable.",
    "describing an otter as a small animal is precise, but it is less informative than specifying an otter",
]


def squash(text: str) -> str:
    return " ".join(text.lower().replace('"', " ").replace(",", " ").replace(".", " ").split())


def test_prompts_are_ours():
    ours = squash(" ".join(load_rubric(name).text for name in PROTOCOL_RUBRICS))
    for sentence in OFFICIAL_SENTENCES:
        words = squash(sentence).split()
        for i in range(len(words) - 7):
            assert " ".join(words[i : i + 8]) not in ours, " ".join(words[i : i + 8])


@pytest.mark.parametrize(
    ("name", "facts"),
    [
        ("dcscore_extract", ['"relevance"', '"identifier"', "atomic fact", '"facts"', "never instructions"]),
        ("dcscore_match", ["oracle_id", "null", "Several predicted facts may name the same oracle fact"]),
        ("dcscore_verify", ["REFERENCE", '"verdicts"', '"correct"']),
        ("captionqa_answer", ["single letter", "only what the caption states"]),
        (
            "caparena_compare",
            ["Caption 1 is better", "Caption 2 is better", '"Tie"', "human expert", "hallucination"],
        ),
    ],
)
def test_prompts_say_what_the_step_needs(name, facts):
    rubric = load_rubric(name)
    version = 2 if name in ("captionqa_answer", "caparena_compare") else 1  # v2: the texts are tagged blocks
    assert packaged_rubric_name(rubric.text) == name and rubric.version.startswith(f"{name}-v{version}-any+")
    for fact in facts:
        assert fact in rubric.text, fact
