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


# -- score_rollout: the one place a verdict becomes a rollout's record ---------------------------------

LINGUISTIC = (9 / 9 + 0 / 9 + 6 / 9) / 3  # clarity 10, fluency 1, coherency 7 of verdict()


def rewards(mode="mask", pointability=True, tau_low=0.5, tau_high=2.0, strength=1.0):
    from balcaprl.rewards import LengthControlConfig, RewardConfig

    length = LengthControlConfig(mode=mode, tau_low=tau_low, tau_high=tau_high, linear_strength=strength)
    return RewardConfig(pointability=pointability, length=length)


@pytest.mark.parametrize(
    ("caption_tokens", "in_band"),
    [(10, True), (5, True), (20, True), (4, False), (21, False), (1, False), (100, False)],
)
def test_score_rollout_masks_linguistic_outside_the_inclusive_band(caption_tokens, in_band):
    from balcaprl.rewards import score_rollout

    s = score_rollout(verdict(), rewards(), caption_tokens, 10)  # band [5, 20] tokens, bounds included
    assert (s.precision, s.recall) == (pytest.approx(1 / 4), pytest.approx(2 / 3))
    assert s.linguistic_raw == pytest.approx(LINGUISTIC)
    assert s.linguistic == (pytest.approx(LINGUISTIC) if in_band else 0.0)
    assert s.masked is (not in_band) and s.in_band is in_band
    assert s.length_ratio == pytest.approx(caption_tokens / 10) and s.length_penalty == 0.0
    assert s.as_tuple() == (s.precision, s.recall, s.linguistic)
    assert (s.non_pointable_share, s.non_visible_share) == (pytest.approx(2 / 4), pytest.approx(1 / 2))


def test_score_rollout_follows_the_pointability_rule():
    from balcaprl.rewards import score_rollout

    assert score_rollout(verdict(), rewards(pointability=True), 10, 10).precision == pytest.approx(1 / 4)
    # 'w/o pointability': every visible assertion counts, meta-commentary included
    assert score_rollout(verdict(), rewards(pointability=False), 10, 10).precision == pytest.approx(2 / 4)


def test_score_rollout_linear_and_none_leave_linguistic_and_report_the_penalty():
    from balcaprl.rewards import score_rollout

    long = score_rollout(verdict(), rewards("linear", strength=0.5), 30, 10)  # rho 3: d = 3 - 2 = 1
    assert long.linguistic == long.linguistic_raw == pytest.approx(LINGUISTIC) and not long.masked
    assert long.length_penalty == pytest.approx(0.5 * 1.0) and long.in_band is False
    short = score_rollout(verdict(), rewards("linear", strength=2.0), 2, 10)  # rho 0.2: d = 0.5 - 0.2
    assert short.length_penalty == pytest.approx(2.0 * 0.3)
    assert score_rollout(verdict(), rewards("linear"), 20, 10).length_penalty == 0.0  # tau_u itself: in band
    off = score_rollout(verdict(), rewards("none"), 30, 10)
    assert off.linguistic == pytest.approx(LINGUISTIC) and off.length_penalty == 0.0 and not off.masked
    # without token counts: only length mode none, and the length fields say so
    bare = score_rollout(verdict(), rewards("none"))
    assert bare.length_ratio is None and bare.in_band is None and bare.linguistic == pytest.approx(LINGUISTIC)
    with pytest.raises(ValueError, match="needs caption_tokens"):
        score_rollout(verdict(), rewards("mask"))
    with pytest.raises(ValueError, match="ref_len must be > 0"):
        score_rollout(verdict(), rewards("mask"), 3, 0)


def test_the_record_and_its_row_form_round_trip():
    import json
    import math

    from balcaprl.rewards import RolloutRecord, b_capscore, failed_rollout, score_rollout

    judged = score_rollout(verdict(), rewards(), 30, 10, id="row-7", caption="a cat", truncated_input=True)
    assert (judged.id, judged.caption, judged.caption_tokens, judged.reference_tokens) == (
        "row-7",
        "a cat",
        30,
        10,
    )
    assert judged.judged and judged.truncated_input and judged.n_reference_assertions == 3
    assert judged.b_capscore == pytest.approx(
        b_capscore(1 / 4, 2 / 3, LINGUISTIC)
    )  # unmasked: the metric's rule
    assert RolloutRecord.from_row(judged.row()) == judged
    assert list(judged.row()) == [
        f for f in RolloutRecord.__dataclass_fields__
    ]  # one key per field, in order
    failed = failed_rollout("timeout", "x" * 1000, rewards("linear", strength=1.0), 30, 10, id="row-7")
    assert not failed.judged and failed.failure == "timeout" and len(failed.failure_detail) == 300
    assert all(math.isnan(v) for v in failed.as_tuple()) and math.isnan(failed.b_capscore)
    # the length terms are logged for a failed rollout, but the control acts on judged ones only
    assert failed.length_ratio == 3.0 and failed.in_band is False and failed.length_penalty == 0.0
    assert not failed.masked
    # a JSON line turns NaN into null; reading it back gives NaN again, extra keys are ignored
    line = json.loads(json.dumps({k: None if isinstance(v, float) and math.isnan(v) else v
                                  for k, v in failed.row().items()} | {"step": 3, "advantage": 0.0}))  # fmt: skip
    back = RolloutRecord.from_row(line)
    assert math.isnan(back.precision) and back.row().keys() == failed.row().keys()
    assert back.failure == "timeout" and back.caption_tokens == 30
    assert failed_rollout("bad_input", "no image", rewards("mask")).length_ratio is None  # no counts
    # without pointability the judge is not asked about it: the meta share is unknown, not 0
    assert math.isnan(score_rollout(verdict(), rewards(pointability=False), 10, 10).non_pointable_share)


def test_the_metric_rule_is_pointability_on_and_no_length_control():
    from balcaprl.rewards import BCAPSCORE_REWARDS, score_rollout

    assert BCAPSCORE_REWARDS.pointability and BCAPSCORE_REWARDS.length.mode == "none"
    # a training ablation's settings never reach the metric: the same verdict scores the same
    s = score_rollout(verdict(), BCAPSCORE_REWARDS, 100, 10)
    assert (s.precision, s.linguistic, s.masked) == (pytest.approx(1 / 4), pytest.approx(LINGUISTIC), False)


def test_reward_config_json_round_trip_and_errors():
    from balcaprl.errors import ConfigError
    from balcaprl.rewards import RewardConfig, RewardWeights

    config = RewardConfig(
        weights=RewardWeights(precision=0.0, recall=0.5, linguistic=0.25),
        pointability=False,
        length=rewards("linear", tau_low=0.25, tau_high=3.0, strength=0.7).length,
    )
    assert RewardConfig.from_json(config.to_json()) == config
    assert " " not in config.to_json()  # one shell word in a rendered launch command
    with pytest.raises(ConfigError, match=r"length\.tau_hihg: unknown key"):
        RewardConfig.from_json('{"length": {"tau_hihg": 3}}')
    with pytest.raises(ConfigError, match="not JSON"):
        RewardConfig.from_json("{weights")


def test_the_length_band_defaults_are_the_pinned_signatures():
    import inspect

    from balcaprl import mask_linguistic_by_length
    from balcaprl.rewards import TAU_HIGH, TAU_LOW, LengthControlConfig

    parameters = inspect.signature(mask_linguistic_by_length).parameters
    assert (
        (parameters["tau_low"].default, parameters["tau_high"].default) == (0.5, 2.0) == (TAU_LOW, TAU_HIGH)
    )
    assert (LengthControlConfig().tau_low, LengthControlConfig().tau_high) == (TAU_LOW, TAU_HIGH)


def test_scoring_a_verdict_does_not_import_torch():
    """The judge, `balcaprl score` and the CLI score verdicts; none of them should pay torch's import."""
    import subprocess
    import sys

    code = (
        "import sys, balcaprl.rewards as r; "
        "v = {'caption_assertions': [{'text': 'a', 'pointable': True, 'visible': True}], "
        "'reference_assertions': [{'text': 'b', 'covered': False}], "
        "'clarity': 10, 'fluency': 10, 'coherency': 1, 'explanation': 'x'}; "
        "s = r.score_rollout(v, r.RewardConfig(), caption_tokens=3, reference_tokens=2); "
        "print(s.as_tuple(), 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == f"({1.0}, {0.0}, {2 / 3}) False"
