"""The protocols' judge prompts are package data in our own words, versioned like the rubrics, and
state what each benchmark's step needs."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

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

RUN = 7  # words: no run this long may be shared with the official prompts
# The answer forms CapArena's scorer reads ("Judgment: Caption 1 is better", ...) must be shared: a run
# of only these words is the answer format, not prose.
ANSWER_FORM_WORDS = {"judgment", "caption", "1", "2", "is", "better", "tie"}


def words(text: str) -> list[str]:
    """Lower-cased words, every run of other characters a single separator (as the stored hashes)."""
    return re.sub(r"[^a-z0-9]+", " ", text.lower()).split()


def official_run_hashes() -> set[str]:
    """sha256 (first 12 hex digits) of every RUN-word run of the official prompts (only the hashes are
    kept: official_prompt_7word_runs.txt says of which files)."""
    lines = (Path(__file__).parent / "official_prompt_7word_runs.txt").read_text().splitlines()
    return {line for line in lines if line and not line.startswith("#")}


def test_prompts_are_ours():
    official = official_run_hashes()
    assert len(official) > 3000  # the whole of the official prompts, not a sample
    ours = words(" ".join(load_rubric(name).text for name in PROTOCOL_RUBRICS))
    runs = [ours[i : i + RUN] for i in range(len(ours) - RUN + 1)]
    shared = [
        " ".join(run)
        for run in runs
        if hashlib.sha256(" ".join(run).encode()).hexdigest()[:12] in official
        and not set(run) <= ANSWER_FORM_WORDS
    ]
    assert not shared
    # the check sees a shared run: the answer form is one (and allowed)
    assert hashlib.sha256(b"caption 1 is better caption 2 is").hexdigest()[:12] in official


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
