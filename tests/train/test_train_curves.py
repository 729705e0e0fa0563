"""A run's dynamics figure: total reward, advantage spread, loss, clip share, judge failures, and the
held-out b-CapScore before and after RL; and the total reward it plots, hand-computed."""

from __future__ import annotations

import math

import matplotlib
import pytest
import torch

from balcaprl.rewards import RewardConfig, failed_rollout
from balcaprl.train.curves import DYNAMICS, training_dynamics_figure
from balcaprl.train.metrics import batch_metrics

matplotlib.use("Agg")


def test_the_total_reward_is_the_weighted_sum_over_judged_rollouts():
    from dataclasses import replace

    base = failed_rollout("timeout", "", RewardConfig(), 10, 10)
    judged = [replace(base, failure=None, precision=p, recall=r, linguistic=ling, linguistic_raw=ling)
              for p, r, ling in ((1.0, 0.5, 0.0), (0.5, 0.5, 1.0))]  # fmt: skip
    metrics = batch_metrics(
        [*judged, base], ["a", "a", "a"], torch.zeros(3), length_mode="none", weights=(0.5, 0.3, 0.2)
    )
    # (0.5*1 + 0.3*0.5 + 0.2*0) = 0.65, (0.25 + 0.15 + 0.2) = 0.6; the failed rollout is left out
    assert metrics["rewards/total/mean"] == pytest.approx(0.625)
    assert "rewards/total/mean" not in batch_metrics(judged, ["a", "a"], torch.zeros(2), length_mode="none")


def test_every_dynamics_panel_is_drawn_and_the_held_out_change_marked():
    import matplotlib.pyplot as plt

    rows = [{"step": s, "kind": "step", "rewards/total/mean": 0.5 + s / 100, "advantages/std": 0.9,
             "loss": -s / 10, "policy/clipped_share": 0.01, "judge/failures": s % 2} for s in range(1, 11)]  # fmt: skip
    rows[3].pop("rewards/total/mean")  # a later update of a batch: no reward, left out (not drawn as 0)
    figure = training_dynamics_figure(rows, held_out=(52.2, 57.4))
    try:
        axes = figure.axes
        for axis, (key, _) in zip(axes, DYNAMICS, strict=False):
            (line,) = axis.get_lines()
            expected = [r[key] for r in rows if key in r]
            assert list(line.get_ydata()) == expected, key
        marks = axes[len(DYNAMICS)]
        assert [t.get_text() for t in marks.texts] == ["before 52.2", "after 57.4"]
        assert not any(math.isnan(v) for v in axes[0].get_lines()[0].get_ydata())
    finally:
        plt.close(figure)


def test_a_run_without_a_key_says_so_in_its_panel():
    import matplotlib.pyplot as plt

    figure = training_dynamics_figure([{"step": 1, "kind": "step", "loss": 0.5}])
    try:
        assert [t.get_text() for t in figure.axes[0].texts] == ["not logged by this run"]
        assert [t.get_text() for t in figure.axes[len(DYNAMICS)].texts] == [
            "no held-out evaluation in this run"
        ]
    finally:
        plt.close(figure)
