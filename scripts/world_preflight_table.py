#!/usr/bin/env python3
"""Measure what the pre-flight checks (tests/synthetic/test_world_temptations.py) hold the world to,
and the free parameter's table (docs/synthetic-world.md, "Pre-flight checks").

    PYTHONPATH=src python scripts/world_preflight_table.py

Prints markdown: for the two RL starts (the stand-in drawn from the SFT targets, and the fixed sample of
the demo's SFT policy's rollouts), each statistic with the threshold its test derives (one rollout per
8 x 8 batch; the noise bound of a pooled within-group correlation; the advantage correlation's 95%
interval over prompts); then the stand-in over a range of the share of flawed SFT targets, a world
parameter no paper statement fixes (the demo's default is 0.5).
"""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path

from balcaprl.demo.config import DatasetSettings
from balcaprl.synthetic.probe import WorldProbe, load_groups, probe_groups, stand_in_groups
from balcaprl.synthetic.scenes import generate_scenes

SAMPLE = Path(__file__).resolve().parents[1] / "tests" / "synthetic" / "data" / "sft_rollouts.jsonl"
SCENES = generate_scenes(48, seed=0, spec=DatasetSettings().scene_spec())


def noise_bound(probe: WorldProbe) -> float:
    return 1.96 / math.sqrt(probe.n_captions - len(set(probe.table.groups.tolist())) - 1)


def row(name: str, probe: WorldProbe) -> str:
    low, high = probe.table.interval(lambda t: t.advantage_corr())
    p_len, r_len, _ = probe.length_corr
    shares = " / ".join(f"{s:.2f}" for s in probe.variance_shares)
    return (
        f"| {name} | {probe.terse_share:.1%} | {probe.below_band_share:.1%} / {probe.above_band_share:.1%} "
        f"| {p_len:+.2f} / {r_len:+.2f} (±{noise_bound(probe):.2f}) | {probe.precision_recall_corr:+.2f} "
        f"| {probe.advantage_corr:.3f} [{low:.3f}, {high:.3f}] | {shares} |"
    )


HEADER = (
    "| start | terse | below / above band | P, R vs length (noise) | P-R corr | c-GDPO vs GRPO corr [95%] "
    "| GRPO variance P / R / L |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
)


def main() -> int:
    print("Thresholds: terse and each side of the band >= 1/64 (one rollout per 8 x 8 batch; the SFT start's")
    print(
        "upper side not required); P below -noise and R above +noise; the correlation's interval below 1.\n"
    )
    print(HEADER)
    print(row("stand-in (SFT targets)", probe_groups(stand_in_groups(SCENES, random.Random(0)))))
    _, groups = load_groups(SAMPLE)
    print(row("SFT policy (fixed sample)", probe_groups(groups)))
    print("\nThe stand-in over the share of flawed SFT targets (free: no paper statement fixes it):\n")
    print(HEADER.replace("| start |", "| flawed share |"))
    for fraction in (0.0, 0.25, 0.5, 0.75):
        probe = probe_groups(stand_in_groups(SCENES, random.Random(0), flawed_fraction=fraction))
        print(row(f"{fraction:g}", probe))
    return 0


if __name__ == "__main__":
    sys.exit(main())
