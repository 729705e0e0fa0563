"""The public reward functions take tensors again, element by element, each element equal to what
the scalar form gives (the foundation's API offered both)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import balcaprl

UNIT = st.floats(0.0, 1.0) | st.sampled_from([0.0, 1.0, 1e-310])  # zeros and a subnormal among them
LENGTH = st.integers(0, 400)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(UNIT, UNIT, UNIT), min_size=1, max_size=12))
def test_b_capscore_of_tensors_is_the_scalar_form_element_by_element(triples):
    p, r, ling = (torch.tensor(column, dtype=torch.float64) for column in zip(*triples, strict=True))
    scores = balcaprl.b_capscore(p, r, ling)
    assert scores.shape == p.shape
    for value, triple in zip(scores.tolist(), triples, strict=True):
        assert value == pytest.approx(balcaprl.b_capscore(*triple), rel=1e-12, abs=0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(UNIT | st.just(math.nan), LENGTH, st.integers(1, 400)), min_size=1, max_size=12))
def test_the_length_mask_of_tensors_is_the_scalar_form_element_by_element(rows):
    ling, pred, ref = (torch.tensor(column, dtype=torch.float64) for column in zip(*rows, strict=True))
    masked = balcaprl.mask_linguistic_by_length(ling, pred, ref)
    for value, row in zip(masked.tolist(), rows, strict=True):
        expected = balcaprl.mask_linguistic_by_length(*row)
        assert (math.isnan(value) and math.isnan(expected)) or value == expected


def test_hand_computed_values_and_a_reference_without_tokens():
    assert balcaprl.b_capscore(torch.tensor([0.5, 0.0]), torch.tensor([1.0, 1.0]), 1.0).tolist() == [
        0.75,
        0.0,
    ]
    gated = balcaprl.mask_linguistic_by_length(
        torch.tensor([0.8, 0.8, 0.8]), torch.tensor([49, 50, 201]), 100
    )
    assert torch.equal(
        gated, torch.tensor([0.0, 0.8, 0.0])
    )  # rho 0.49 out, 0.5 in (inclusive), 2.01 out; float32 kept
    with pytest.raises(ValueError, match="ref_len must be > 0"):
        balcaprl.mask_linguistic_by_length(torch.tensor([0.8]), torch.tensor([5]), torch.tensor([0]))
