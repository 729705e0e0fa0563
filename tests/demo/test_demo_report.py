"""The demo's arithmetic and tables, against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from balcaprl.demo.report import (
    BootstrapInterval,
    HeldOut,
    before_after_rows,
    comparison_csv,
    comparison_markdown,
    comparison_rows,
    direction_verdict,
    moving_average,
    paired_bootstrap,
    seed_scene_bootstrap,
    training_curves_figure,
)


def test_bootstrap_of_a_constant_difference_is_that_difference():
    ci = paired_bootstrap([0.2, 0.5, 0.9], [0.3, 0.6, 1.0], samples=500, scale=100.0)
    assert ci.delta == pytest.approx(10.0)
    assert ci.low == pytest.approx(10.0) and ci.high == pytest.approx(10.0)
    assert ci.excludes_zero


def test_bootstrap_of_two_scenes_spans_their_differences():
    # differences 0 and 1: a resample's mean is 0, 0.5 or 1 with probabilities 1/4, 1/2, 1/4, so the
    # 2.5% and 97.5% quantiles are 0 and 1 and the mean difference is 0.5.
    ci = paired_bootstrap([0.0, 0.0], [0.0, 1.0], samples=4000, seed=1)
    assert ci.delta == pytest.approx(0.5)
    assert (ci.low, ci.high) == (0.0, 1.0)
    assert not ci.excludes_zero


def test_bootstrap_resamples_pairs_not_the_two_arms_separately():
    # Large scene-to-scene spread, identical +1 change on every scene: pairing makes the interval exact.
    before = np.linspace(0, 50, 101)
    ci = paired_bootstrap(before, before + 1, samples=1000)
    assert ci.low == pytest.approx(1.0) and ci.high == pytest.approx(1.0)


def test_bootstrap_matches_a_hand_rolled_resample():
    rng = np.random.default_rng(7)
    before, after = rng.random(50), rng.random(50)
    ci = paired_bootstrap(before, after, samples=2000, seed=3, level=0.9)
    draws = np.random.default_rng(3).integers(0, 50, size=(2000, 50))
    means = (after - before)[draws].mean(axis=1)
    assert ci.low == pytest.approx(np.quantile(means, 0.05))
    assert ci.high == pytest.approx(np.quantile(means, 0.95))
    assert ci.delta == pytest.approx((after - before).mean())


def test_bootstrap_rejects_unpaired_input():
    with pytest.raises(ValueError, match="paired"):
        paired_bootstrap([0.1, 0.2], [0.1])
    with pytest.raises(ValueError, match="no scenes"):
        paired_bootstrap([], [])


def test_moving_average_skips_missing_values():
    assert moving_average([1.0, 3.0, None, 5.0, float("nan"), 7.0], window=2) == [
        1.0,
        2.0,
        2.0,
        4.0,
        4.0,
        6.0,
    ]
    assert math.isnan(moving_average([None, 2.0], 3)[0])


def test_each_rewards_rise_fills_its_own_panel():
    """The demo's rewards rise by about 0.02-0.03 over RL: on one 0-1 axis that was 2% of the height and
    precision lay on recall. Each reward now has an axis scaled to it, titled start -> end."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = 40
    rows = [
        {"kind": "step", "step": s, "rewards/precision/mean": 0.340 + 0.023 * s / n,
         "rewards/recall/mean": 0.338 + 0.028 * s / n, "rewards/linguistic/mean": 0.946 + 0.027 * s / n,
         "length/caption_tokens_mean": 48.0}
        for s in range(1, n + 1)
    ]  # fmt: skip
    figure = training_curves_figure(rows, window=1)
    try:
        panels = {axis.get_title().split(":")[0]: axis for axis in figure.axes if ":" in axis.get_title()}
        assert set(panels) == {"precision", "recall", "linguistic (after length mask)"}
        assert panels["precision"] is not panels["recall"]
        for name, key in (("precision", "precision"), ("recall", "recall"),
                          ("linguistic (after length mask)", "linguistic")):  # fmt: skip
            low, high = panels[name].get_ylim()
            first, last = rows[0][f"rewards/{key}/mean"], rows[-1][f"rewards/{key}/mean"]
            assert low <= first and last <= high
            assert (last - first) / (high - low) > 0.5, name  # the rise is most of the panel's height
        assert panels["recall"].get_title() == "recall: 0.339 -> 0.366 (+0.027)"
    finally:
        plt.close(figure)


def held(label, p, r, ling, b, tokens, **kw):
    return HeldOut(
        label=label, precision=p, recall=r, linguistic=ling, b_capscore=b, mean_tokens=tokens, n=3, **kw
    )


def test_before_after_rows_show_changes_and_the_interval():
    before = held("SFT", 0.5, 0.4, 0.8, 45.25, 40.0)
    after = held("full", 0.625, 0.5, 0.85, 52.0, 44.5)
    ci = BootstrapInterval(delta=6.75, low=2.25, high=11.5, level=0.95, samples=100)
    rows = before_after_rows(before, after, ci)
    assert rows[0] == ["precision", "0.500", "0.625", "+0.125"]
    assert rows[1] == ["recall", "0.400", "0.500", "+0.100"]
    assert rows[2] == ["linguistic", "0.800", "0.850", "+0.050"]
    # 45.25 and 6.75 are exact binary fractions: format() rounds them half to even
    assert rows[3] == ["b-CapScore (x100)", "45.2", "52.0", "+6.8  [+2.2, +11.5]"]
    assert rows[4] == ["mean length (tok.)", "40.0", "44.5", "+4.5"]


def test_comparison_table_markdown_and_csv():
    base = held("SFT", 0.5, 0.4, 0.8, 45.0, 40.0, non_pointable_share=0.1, non_visible_share=0.2, fluency=8.0)
    full = held(
        "full", 0.6, 0.5, 0.9, 55.0, 42.0, non_pointable_share=0.05, non_visible_share=0.1, fluency=9.0
    )
    ci = BootstrapInterval(delta=10.0, low=8.0, high=12.0, level=0.95, samples=100)
    rows = comparison_rows(base, [("full", full, ci, 700)])
    assert [r["variant"] for r in rows] == ["SFT start", "full"]
    md = comparison_markdown(rows).splitlines()
    assert md[0].startswith("| variant | P | R | L | b-CapScore | Δ b-CapScore | 95% CI | tokens")
    assert md[2] == "| SFT start | 0.500 | 0.400 | 0.800 | 45.0 | - |  | 40.0 | 0.100 | 0.200 | 8.00 | 0 |"
    assert (
        md[3]
        == "| full | 0.600 | 0.500 | 0.900 | 55.0 | +10.0 | [+8.0, +12.0] | 42.0 | 0.050 | 0.100 | 9.00 | 700 |"
    )
    csv = comparison_csv(rows).splitlines()
    assert csv[0].split(",")[:5] == ["variant", "precision", "recall", "linguistic", "b_capscore"]
    assert csv[0].endswith("ci_low,ci_high")
    assert csv[2].startswith("full,0.6,0.5,0.9,55.0,10.0,")
    assert csv[2].endswith(",8.0,12.0")
    assert csv[1].endswith(",,")  # no interval for the starting point


def test_seed_scene_bootstrap_of_a_constant_is_that_constant_and_matches_a_hand_rolled_resample():
    constant = seed_scene_bootstrap([[0.5, 0.5, 0.5], [0.5, 0.5, 0.5]], samples=50)
    assert (constant.delta, constant.low, constant.high) == (0.5, 0.5, 0.5)
    d = [[1.0, 2.0, 4.0], [0.0, -1.0, 3.0]]
    got = seed_scene_bootstrap(d, samples=300, seed=4)
    rng = np.random.default_rng(4)
    means = []
    for _ in range(300):  # the loop twin: seeds, then scenes, with replacement
        rows = rng.integers(0, 2, size=2)
        cols = rng.integers(0, 3, size=3)
        means.append(sum(d[r][c] for r in rows for c in cols) / 6)
    assert got.delta == pytest.approx(9 / 6)
    assert (got.low, got.high) == pytest.approx(tuple(np.quantile(means, [0.025, 0.975])))
    with pytest.raises(ValueError, match="seeds x scenes"):
        seed_scene_bootstrap([1.0, 2.0])


def test_direction_verdicts():
    def interval(low, high):
        return BootstrapInterval((low + high) / 2, low, high, 0.95, 100)

    assert direction_verdict(interval(0.1, 0.3), +1) == "reproduced"
    assert direction_verdict(interval(0.1, 0.3), -1) == "opposite"
    assert direction_verdict(interval(-0.3, -0.1), -1) == "reproduced"
    assert direction_verdict(interval(-0.1, 0.3), +1) == "not reproduced"
