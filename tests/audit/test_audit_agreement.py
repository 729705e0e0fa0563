"""Agreement statistics: hand-computed cases, and Kendall's tau-b against a plain double loop."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from balcaprl.judge.audit import (
    cohen_kappa,
    kendall_tau_b,
    mean_abs_diff,
    pairwise_order_agreement,
    pearson,
    spearman,
)
from balcaprl.judge.audit.agreement import ranks


def test_cohen_kappa_by_hand():
    # p_o = 3/4; p_a = 1/2, p_b = 1/4 -> p_e = 1/2 * 1/4 + 1/2 * 3/4 = 1/2; kappa = (3/4 - 1/2) / (1/2) = 1/2
    assert cohen_kappa([1, 1, 0, 0], [1, 0, 0, 0]) == pytest.approx(0.5)
    assert cohen_kappa([1, 0, 1, 0], [1, 0, 1, 0]) == pytest.approx(1.0)
    assert cohen_kappa([1, 0, 1, 0], [0, 1, 0, 1]) == pytest.approx(-1.0)
    assert cohen_kappa([1, 1, 1], [1, 1, 1]) is None  # chance explains all of it: undefined
    assert cohen_kappa([], []) is None
    with pytest.raises(ValueError, match="paired"):
        cohen_kappa([1], [1, 0])


def test_correlations_by_hand():
    assert pearson([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0)
    assert pearson([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert pearson([1, 2, 3], [5, 5, 5]) is None and pearson([1], [2]) is None
    # x = 1, 2, 3, 4; y = 1, 3, 2, 4: r = (sum dx dy) / sqrt(...) = 4 / 5
    assert pearson([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    assert list(ranks([10, 20, 20, 5])) == [2, 3.5, 3.5, 1]
    assert spearman([1, 2, 3, 4], [10, 100, 1000, 10000]) == pytest.approx(1.0)  # monotone, not linear
    assert mean_abs_diff([0.0, 1.0], [0.5, 0.5]) == pytest.approx(0.5)


def brute_tau_b(x, y):
    concordant = discordant = tied_x = tied_y = 0
    pairs = 0
    for i in range(len(x)):
        for j in range(i + 1, len(x)):
            pairs += 1
            dx, dy = x[i] - x[j], y[i] - y[j]
            tied_x += dx == 0
            tied_y += dy == 0
            if dx * dy > 0:
                concordant += 1
            elif dx * dy < 0:
                discordant += 1
    denominator = math.sqrt((pairs - tied_x) * (pairs - tied_y))
    tau = (concordant - discordant) / denominator if denominator else None
    same = concordant / (concordant + discordant) if concordant + discordant else None
    return tau, same


values = st.lists(st.tuples(st.integers(0, 4), st.integers(0, 4)), min_size=0, max_size=40)


@given(values)
def test_kendall_and_pairwise_agreement_match_a_double_loop(pairs):
    x, y = [a for a, _ in pairs], [b for _, b in pairs]
    tau, same = brute_tau_b(x, y)
    assert kendall_tau_b(x, y) == (None if tau is None else pytest.approx(tau))
    assert pairwise_order_agreement(x, y) == (None if same is None else pytest.approx(same))


def test_kendall_over_blocks_equals_one_block():
    import random

    rng = random.Random(0)
    x = [rng.random() for _ in range(1500)]  # more than one block of pairs
    y = [v + rng.gauss(0, 0.3) for v in x]
    tau, same = brute_tau_b(x[:300], y[:300])
    assert kendall_tau_b(x[:300], y[:300]) == pytest.approx(tau)
    assert -1 <= kendall_tau_b(x, y) <= 1 and 0.5 < pairwise_order_agreement(x, y) <= 1
