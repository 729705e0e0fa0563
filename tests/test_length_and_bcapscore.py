"""Length-conditional masking, the linear length penalty and b-CapScore (one rollout's floats)."""

import math
import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from balcaprl import b_capscore, linear_length_penalty, mask_linguistic_by_length


@pytest.mark.parametrize(
    ("pred", "ref", "kept"),
    [(10, 20, True), (40, 20, True), (20, 20, True), (9, 20, False), (41, 20, False), (1, 20, False)],
)
def test_mask_bounds_are_inclusive(pred, ref, kept):
    assert mask_linguistic_by_length(0.8, pred, ref) == (0.8 if kept else 0.0)


def test_mask_custom_taus_and_types():
    got = [
        mask_linguistic_by_length(ling, pred, 20, 0.5, 1.5)
        for ling, pred in [(0.5, 10), (0.6, 30), (0.7, 31)]
    ]
    assert got == [0.5, 0.6, 0.0] and all(type(v) is float for v in got)
    assert [mask_linguistic_by_length(ling, pred, 20) for ling, pred in [(0.5, 5), (0.6, 20)]] == [0.0, 0.6]


def test_mask_keeps_a_failed_judge_failed_in_range():
    assert math.isnan(mask_linguistic_by_length(math.nan, 20, 20))
    assert mask_linguistic_by_length(math.nan, 100, 20) == 0.0


@pytest.mark.parametrize("ref", [0, -3, 0.0])
def test_non_positive_reference_length_is_an_error(ref):
    with pytest.raises(ValueError, match="ref_len must be > 0"):
        mask_linguistic_by_length(0.5, 10, ref)
    with pytest.raises(ValueError, match="ref_len must be > 0"):
        linear_length_penalty(10, ref, 0.5, 2.0, 1.0)


def test_inverted_taus_are_an_error():
    with pytest.raises(ValueError, match="tau_low"):
        mask_linguistic_by_length(0.5, 10, 10, tau_low=2.0, tau_high=0.5)


@given(st.floats(0, 1), st.integers(0, 500), st.integers(1, 500))
def test_mask_matches_the_case_definition(ling, pred, ref):
    rho = pred / ref
    expected = ling if 0.5 <= rho <= 2.0 else 0.0
    assert mask_linguistic_by_length(ling, pred, ref) == expected
    assert mask_linguistic_by_length(ling, float(pred), float(ref)) == expected


def test_linear_length_penalty_hand_values():
    # rho = 3: 0.5 * (3 - 2) = 0.5;  rho = 0.25: 0.5 * (0.5 - 0.25) = 0.125;  inside: 0.
    assert linear_length_penalty(60, 20, 0.5, 2.0, 0.5) == pytest.approx(0.5)
    assert linear_length_penalty(5, 20, 0.5, 2.0, 0.5) == pytest.approx(0.125)
    assert linear_length_penalty(30, 20, 0.5, 2.0, 0.5) == 0.0
    got = [linear_length_penalty(pred, 20.0, 0.5, 2.0, 2.0) for pred in (60.0, 5.0, 30.0)]
    assert got == pytest.approx([2.0, 0.5, 0.0])
    with pytest.raises(ValueError, match="strength"):
        linear_length_penalty(60, 20, 0.5, 2.0, -1.0)


def test_b_capscore_hand_values():
    assert b_capscore(0.5, 0.5, 0.5) == pytest.approx(0.5)
    assert b_capscore(1.0, 0.5, 0.25) == pytest.approx(3 / 7)  # 3 / (1 + 2 + 4)
    assert b_capscore(0.0, 0.9, 0.9) == 0.0
    assert b_capscore(0.0, 0.0, 0.0) == 0.0
    assert b_capscore(1.0, 1.0, 1.0) == 1.0
    assert b_capscore(5e-324, 1.0, 1.0) == 0.0  # 1/subnormal overflows to inf: the limit, 0
    assert math.isnan(b_capscore(math.nan, 1.0, 1.0))  # a failed judge stays failed


@given(st.floats(0, 1), st.floats(0, 1), st.floats(0, 1))
def test_b_capscore_is_the_harmonic_mean(p, r, g):
    got = b_capscore(p, r, g)
    assert got == pytest.approx(statistics.harmonic_mean([p, r, g]), abs=1e-12)
    assert 0.0 <= got <= 1.0
    if min(p, r, g) > 0:
        assert min(p, r, g) - 1e-12 <= got <= max(p, r, g) + 1e-12
