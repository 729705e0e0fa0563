"""Verdict schema validation and verdict -> (precision, recall, linguistic)."""

import copy

import pytest

from balcaprl import Verdict, VerdictError, score_verdict


def verdict(**changes):
    base = {
        "caption_assertions": [
            {"text": "a red door", "pointable": True, "visible": True},  # true positive
            {"text": "a blue car", "pointable": True, "visible": False},  # hallucination
            {"text": "evokes calm", "pointable": False, "visible": True},  # meta-commentary
            {"text": "adds depth", "pointable": False, "visible": False},
        ],
        "reference_assertions": [
            {"text": "a red door", "covered": True},
            {"text": "a cat on the step", "covered": False},
            {"text": "a brick wall", "covered": True},
        ],
        "clarity": 10,
        "fluency": 1,
        "coherency": 7,
        "explanation": "clear but broken grammar",
    }
    base.update(changes)
    return base


def test_hand_computed_rewards():
    r = score_verdict(verdict())
    assert r.precision == pytest.approx(1 / 4)  # |A_G ∩ A_P| / |A|
    assert r.recall == pytest.approx(2 / 3)  # |Q| / |O|
    assert r.linguistic == pytest.approx((9 / 9 + 0 / 9 + 6 / 9) / 3)
    assert (r.n_caption_assertions, r.n_reference_assertions) == (4, 3)
    assert r.non_pointable_share == pytest.approx(2 / 4)
    assert r.non_visible_share == pytest.approx(1 / 2)  # of the 2 pointable, 1 is false


def test_without_pointability_counts_visible_assertions():
    assert score_verdict(verdict(), pointability=False).precision == pytest.approx(2 / 4)


def test_model_and_dict_give_the_same_result():
    assert score_verdict(Verdict.model_validate(verdict())) == score_verdict(verdict())


def test_caption_without_assertions_has_zero_precision():
    r = score_verdict(verdict(caption_assertions=[]))
    assert r.precision == 0.0 and r.non_pointable_share == 0.0 and r.non_visible_share == 0.0


def test_extreme_linguistic_scores_map_to_0_and_1():
    assert score_verdict(verdict(clarity=1, fluency=1, coherency=1)).linguistic == 0.0
    assert score_verdict(verdict(clarity=10, fluency=10, coherency=10)).linguistic == 1.0


def _drop(path):
    v = verdict()
    del v[path]
    return v


def _set(mutator):
    v = copy.deepcopy(verdict())
    mutator(v)
    return v


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        (_drop("clarity"), "clarity"),
        (_drop("reference_assertions"), "reference_assertions"),
        (verdict(fluency=0), "fluency"),
        (verdict(coherency=11), "coherency"),
        (verdict(clarity=8.5), "clarity"),
        (verdict(clarity="8"), "clarity"),
        (verdict(clarity=True), "clarity"),
        (verdict(reference_assertions=[]), "reference_assertions"),
        (
            _set(lambda v: v["caption_assertions"][1].update(pointable="yes")),
            "caption_assertions.1.pointable",
        ),
        (_set(lambda v: v["reference_assertions"][0].update(covered=None)), "reference_assertions.0.covered"),
        (_set(lambda v: v["caption_assertions"][0].update(text="   ")), "caption_assertions.0.text"),
        (_set(lambda v: v["caption_assertions"][0].pop("visible")), "caption_assertions.0.visible"),
        (verdict(is_verified=True), "is_verified"),
        (verdict(caption_assertions="a red door"), "caption_assertions"),
    ],
)
def test_schema_violations_raise_verdict_error_naming_the_field(bad, field):
    with pytest.raises(VerdictError) as info:
        score_verdict(bad)
    assert field in str(info.value)
    assert isinstance(info.value, ValueError)


def test_non_object_verdict_is_rejected():
    with pytest.raises(VerdictError, match="JSON object"):
        score_verdict(["not", "a", "verdict"])


def test_json_schema_is_strict_for_structured_outputs():
    schema = Verdict.model_json_schema()
    assert set(schema["required"]) == {
        "caption_assertions",
        "reference_assertions",
        "clarity",
        "fluency",
        "coherency",
        "explanation",
    }
    assert schema["additionalProperties"] is False
