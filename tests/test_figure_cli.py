"""`balcaprl figure advantage-collapse`: the files it writes and what they show."""

import csv
from collections import defaultdict

import torch
from PIL import Image
from typer.testing import CliRunner

from balcaprl import grpo_advantages
from balcaprl.advantages import decoupled_group_advantages
from balcaprl.cli import app


def test_help_lists_subcommands():
    result = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "100"})
    assert result.exit_code == 0
    assert "figure" in result.output and "version" in result.output


def test_advantage_collapse_writes_png_and_csv(tmp_path):
    result = CliRunner().invoke(
        app, ["figure", "advantage-collapse", "--out", str(tmp_path), "--grid", "11"], env={"COLUMNS": "100"}
    )
    assert result.exit_code == 0, result.output
    with Image.open(tmp_path / "advantage_collapse.png") as png:
        assert png.format == "PNG" and png.width > 2 * png.height * 0.9  # two panels side by side
    rows = list(csv.DictReader((tmp_path / "advantage_collapse.csv").open()))
    assert list(rows[0]) == ["r1_a", "r1_b", "grpo", "c_gdpo"]
    assert len(rows) == 121

    # Spot-check one point against the library called directly.
    row = next(r for r in rows if r["r1_a"] == "0.3" and r["r1_b"] == "0.6")
    rewards = torch.tensor([[0.3, 0.6], [0.20, 0.85], [0.82, 0.18]], dtype=torch.float64)
    group = torch.zeros(3, dtype=torch.long)
    # (the grid's 0.3 is linspace's 0.30000000000000004, hence 1e-12 rather than equality)
    assert abs(float(row["grpo"]) - grpo_advantages(rewards, group, [0.5, 0.5])[0].item()) < 1e-12
    assert (
        abs(float(row["c_gdpo"]) - decoupled_group_advantages(rewards, group, [0.5, 0.5])[0].item()) < 1e-12
    )

    # The figure's message: GRPO is constant along each hyperplane r1_a + r1_b = c; c-GDPO is not.
    by_sum = defaultdict(list)
    for r in rows:
        by_sum[round(float(r["r1_a"]) + float(r["r1_b"]), 6)].append(r)
    lines = [group for group in by_sum.values() if len(group) >= 3]
    assert lines
    for line in lines:
        grpo = [float(r["grpo"]) for r in line]
        assert max(grpo) - min(grpo) < 1e-9
    spread = max(
        max(float(r["c_gdpo"]) for r in line) - min(float(r["c_gdpo"]) for r in line) for line in lines
    )
    assert spread > 0.1
