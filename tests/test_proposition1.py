"""Proposition 1 of the paper as property tests.

With the competing rollouts fixed, vanilla GRPO's advantage of rollout 1 depends on its reward vector
only through the weighted sum, so it is invariant along the weighted-sum hyperplane; c-GDPO's is not
(for non-degenerate competitors)."""

import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from balcaprl import c_gdpo_advantages, grpo_advantages
from balcaprl.advantages import decoupled_group_advantages

unit = st.floats(0.0, 1.0, allow_nan=False)


@st.composite
def settings_(draw):
    g = draw(st.integers(3, 8))
    k = draw(st.integers(2, 5))
    weights = draw(st.lists(st.floats(0.05, 1.0), min_size=k, max_size=k))
    competitors = draw(st.lists(st.lists(unit, min_size=k, max_size=k), min_size=g - 1, max_size=g - 1))
    r1 = draw(st.lists(unit, min_size=k, max_size=k))
    return (
        torch.tensor(weights, dtype=torch.float64),
        torch.tensor(competitors, dtype=torch.float64),
        torch.tensor(r1, dtype=torch.float64),
    )


def along_hyperplane(weights, r1, p, q, steps):
    """Points r1 + t * v with v in the (p, q) plane and w . v = 0: same weighted sum as r1."""
    v = torch.zeros_like(r1)
    v[p], v[q] = weights[q], -weights[p]
    return [r1 + t * v for t in steps]


def advantage_of_first(fn, r1, competitors, weights):
    rewards = torch.cat([r1[None], competitors])
    return fn(rewards, torch.zeros(len(rewards), dtype=torch.long), weights)[0].item()


@settings(max_examples=150, deadline=None)
@given(settings_(), st.floats(-2.0, 2.0))
def test_grpo_is_invariant_on_the_weighted_sum_hyperplane(setup, t):
    weights, competitors, r1 = setup
    (moved,) = along_hyperplane(weights, r1, 0, 1, [t])
    assert torch.dot(weights, moved) - torch.dot(weights, r1) < 1e-12
    a = advantage_of_first(grpo_advantages, r1, competitors, weights)
    b = advantage_of_first(grpo_advantages, moved, competitors, weights)
    assert abs(a - b) < 1e-9


@settings(max_examples=150, deadline=None)
@given(settings_())
def test_c_gdpo_is_not_invariant_on_the_hyperplane(setup):
    weights, competitors, r1 = setup
    # Non-degenerate competitors in the two moved dimensions (the proposition's assumption).
    assume(competitors[:, 0].std() > 0.05 and competitors[:, 1].std() > 0.05)
    points = along_hyperplane(weights, r1, 0, 1, [-0.4, -0.2, 0.2, 0.4])
    grpo = [advantage_of_first(grpo_advantages, p, competitors, weights) for p in points]
    assert max(grpo) - min(grpo) < 1e-9
    for fn in (decoupled_group_advantages, c_gdpo_advantages):
        values = [advantage_of_first(fn, p, competitors, weights) for p in points]
        # Differences scale with the weights; far above float64 noise (1e-15) means "not invariant".
        assert (max(values) - min(values)) / weights.max() > 1e-6, fn.__name__


def test_c_gdpo_depends_on_each_coordinate_separately():
    # Eq. 2.5 is sum_k w_k f_k(r_1k): changing r_1a moves only f_a. Check additivity numerically.
    competitors = torch.tensor([[0.2, 0.85], [0.82, 0.18]], dtype=torch.float64)
    weights = torch.tensor([0.5, 0.5], dtype=torch.float64)

    def a1(x, y):
        return advantage_of_first(
            decoupled_group_advantages, torch.tensor([x, y], dtype=torch.float64), competitors, weights
        )

    # f_a(x) + f_b(y) structure: a1(x1,y1) - a1(x2,y1) == a1(x1,y2) - a1(x2,y2).
    assert abs((a1(0.3, 0.1) - a1(0.7, 0.1)) - (a1(0.3, 0.9) - a1(0.7, 0.9))) < 1e-12

    # GRPO lacks it: the same difference depends on the other coordinate.
    def g1(x, y):
        return advantage_of_first(
            grpo_advantages, torch.tensor([x, y], dtype=torch.float64), competitors, weights
        )

    assert abs((g1(0.3, 0.1) - g1(0.7, 0.1)) - (g1(0.3, 0.9) - g1(0.7, 0.9))) > 1e-2
