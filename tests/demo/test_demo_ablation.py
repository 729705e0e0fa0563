"""The ablation runner's arithmetic on hand-made evaluations: changes from the start over seeds and
scenes, means, and the paper's directions against ``full`` run with the same seeds."""

from __future__ import annotations

import pytest

from balcaprl.demo.ablation import ablation_csv, ablation_markdown, direction_count, summarise, time_left
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
    s = summarise(VARIANTS["full"], runs, BEFORE, {"full": runs}, BOOT, train_s=12.0)
    assert s.changes["b_capscore"].delta == pytest.approx(3.0)  # (2 + 2 + 4 + 4) / 4, x100
    assert s.changes["linguistic"].delta == 0.0
    assert s.means["tokens"] == pytest.approx(50.0) and s.means["fluency"] == 9.0
    # full's claims are against the start: b-CapScore and recall up and captions longer in every
    # resample; the linguistic score did not move, so that direction is not reproduced
    assert [(c.label, c.verdict) for c in s.claims] == [
        ("b_capscore > start", "reproduced"),
        ("recall > start", "reproduced"),
        ("linguistic > start", "not reproduced"),
        ("tokens > start", "reproduced"),
    ]
    assert direction_count(s.claims).startswith(
        "Directions reproduced: **3 of 4** stated for these rows (0 opposite, 1 not"
    )


def test_claims_against_full_pair_seeds_and_say_opposite_or_not_reproduced():
    full = [evaluation((0.42, 0.52), (44, 54)), evaluation((0.44, 0.54), (46, 56))]
    grpo = [evaluation((0.45, 0.55), (44, 54)), evaluation((0.47, 0.57), (46, 57))]
    s = summarise(VARIANTS["grpo"], grpo, BEFORE, {"full": full}, BOOT, train_s=0.0)
    by_label = {c.label: c for c in s.claims}
    # GRPO scored higher than full in every pair: the paper's "lower" is the opposite here
    assert by_label["b_capscore < full"].interval.delta == pytest.approx(3.0)
    assert by_label["b_capscore < full"].verdict == "opposite"
    # lengths: equal but for one scene of one seed; resamples that miss it give 0, so no direction
    assert by_label["tokens < full"].interval.delta == pytest.approx(0.25)
    assert by_label["tokens < full"].verdict == "not reproduced"
    # without full beside it, claims against full are listed as not run, never given a verdict
    alone = summarise(VARIANTS["grpo"], grpo, BEFORE, {}, BOOT, 0.0).claims
    assert [(c.label, c.verdict) for c in alone if c.baseline == "full"] == [
        ("b_capscore < full", "not run"),
        ("tokens < full", "not run"),
    ]
    assert all(c.interval is None for c in alone if c.baseline == "full")
    assert direction_count(alone).endswith("2 not run: their baseline was not in the run).")
    csv_text = ablation_csv([s])
    assert csv_text.splitlines()[1].startswith("grpo,Table 3 'w/o c-GDPO',2,")
    assert "b_capscore < full: opposite" in csv_text
    before = {k: 0.5 for k in (*KEYS, "fluency")}
    md = ablation_markdown(before, [s], seeds=2, level=0.95, wall_s=60.0)
    assert (
        "| grpo | Table 3 'w/o c-GDPO' | +6.0 [" in md and "| grpo | b_capscore < full | Table 3: 38.0" in md
    )
    assert "Directions reproduced: **" in md and f"of {len(s.claims)}**" in md


def test_a_claim_against_another_variant_pairs_that_variants_seeds():
    # no-recap's "slightly worse than removing the recall reward": compared with no-recall's runs
    no_recall = [evaluation((0.50, 0.60), (40, 50)), evaluation((0.52, 0.62), (40, 50))]
    no_recap = [evaluation((0.45, 0.55), (40, 50)), evaluation((0.47, 0.57), (40, 50))]
    s = summarise(VARIANTS["no-recap"], no_recap, BEFORE, {"no-recall": no_recall}, BOOT, 0.0)
    (vs_no_recall,) = [c for c in s.claims if c.baseline == "no-recall"]
    assert vs_no_recall.interval.delta == pytest.approx(-5.0) and vs_no_recall.verdict == "reproduced"
    assert {c.verdict for c in s.claims if c.baseline == "full"} == {"not run"}


def test_each_seed_is_shown_apart_so_runs_that_fall_into_different_modes_show():
    # two seeds far apart: the interval over seeds and scenes hides it, the per-seed line does not
    runs = [evaluation((0.42, 0.52), (44, 54)), evaluation((0.60, 0.70), (20, 30))]
    s = summarise(VARIANTS["full"], runs, BEFORE, {"full": runs}, BOOT, train_s=0.0)
    assert s.per_seed == [pytest.approx((2.0, 49.0)), pytest.approx((20.0, 25.0))]
    before = {k: 0.5 for k in (*KEYS, "fluency")}
    md = ablation_markdown(before, [s], seeds=3, level=0.95, wall_s=60.0)
    assert "| variant | seed 0 | seed 1 | seed 2 |" in md
    assert "| full | +2.0 (49.0) | +20.0 (25.0) |  |" in md  # a seed not run is left blank


def test_the_time_left_is_the_wall_time_per_run_so_far_times_the_runs_left():
    assert time_left(600.0, 4, 50) == "; about 125 min left"  # 150 s a run, 50 left
    assert time_left(601.0, 4, 1) == "; about 3 min left"  # rounded up: never "0 min" while one runs
    assert time_left(0.0, 0, 54) == ""  # nothing trained yet: nothing to tell from
    assert time_left(600.0, 4, 0) == ""  # the last run is done
