"""``balcaprl figure ...``: the paper's figures."""

from __future__ import annotations

from pathlib import Path

import typer


def advantage_collapse(
    out: Path = typer.Option(..., "--out", help="Folder for advantage_collapse.png and .csv."),
    grid: int = typer.Option(101, min=2, max=1001, help="Grid points per axis over [0, 1]."),
) -> None:
    """Figure 2: rollout 1's advantage under vanilla GRPO (left) and c-GDPO (right)."""
    from balcaprl.figures.advantage_collapse import write_advantage_collapse

    png, csv = write_advantage_collapse(out, grid=grid)
    typer.echo(f"wrote {png}\nwrote {csv}")
