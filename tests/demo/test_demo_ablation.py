"""The ablation runner's arithmetic on hand-made evaluations: changes from the start over seeds and
scenes, means, and the paper's directions against ``full`` run with the same seeds."""

from __future__ import annotations

import pytest

from balcaprl.demo.ablation import ablation_csv, ablation_markdown, summarise
from balcaprl.demo.pipeline import Evaluation
from balcaprl.demo.report import HeldOut
from balcaprl.demo.variants import VARIANTS

KEYS = (
    "b_capscore",
    "precision",
    "recall",
    "linguistic",
    "tokens",
    "non_pointable_share",
    "non_visible_share",
)


def evaluation(b, tokens, meta=(0.0, 0.0), fluency=(9.0, 9.0)):
    records = [
        {
            "b_capscore": b[i], "precision": b[i], "recall": b[i], "linguistic": 1.0, "tokens": tokens[i],
            "non_pointable_share": meta[i], "non_visible_share": 0.0, "fluency": fluency[i],
        }
        for i in range(2)
    ]  # fmt: skip
    return Evaluation(HeldOut("x", 100 * sum(b) / 2, 0, 0, 0, sum(tokens) / 2, 2), records)


BOOT = {"samples": 400, "level": 0.95, "seed": 0}
BEFORE = evaluation((0.40, 0.50), (40, 50))


def test_changes_from_the_start_average_seeds_and_scenes():
    runs = [evaluation((0.42, 0.52), (44, 54)), evaluation((0.44, 0.54), (46, 56))]
    s = summarise(VARIANTS["full"], runs, BEFORE, runs, BOOT, train_s=12.0)
    assert s.changes["b_capscore"].delta == pytest.approx(3.0)  # (2 + 2 + 4 + 4) / 4, x100
    assert s.changes["linguistic"].delta == 0.0
    assert s.means["tokens"] == pytest.approx(50.0) and s.means["fluency"] == 9.0
    # full's claims are against the start: b-CapScore up and captions longer, in every resample
    assert [(c.label, c.verdict) for c in s.claims] == [
        ("b_capscore > start", "reproduced"),
        ("tokens > start", "reproduced"),
    ]


def test_claims_against_full_pair_seeds_and_say_opposite_or_not_reproduced():
    full = [evaluation((0.42, 0.52), (44, 54)), evaluation((0.44, 0.54), (46, 56))]
    grpo = [evaluation((0.45, 0.55), (44, 54)), evaluation((0.47, 0.57), (46, 57))]
    s = summarise(VARIANTS["grpo"], grpo, BEFORE, full, BOOT, train_s=0.0)
    by_label = {c.label: c for c in s.claims}
    # GRPO scored higher than full in every pair: the paper's "lower" is the opposite here
    assert by_label["b_capscore < full"].interval.delta == pytest.approx(3.0)
    assert by_label["b_capscore < full"].verdict == "opposite"
    # lengths: equal but for one scene of one seed; resamples that miss it give 0, so no direction
    assert by_label["tokens < full"].interval.delta == pytest.approx(0.25)
    assert by_label["tokens < full"].verdict == "not reproduced"
    # without full beside it, claims against full are left out, not invented
    assert summarise(VARIANTS["grpo"], grpo, BEFORE, None, BOOT, 0.0).claims == []
    csv_text = ablation_csv([s])
    assert csv_text.splitlines()[1].startswith("grpo,Table 3 'w/o c-GDPO',2,")
    assert "b_capscore < full: opposite" in csv_text
    before = {k: 0.5 for k in (*KEYS, "fluency")}
    md = ablation_markdown(before, [s], seeds=2, level=0.95, wall_s=60.0)
    assert "| grpo | Table 3 'w/o c-GDPO' | +6.0 [" in md and "| grpo | b_capscore < full |" in md
