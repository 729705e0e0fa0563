"""The oracle reads claims as the paper's judge prompt asks (docs/synthetic-world.md, "How the oracle
reads a caption"): an object that is not in the image fails visual verification with every claim made
about it; a re-description of a shape that is there is a repeat; counts and relations are checked
against the scene. Hand-computed cases, then properties over random scenes and captions."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from balcaprl.demo.config import DatasetSettings
from balcaprl.rewards import score_verdict
from balcaprl.synthetic import lexicon as lx
from balcaprl.synthetic.captioners import base_caption
from balcaprl.synthetic.captions import reference_caption
from balcaprl.synthetic.oracle import oracle_verdict
from balcaprl.synthetic.parser import parse_caption
from balcaprl.synthetic.scenes import Scene, SceneObject, SceneSpec, generate_scene

# The issue's two-shape scene: a large red circle at the top right, a small blue square at the bottom left.
TWO = Scene(
    "two", (SceneObject("circle", "red", "large", 0, 2), SceneObject("square", "blue", "small", 2, 0))
)
TWO_REFERENCE = (
    "The image shows two shapes. A large red circle sits in the top right corner. A small blue square "
    "sits in the bottom left corner. The red circle is to the right of the blue square."
)
# 10 claims, all true: the count, 4 for each placed shape (there, size, colour, kind), the relation
TWO_CAPTION = (
    "There are two shapes. A large red circle sits in the top right corner. A small blue square sits in "
    "the bottom left corner. The red circle is to the right of the blue square."
)
YELLOW_GUESS = " A big yellow circle appears in the top right corner."


def scores(scene, caption, reference):
    verdict = oracle_verdict(scene, caption, reference)
    return verdict, score_verdict(verdict)


def test_the_issues_two_shape_scene_scores_the_hallucinated_circle_false_on_every_claim():
    verdict, base = scores(TWO, TWO_CAPTION, TWO_REFERENCE)
    assert (len(verdict.caption_assertions), base.precision, base.recall) == (10, 1.0, 1.0)
    verdict, r = scores(TWO, TWO_CAPTION + YELLOW_GUESS, TWO_REFERENCE)
    # the yellow circle is not in the image: "there is a large yellow circle at the top right", its
    # size, colour and kind, all 4 false. 10 true of 14; the old reading gave 13 of 14 (the cell's
    # "a shape is there", "a large shape is there" and "a circle is there" passed as true repeats)
    guess = [(a.text, a.visible) for a in verdict.caption_assertions[10:]]
    assert guess == [
        ("there is a large yellow circle at the top right", False),
        ("the large yellow circle at the top right is large", False),
        ("the large yellow circle at the top right is yellow", False),
        ("the large yellow circle sits at the top right", False),
    ]
    assert r.precision == pytest.approx(10 / 14)
    assert r.recall == 1.0  # nothing new covered, nothing lost
    # the same guess in an empty cell costs exactly as much: a shape that is not there is not there
    _, empty = scores(TWO, TWO_CAPTION + YELLOW_GUESS.replace("top right", "top left"), TWO_REFERENCE)
    assert empty.precision == pytest.approx(10 / 14)


def test_a_wrong_guess_alone_covers_nothing_of_the_shape_it_displaces():
    # "a big yellow circle" where the large red circle stands says nothing true about the red circle
    verdict, r = scores(TWO, "A big yellow circle appears in the top right corner.", TWO_REFERENCE)
    assert r.precision == 0.0 and r.recall == 0.0
    assert not any(a.covered for a in verdict.reference_assertions)


def test_a_re_description_that_fits_the_shape_there_is_a_repeat():
    again = " A red shape rests in the top right corner."
    verdict, r = scores(TWO, TWO_CAPTION + again, TWO_REFERENCE)
    _, base = scores(TWO, TWO_CAPTION, TWO_REFERENCE)
    # "a shape there" and "a red shape there" said again: true, and charged as repetition
    assert [(a.text, a.visible) for a in verdict.caption_assertions[10:]] == [
        ("there is a shape at the top right", True),
        ("there is a red shape at the top right", True),
    ]
    assert parse_caption(TWO_CAPTION + again, TWO).duplicate_assertions == 2
    assert r.precision == 1.0 and r.linguistic < base.linguistic


def test_a_contradicting_word_or_size_makes_a_different_shape_too():
    for said in (
        "A small red circle sits in the top right corner.",
        "A large red circle reading go sits in the top right corner.",
    ):
        verdict, r = scores(TWO, said, TWO_REFERENCE)
        assert r.precision == 0.0 and not any(a.visible for a in verdict.caption_assertions), said


def test_counts_and_relations_are_checked_against_the_scene():
    verdict, _ = scores(
        TWO,
        "There are three shapes. There is one circle. The red circle is to the left of the blue square. "
        "The blue square is below the red circle.",
        TWO_REFERENCE,
    )
    judged = {a.text: a.visible for a in verdict.caption_assertions}
    assert judged["there are three shapes"] is False
    assert judged["there is one circle"] is True
    assert judged["the red circle is to the left of the blue square"] is False
    assert judged["the blue square is below the red circle"] is True


def test_a_reference_that_names_a_phantom_reads_back_to_the_same_claims():
    """The judge client's cached-reference mode sends the reference's claim texts as the reference."""
    flawed = TWO_REFERENCE + YELLOW_GUESS
    verdict = oracle_verdict(TWO, TWO_CAPTION + YELLOW_GUESS, flawed)
    joined = " . ".join(a.text for a in verdict.reference_assertions)
    again = oracle_verdict(TWO, TWO_CAPTION + YELLOW_GUESS, joined)
    assert [(a.text, a.covered) for a in again.reference_assertions] == [
        (a.text, a.covered) for a in verdict.reference_assertions
    ]
    # repeating the reference's mistake covers it (as the "w/o recap" row needs), and is still false
    assert all(a.covered for a in verdict.reference_assertions)
    assert score_verdict(verdict).precision == pytest.approx(10 / 14)


# ------------------------------------------------------------------------------------- properties
DEMO_SPEC = DatasetSettings().scene_spec()
WHERE = {cell: f"at the {name}" for cell, name in lx.CELL_NAMES.items()}


@st.composite
def captioned_scenes(draw):
    """A scene of the demo's or the full world, its reference, and a caption of the base captioner
    (any mode: some of its claims are false, some true)."""
    spec = draw(st.sampled_from([DEMO_SPEC, SceneSpec()]))
    seed = draw(st.integers(0, 10**6))
    scene = generate_scene(random.Random(seed), "p", spec)
    mode = draw(st.sampled_from(["detailed", "terse", "enumerating"]))
    caption = base_caption(scene, random.Random(seed + 1), mode)
    return scene, reference_caption(scene, random.Random(seed + 2)), caption


@st.composite
def hallucinated_shapes(draw, scene: Scene):
    """A sentence placing a shape the image does not hold: in an empty cell, or in an occupied one
    with at least one of size, colour, kind contradicting the shape there."""
    cell = draw(st.sampled_from(sorted(lx.CELL_NAMES)))
    there = next((o for o in scene.objects if o.cell == cell), None)
    size = draw(st.sampled_from(lx.SIZES))
    color = draw(st.sampled_from(lx.COLORS))
    kind = draw(st.sampled_from(lx.KINDS))
    if there is not None and (size, color, kind) == (there.size, there.color, there.kind):
        color = next(c for c in lx.COLORS if c != there.color)
    return f" A {size} {color} {kind} sits {WHERE[cell]}."


@st.composite
def false_claims(draw, scene: Scene):
    """A sentence of one false claim: a wrong count, a wrong background, a relation that does not hold."""
    n = len(scene.objects)
    choices = [
        f" There are {lx.number_word(draw(st.sampled_from([k for k in range(2, 10) if k != n])))} shapes."
    ]
    choices.append(f" The background is {next(t for t in lx.TEXTURES if t != scene.texture)}.")
    a, b = scene.objects[0], scene.objects[1]
    if a.col != b.col:  # "a is right of b" is false when a is left of b, and the reverse
        side = "right" if a.col < b.col else "left"
        choices.append(f" The {a.color} {a.kind} is to the {side} of the {b.color} {b.kind}.")
    return draw(st.sampled_from(choices))


PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def with_sentence(scene, reference, caption, extra):
    """The scores before and after ``extra`` is appended, and the claims it added."""
    verdict_before, before = scores(scene, caption, reference)
    verdict, after = scores(scene, caption + extra, reference)
    return before, after, verdict.caption_assertions[len(verdict_before.caption_assertions) :]


@PROPERTY
@given(st.data())
def test_a_hallucinated_shape_never_raises_precision_or_recall(data):
    scene, reference, caption = data.draw(captioned_scenes())
    extra = data.draw(hallucinated_shapes(scene))
    before, after, added = with_sentence(scene, reference, caption, extra)
    assert after.precision <= before.precision, extra
    assert after.recall <= before.recall, extra
    assert added and not any(a.visible for a in added), extra  # every claim about it fails


@PROPERTY
@given(st.data())
def test_a_false_claim_never_raises_precision(data):
    scene, reference, caption = data.draw(captioned_scenes())
    extra = data.draw(false_claims(scene))
    before, after, added = with_sentence(scene, reference, caption, extra)
    # A relation naming a shape the caption has not introduced also claims that shape is there (true
    # when it is), as the paper's judge splits "the orange cross is right of the hexagon"; that
    # sentence is not all false, so it is not the case this property is about.
    assume(not any(a.visible for a in added))
    assert after.precision <= before.precision, extra


def test_a_relation_naming_an_unintroduced_shape_also_claims_the_shape_is_there():
    """The case hypothesis found: the orange cross, never named by the caption, is there (true); the
    relation is false. One true claim and one false one, so precision may rise from below 1/2."""
    scene = Scene(
        "rel", (SceneObject("cross", "orange", "large", 0, 1), SceneObject("hexagon", "blue", "large", 0, 2))
    )
    caption = "A big blue hexagon is in the upper right corner."
    verdict, _ = scores(scene, caption + " The orange cross is to the right of the blue hexagon.", caption)
    added = [(a.visible) for a in verdict.caption_assertions[4:]]
    assert sorted(added) == [False, True]


@PROPERTY
@given(st.data())
def test_a_correct_caption_that_gains_a_wrong_sentence_loses_precision(data):
    scene, reference, _ = data.draw(captioned_scenes())
    correct = reference_caption(scene, random.Random(data.draw(st.integers(0, 1000))))
    _, before = scores(scene, correct, reference)
    assert before.precision == 1.0
    extra = data.draw(st.one_of(hallucinated_shapes(scene), false_claims(scene)))
    _, after = scores(scene, correct + extra, reference)
    assert after.precision < before.precision, extra
