"""What a training run did, step by step: total reward, advantage spread, loss, clip share and judge
failures from ``metrics.jsonl``, with the held-out b-CapScore before and after RL marked where the
run has one (a demo run's evaluations). The reward curves per reward are ``demo.report``'s figure;
``balcaprl inspect`` shows both."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

# (metrics.jsonl key, panel title); a key a run did not log leaves its panel saying so.
DYNAMICS = (
    ("rewards/total/mean", "total reward (sum of w_k r_k, judged rollouts)"),
    ("advantages/std", "advantage spread (std over the batch)"),
    ("loss", "policy loss (token-sum, sequence-mean)"),
    ("policy/clipped_share", "clip share (tokens whose ratio was clipped)"),
    ("judge/failures", "judge failures (rollouts left out)"),
)


def training_dynamics_figure(
    metrics: Sequence[Mapping[str, Any]], *, held_out: tuple[float, float] | None = None, title: str = ""
) -> Any:
    """One panel per :data:`DYNAMICS` key over optimizer steps, and a sixth that marks ``held_out``
    (b-CapScore x100 before and after RL) at the first and last step. A step that logged no value (a
    batch's later updates log no rewards) is left out of that curve, not drawn as 0."""
    import matplotlib.pyplot as plt

    rows = [m for m in metrics if m.get("kind", "step") == "step"]
    fig, grid = plt.subplots(2, 3, figsize=(14, 7))
    panels = [axis for row in grid for axis in row]
    for axis, (key, label) in zip(panels, DYNAMICS, strict=False):
        points = [(m["step"], float(m[key])) for m in rows if _finite(m.get(key))]
        axis.set_title(label, fontsize=9)
        axis.set_xlabel("optimizer step", fontsize=8)
        axis.grid(alpha=0.3)
        if not points:
            axis.text(0.5, 0.5, "not logged by this run", ha="center", va="center", transform=axis.transAxes)
            continue
        axis.plot(*zip(*points, strict=True), lw=1.2, marker="." if len(points) < 50 else None)
    marks = panels[len(DYNAMICS)]
    marks.set_title("held-out b-CapScore (x100): before and after RL", fontsize=9)
    marks.grid(alpha=0.3)
    if held_out is None or not rows:
        marks.text(
            0.5,
            0.5,
            "no held-out evaluation in this run",
            ha="center",
            va="center",
            transform=marks.transAxes,
        )
    else:
        first, last = rows[0]["step"], rows[-1]["step"]
        marks.plot([first, last], list(held_out), marker="o", color="black")
        for step, value, what in ((first, held_out[0], "before"), (last, held_out[1], "after")):
            marks.annotate(
                f"{what} {value:.1f}", (step, value), textcoords="offset points", xytext=(4, 6), fontsize=8
            )
        marks.set_xlabel("optimizer step", fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
