"""A verdict's marks and scores on a card, worked out by hand."""

from __future__ import annotations

import pytest

from balcaprl.inspect.cards import assertion_status, metric_scores, verdict_fields, word_ratio
from balcaprl.rewards.verdict import CaptionAssertion

# caption: a red door (verified), a purple elephant (hallucinated), a cozy atmosphere (meta, though
# "visible"), a lovely mood (meta, not visible); reference: 1 of 3 covered.
VERDICT = {
    "caption_assertions": [
        {"text": "a red door", "pointable": True, "visible": True},
        {"text": "a purple elephant", "pointable": True, "visible": False},
        {"text": "a cozy atmosphere", "pointable": False, "visible": True},
        {"text": "a lovely mood", "pointable": False, "visible": False},
    ],
    "reference_assertions": [
        {"text": "a red door", "covered": True},
        {"text": "a black cat", "covered": False},
        {"text": "a stone step", "covered": False},
    ],
    "clarity": 10,
    "fluency": 7,
    "coherency": 4,
    "explanation": "fine",
}


@pytest.mark.parametrize(
    ("pointable", "visible", "status"),
    [(True, True, "verified"), (True, False, "hallucinated"), (False, True, "meta"), (False, False, "meta")],
)
def test_assertion_status_truth_table(pointable, visible, status):
    assert assertion_status(CaptionAssertion(text="x", pointable=pointable, visible=visible)) == status


def test_verdict_fields_mark_every_assertion():
    fields = verdict_fields(VERDICT)
    assert fields["ca"] == [
        ["a red door", "verified"],
        ["a purple elephant", "hallucinated"],
        ["a cozy atmosphere", "meta"],
        ["a lovely mood", "meta"],
    ]
    assert fields["ra"] == [["a red door", True], ["a black cat", False], ["a stone step", False]]
    assert (fields["clarity"], fields["fluency"], fields["coherency"]) == (10, 7, 4)
    assert fields["meta"] == pytest.approx(2 / 4)  # not pointable among all caption assertions
    assert fields["halluc"] == pytest.approx(1 / 2)  # not visible among the two pointable ones


def test_metric_scores_by_hand():
    scores = metric_scores(VERDICT)
    precision, recall, linguistic = 1 / 4, 1 / 3, (9 / 9 + 6 / 9 + 3 / 9) / 3
    assert scores["precision"] == pytest.approx(precision)
    assert scores["recall"] == pytest.approx(recall)
    assert scores["linguistic"] == pytest.approx(linguistic) == scores["linguistic_raw"]
    assert scores["b_capscore"] == pytest.approx(3 / (1 / precision + 1 / recall + 1 / linguistic))


def test_word_ratio():
    assert word_ratio("one two three", "a b c d e f") == pytest.approx(0.5)
    assert word_ratio("anything", "   ") is None and word_ratio("anything", None) is None
