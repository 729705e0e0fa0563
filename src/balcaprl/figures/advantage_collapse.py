"""Figure 2 of the paper: summed-reward collapse under vanilla GRPO, and what c-GDPO keeps.

G = 3 rollouts, K = 2 rewards with equal weights. Rollouts 2 and 3 are fixed at (0.20, 0.85) and
(0.82, 0.18); rollout 1 sweeps [0, 1]^2. Every grid point is its own group of three; all of them go
through the library's functions in one call (group ids keep them apart).

The c-GDPO panel shows eq. 2.5, the decoupled advantage before the batch step (eq. 2.6). In training
the batch holds hundreds of groups, so eq. 2.6 is a near-constant positive affine map for any one
group and leaves the iso-lines where they are. Applying eq. 2.6 to a batch of this single group
instead would be misleading: along the line where all three decoupled advantages vanish together,
dividing by their tiny batch std turns the map into a step.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import torch

from balcaprl.advantages import decoupled_group_advantages, grpo_advantages
from balcaprl.files import atomic_write_bytes, atomic_write_text
from balcaprl.outputs import ensure_writable_dir

ROLLOUT_2 = (0.20, 0.85)
ROLLOUT_3 = (0.82, 0.18)
WEIGHTS = (0.5, 0.5)


def rollout1_advantages(grid: int = 101) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rollout 1's advantage over a ``grid x grid`` sweep; returns (axis, grpo[b, a], c_gdpo[b, a])."""
    axis = np.linspace(0.0, 1.0, grid)
    r1_b, r1_a = np.meshgrid(axis, axis, indexing="ij")  # row j: r1_b = axis[j]; column i: r1_a = axis[i]
    points = grid * grid
    rewards = torch.empty((points, 3, 2), dtype=torch.float64)
    rewards[:, 0, 0] = torch.from_numpy(r1_a.ravel())
    rewards[:, 0, 1] = torch.from_numpy(r1_b.ravel())
    rewards[:, 1] = torch.tensor(ROLLOUT_2, dtype=torch.float64)
    rewards[:, 2] = torch.tensor(ROLLOUT_3, dtype=torch.float64)
    group = torch.arange(points).repeat_interleave(3)  # one group of three rollouts per grid point
    flat = rewards.reshape(-1, 2)
    grpo = grpo_advantages(flat, group, WEIGHTS).reshape(points, 3)[:, 0]
    c_gdpo = decoupled_group_advantages(flat, group, WEIGHTS).reshape(points, 3)[:, 0]
    return axis, grpo.numpy().reshape(grid, grid), c_gdpo.numpy().reshape(grid, grid)


def _plot(axis: np.ndarray, grpo: np.ndarray, c_gdpo: np.ndarray) -> bytes:
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    limit = float(max(np.abs(grpo).max(), np.abs(c_gdpo).max()))
    fig, panels = plt.subplots(1, 2, figsize=(11, 4.8), constrained_layout=True)
    for panel, values, title in (
        (panels[0], grpo, "Vanilla GRPO: sum, then normalise"),
        (panels[1], c_gdpo, "c-GDPO: normalise each reward, then sum (eq. 2.5)"),
    ):
        image = panel.imshow(
            values,
            origin="lower",
            extent=(0, 1, 0, 1),
            cmap="RdBu_r",
            vmin=-limit,
            vmax=limit,
            aspect="equal",
        )
        lines = panel.contour(
            axis, axis, values, levels=np.linspace(-1.1, 1.1, 12), colors="k", linewidths=0.6, alpha=0.7
        )
        panel.clabel(lines, fmt="%.2f", fontsize=6)
        for point, name in ((ROLLOUT_2, "rollout 2"), (ROLLOUT_3, "rollout 3")):
            panel.plot(*point, marker="*", markersize=14, color="gold", markeredgecolor="k")
            panel.annotate(name, point, textcoords="offset points", xytext=(8, 6), fontsize=9)
        panel.set_title(title)
        panel.set_xlabel("rollout 1, reward a")
        panel.set_ylabel("rollout 1, reward b")
    fig.colorbar(image, ax=panels, label="advantage of rollout 1", shrink=0.9)
    fig.suptitle("Rollout 1's advantage, G = 3, K = 2, equal weights (paper, Figure 2)")
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=130)
    plt.close(fig)
    return buffer.getvalue()


def write_advantage_collapse(out_dir: Path | str, grid: int = 101) -> tuple[Path, Path]:
    """Write ``advantage_collapse.png`` and ``advantage_collapse.csv`` (r1_a, r1_b, grpo, c_gdpo).

    A folder that cannot be written (a file in its path, read-only) is an
    :class:`~balcaprl.errors.OutputError` naming ``--out``, before anything is computed."""
    out = ensure_writable_dir(out_dir, "--out")
    axis, grpo, c_gdpo = rollout1_advantages(grid)
    png, table = out / "advantage_collapse.png", out / "advantage_collapse.csv"
    atomic_write_bytes(png, _plot(axis, grpo, c_gdpo))

    import io

    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(["r1_a", "r1_b", "grpo", "c_gdpo"])
    for j, b in enumerate(axis):
        for i, a in enumerate(axis):
            writer.writerow([f"{a:.6g}", f"{b:.6g}", repr(float(grpo[j, i])), repr(float(c_gdpo[j, i]))])
    atomic_write_text(table, text.getvalue())
    return png, table
