"""The oracle on hand-written captions of each kind, against a hand-made scene."""

from __future__ import annotations

import pytest

from balcaprl.rewards import b_capscore, parse_verdict, score_verdict
from balcaprl.synthetic.oracle import oracle_verdict
from balcaprl.synthetic.parser import parse_caption

# The reference of the hand-made `scene` fixture (tests/synthetic/conftest.py).
REFERENCE = (
    "The image shows four shapes on a striped background. A large red circle with the word go written "
    "on it sits in the top left corner. A small orange circle rests in the top right corner. In the "
    "center, there is a small blue square. A medium green triangle is located in the bottom right corner. "
    "The red circle is to the left of the orange circle. Among them are two circles."
)

CORRECT = REFERENCE.replace("The image shows", "This picture contains").replace("sits in", "can be seen in")


def rewards(scene, caption, reference=REFERENCE, rubric="training"):
    verdict = oracle_verdict(scene, caption, reference, rubric)
    parse_verdict(verdict.model_dump())  # every verdict passes the pinned schema as plain JSON too
    return verdict, score_verdict(verdict)


def by_text(verdict):
    return {a.text: (a.pointable, a.visible) for a in verdict.caption_assertions}


def test_correct_caption_is_fully_right(scene):
    verdict, r = rewards(scene, CORRECT)
    assert (r.precision, r.recall) == (1.0, 1.0)
    assert (verdict.clarity, verdict.fluency, verdict.coherency) == (10, 10, 10)
    texts = by_text(verdict)
    # a placed shape is split into its shortest claims: a shape there, its size, colour, kind, word
    assert texts["there is a shape at the top left"] == (True, True)
    assert texts["there is a large shape at the top left"] == (True, True)
    assert texts["there is a red shape at the top left"] == (True, True)
    assert texts["there is a circle at the top left"] == (True, True)
    assert texts["the shape at the top left shows the word go"] == (True, True)
    assert texts["the red circle is to the left of the orange circle"] == (True, True)
    assert texts["there are two circles"] == (True, True)
    assert texts["the background is striped"] == (True, True)
    assert b_capscore(*r.as_tuple()) == pytest.approx(1.0)


def test_hallucinated_object_and_attributes_are_pointable_but_not_visible(scene):
    caption = (
        "A large red circle sits in the top left corner. A purple star rests at the bottom left. "
        "The blue square is large. The green triangle is at the top center. There are five shapes."
    )
    verdict, r = rewards(scene, caption)
    texts = by_text(verdict)
    # a shape in an empty cell is not in the image: every claim about it fails
    assert texts["there is a purple star at the bottom left"] == (True, False)
    assert texts["the purple star at the bottom left is purple"] == (True, False)
    assert texts["the purple star sits at the bottom left"] == (True, False)
    assert texts["there is a blue square"] == (True, True)  # 'the' introduces it (no place given)
    assert texts["the blue square is large"] == (True, False)  # wrong size
    assert texts["there is a green triangle at the top"] == (True, False)  # placed where it is not
    assert texts["the green triangle at the top is green"] == (True, False)
    assert texts["there are five shapes"] == (True, False)  # wrong count
    assert texts["there is a large shape at the top left"] == (True, True)
    assert r.non_pointable_share == 0.0
    assert len(verdict.caption_assertions) == len(texts) == 13
    # true: the red circle's 4 claims and the blue square's existence; false: 3 + 1 + 3 + 1
    assert r.precision == pytest.approx(5 / 13)
    assert verdict.fluency == 10  # hallucinations can be fluent


def test_meta_commentary_is_not_pointable_and_lowers_precision_only(scene):
    base_verdict, base = rewards(scene, CORRECT)
    meta = CORRECT + " The composition feels balanced and calm. This arrangement evokes a sense of harmony."
    verdict, r = rewards(scene, meta)
    commentary = [a for a in verdict.caption_assertions if not a.pointable]
    assert [a.text for a in commentary] == [
        "the composition feels balanced, calm",
        "this arrangement evokes a sense of harmony",
    ]
    assert r.precision == pytest.approx(
        (len(verdict.caption_assertions) - 2) / len(verdict.caption_assertions)
    )
    assert r.recall == base.recall == 1.0
    assert r.linguistic == base.linguistic  # fluent meta-commentary: only pointability catches it
    assert r.non_pointable_share > 0
    # without the pointability rubric (the paper's ablation) meta-commentary passes
    assert score_verdict(verdict, pointability=False).precision == 1.0


def test_repetition_lowers_linguistic_not_precision(scene):
    sentence = " A small blue square sits in the center."
    verdict, r = rewards(scene, CORRECT + sentence + sentence)
    _, base = rewards(scene, CORRECT)
    assert r.precision == 1.0 and r.recall == 1.0
    assert verdict.clarity < 10 and verdict.coherency < 10
    assert r.linguistic < base.linguistic
    assert "repeated" in verdict.explanation


def test_partial_coverage_gives_the_exact_recall(scene):
    caption = "A large red circle sits in the top left corner."
    verdict, r = rewards(scene, caption)
    covered = [a.text for a in verdict.reference_assertions if a.covered]
    assert covered == [
        "there is a shape at the top left",
        "there is a large shape at the top left",
        "there is a red shape at the top left",
        "there is a circle at the top left",
    ]
    assert r.recall == pytest.approx(4 / len(verdict.reference_assertions))
    assert r.precision == 1.0
    # the count and background, 5 claims for the red circle (its word too), 4 for each other shape,
    # the relation and the count of circles
    assert len(verdict.reference_assertions) == 2 + 5 + 3 * 4 + 1 + 1


def test_recall_does_not_depend_on_wording(scene):
    paraphrase = (
        "Four shapes are scattered across a striped backdrop. In the upper left corner, there is a big red "
        "circle bearing the word go. At the top right lies a small orange circle. A small blue square is "
        "located in the middle. A medium-sized green triangle rests at the bottom right. To the right of "
        "the red circle, you can see the orange circle. The shapes include two circles."
    )
    _, r = rewards(scene, paraphrase)
    assert (r.precision, r.recall) == (1.0, 1.0)


def test_relations_are_checked_both_ways(scene):
    verdict, _ = rewards(
        scene,
        "The orange circle sits to the right of the red circle. The blue square is directly above the red circle.",
    )
    texts = by_text(verdict)
    assert texts["the orange circle is to the right of the red circle"] == (True, True)
    assert texts["the blue square is above the red circle"] == (True, False)


@pytest.mark.parametrize(
    ("phrase", "cell"),
    [
        ("in the middle of the left side", (1, 0)),
        ("at the center of the image", (1, 1)),
        ("in the lower right corner", (2, 2)),
        ("near the top edge", (0, 1)),
        ("at the right edge", (1, 2)),
    ],
)
def test_position_phrases(scene, phrase, cell):
    parsed = parse_caption(f"A small blue square sits {phrase}.", scene)
    (position,) = [a for a in parsed.assertions if a.kind == "position"]
    if cell == (1, 1):  # the small blue square is there: each claim about it is true
        assert position.key == ("position", cell)
        assert all(a.visible for a in parsed.assertions)
    else:  # another shape or none is there: a small blue square that is not in the image
        assert position.key == ("phantom", cell, "small", "blue", "square", None, "position")
        assert not any(a.visible for a in parsed.assertions)


def test_list_style_and_run_on_lower_fluency(scene):
    listed = "1. large red circle, top left, word go. 2. small blue square, center. 3. medium green triangle, bottom right."
    verdict, r = rewards(scene, listed)
    assert r.precision == 1.0
    assert verdict.fluency <= 6 and verdict.coherency <= 7
    run_on = (
        "The image shows four shapes on a striped background and a large red circle sits in the top left corner "
        "and a small orange circle is at the top right and also a small blue square sits in the middle and then a "
        "medium green triangle is in the bottom right corner and the background is striped."
    )
    verdict, r = rewards(scene, run_on)
    assert r.precision == 1.0
    assert verdict.clarity <= 6 and verdict.fluency < 10


def test_agreement_errors_cost_fluency(scene):
    verdict, _ = rewards(scene, "There is a orange circle at the top right. There is two circles.")
    assert verdict.fluency <= 6
    assert "agreement" in verdict.explanation


def test_inference_passes_only_the_evaluation_rubric(scene):
    caption = CORRECT + " The picture looks like a simple computer generated illustration."
    train_verdict, train = rewards(scene, caption, rubric="training")
    eval_verdict, evaluation = rewards(scene, caption, rubric="evaluation")
    assert train.precision < 1.0 and evaluation.precision == 1.0
    assert train_verdict.reference_assertions == eval_verdict.reference_assertions


def test_the_ablation_rubric_judges_no_pointability_and_admits_commentary(scene):
    """Under "training_without_pointability" the oracle, like the prompt, asks nothing about
    pointability: every claim is admitted, `visible` and the reference are judged as in training, so
    commentary the image does not contradict counts (the reward hack the paper's ablation shows)."""
    caption = CORRECT + " The picture looks like a simple computer generated illustration."
    train_verdict, train = rewards(scene, caption, rubric="training")
    ablation, _ = rewards(scene, caption, rubric="training_without_pointability")
    assert not all(a.pointable for a in train_verdict.caption_assertions)
    assert all(a.pointable for a in ablation.caption_assertions)
    assert [(a.text, a.visible) for a in ablation.caption_assertions] == [
        (a.text, a.visible) for a in train_verdict.caption_assertions
    ]
    assert ablation.reference_assertions == train_verdict.reference_assertions
    without = score_verdict(ablation, pointability=False)
    assert without.precision == 1.0 > train.precision


@pytest.mark.parametrize("caption", ["", "   ", "assistant assistant assistant", "red red red of the the"])
def test_degenerate_captions_get_valid_low_verdicts(scene, caption):
    verdict, r = rewards(scene, caption)
    assert r.recall == 0.0
    assert b_capscore(*r.as_tuple()) == 0.0
    assert verdict.clarity <= 3


def test_policy_style_decoding_parses_the_same(scene):
    """The tiny tokenizer decodes to lowercase with spaced hyphens; the oracle does not care."""
    lowered = CORRECT.lower().replace("medium-sized", "medium - sized")
    assert oracle_verdict(scene, lowered, REFERENCE) == oracle_verdict(scene, CORRECT, REFERENCE)


def test_deterministic(scene):
    assert oracle_verdict(scene, CORRECT, REFERENCE) == oracle_verdict(scene, CORRECT, REFERENCE)


def test_assertion_texts_parse_back_to_the_same_facts(scene):
    """The judge client's cached-reference mode sends reference *assertions* as the reference."""
    reference_verdict = oracle_verdict(scene, REFERENCE, REFERENCE)
    joined = " . ".join(a.text for a in reference_verdict.reference_assertions)
    verdict, r = rewards(scene, CORRECT, reference=joined)
    assert [a.text for a in verdict.reference_assertions] == [
        a.text for a in reference_verdict.reference_assertions
    ]
    assert r.recall == 1.0
