"""Pre-flight checks of the world's temptations (docs/synthetic-world.md, "The temptations"), in
seconds: each mechanism does what the paper's text it models says, and at the RL start the rewards
and estimators have something to disagree about.

Two starts: a fixed sample of the demo's SFT policy's rollouts (``data/sft_rollouts.jsonl``, 48
prompts x 8, written by the command in its first line), and a stand-in drawn from the SFT target
distribution (``probe.stand_in_groups``: what the SFT policy is trained to imitate), which follows the
world's code as it changes. The sample is refused once the world's generator version moves on."""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

import pytest

from balcaprl.demo.config import DatasetSettings
from balcaprl.rewards import BCAPSCORE_REWARDS, b_capscore, score_rollout, score_verdict
from balcaprl.synthetic.captioners import (
    base_caption,
    error_probability,
    original_caption,
    salience_order,
)
from balcaprl.synthetic.captions import reference_caption
from balcaprl.synthetic.lexicon import words_of
from balcaprl.synthetic.linguistic import word_budget
from balcaprl.synthetic.oracle import oracle_verdict
from balcaprl.synthetic.parser import parse_caption
from balcaprl.synthetic.probe import Group, load_groups, probe_groups, save_groups, stand_in_groups
from balcaprl.synthetic.scenes import Scene, SceneObject, generate_scenes

DEMO_SCENES = generate_scenes(48, seed=0, spec=DatasetSettings().scene_spec())
FULL_SCENES = generate_scenes(60, seed=7)


@pytest.fixture(scope="module")
def start():
    """48 prompts x 8 rollouts at the demo's SFT start (stand-in), probed with Table 3's Full rewards."""
    return probe_groups(stand_in_groups(DEMO_SCENES, random.Random(0)))


SFT_ROLLOUTS = Path(__file__).parent / "data" / "sft_rollouts.jsonl"


@pytest.fixture(scope="module")
def sft_start():
    """The demo's SFT policy's own rollouts (a fixed sample), probed with Table 3's Full rewards."""
    _, groups = load_groups(SFT_ROLLOUTS)
    assert (len(groups), {len(g.captions) for g in groups}) == (48, {8})
    return probe_groups(groups)


def rewards(scene, caption, reference):
    return score_verdict(oracle_verdict(scene, caption, reference))


# ---------------------------------------------------------------------------------- at the start


def test_a_terse_mode_is_within_reach(start):
    # short captions with nothing false in them: what the length mask's lower bound is there to stop
    assert start.terse_share >= 0.05


def test_the_length_ratio_leaves_the_band_on_both_sides(start):
    # measured: 44% below (long re-captioned references), 2.6% above (the enumerating mode)
    assert start.below_band_share >= 0.05 and start.above_band_share >= 0.02


def test_precision_and_recall_are_two_signals_that_trade_off_with_length(start):
    assert start.precision_recall_corr < 0.5  # the demo's old world: +0.88, one signal
    precision_vs_length, recall_vs_length, _ = start.length_corr
    assert precision_vs_length < -0.2 and recall_vs_length > 0.3  # measured: -0.28 and +0.60


# "Well below" the old world's 0.948: 0.9. The stand-in measures 0.875 and moves only with the code;
# the SFT sample measures 0.858, and another SFT run of the same code moves it by several hundredths
# (docs/synthetic-world.md), so 0.9 leaves that room without letting the old agreement back in.
WELL_BELOW_THE_OLD_AGREEMENT = 0.9


def test_c_gdpo_and_grpo_advantages_differ(start):
    assert start.advantage_corr < WELL_BELOW_THE_OLD_AGREEMENT


def test_precision_share_of_grpo_variance_is_not_balanced(start):
    precision_share, _, _ = start.variance_shares
    assert not 0.25 <= precision_share <= 0.42  # a third each would be balanced
    assert sum(start.variance_shares) == pytest.approx(1.0)


def test_the_probe_counts_hand_checked_groups():
    scene = DEMO_SCENES[0]
    reference = reference_caption(scene, random.Random(1))
    terse = base_caption(scene, random.Random(2), "terse")
    assert len(words_of(terse)) < 0.5 * len(words_of(reference))
    groups = [Group(scene, reference, (reference, reference, terse, reference))]
    probe = probe_groups(groups)
    assert (probe.n_captions, probe.terse_share, probe.below_band_share, probe.above_band_share) == (
        4,
        0.25,
        0.25,
        0.0,
    )
    ratio = (3 + len(words_of(terse)) / len(words_of(reference))) / 4
    assert probe.mean_ratio == pytest.approx(ratio)


def test_the_sft_policy_is_terse_at_times_and_leaves_the_band_on_both_sides(sft_start):
    assert sft_start.terse_share >= 0.02
    assert sft_start.below_band_share >= 0.05 and sft_start.above_band_share >= 0.01


def test_the_sft_policy_trades_precision_for_recall_through_length(sft_start):
    assert sft_start.precision_recall_corr < 0.6  # the old world's SFT policy: +0.88; measured +0.41
    precision_vs_length, recall_vs_length, _ = sft_start.length_corr
    assert precision_vs_length < 0 < recall_vs_length


def test_at_the_sft_start_the_estimators_differ_and_the_spreads_are_not_balanced(sft_start):
    assert sft_start.advantage_corr < WELL_BELOW_THE_OLD_AGREEMENT
    precision_share, recall_share, _ = sft_start.variance_shares
    assert abs(precision_share - 1 / 3) > 0.1
    assert recall_share < precision_share  # recall over long references: the small-spread signal


def test_a_saved_sample_of_another_world_is_refused(tmp_path):
    groups = stand_in_groups(DEMO_SCENES[:2], random.Random(0), rollouts=2)
    path = save_groups(groups, tmp_path / "g.jsonl", command="probe it again")
    header, loaded = load_groups(path)
    assert loaded == groups and header["command"] == "probe it again"
    lines = path.read_text().splitlines()
    path.write_text("\n".join([json.dumps({**json.loads(lines[0]), "generator_version": 1}), *lines[1:]]))
    with pytest.raises(ValueError, match="world version 1.*sample it again \\(probe it again\\)"):
        load_groups(path)


# ------------------------------------------------------------------------------ each mechanism


def test_hard_to_see_shapes_come_last_and_go_wrong_more_often():
    for scene in FULL_SCENES:
        sizes = [o.size for o in salience_order(scene)]
        assert sizes == sorted(sizes, key=["large", "medium", "small"].index)
    big, small = SceneObject("circle", "red", "large", 0, 0), SceneObject("circle", "red", "small", 0, 0)
    assert error_probability(0, big) < error_probability(2, big) < error_probability(2, small)
    # measured: the first shape named is right more often than the last
    first, last = [], []
    for i in range(400):
        scene = DEMO_SCENES[i % len(DEMO_SCENES)]
        parsed = parse_caption(base_caption(scene, random.Random(i), "detailed"), scene)
        objects = [a for a in parsed.assertions if a.kind == "object"]
        first.append(objects[0].visible)
        last.append(objects[-1].visible)
    assert statistics.mean(first) > statistics.mean(last) + 0.1


def test_enumerating_buys_recall_with_precision_and_overloads_the_caption():
    detailed, enumerating, past_twice = [], [], []
    for i, scene in enumerate(DEMO_SCENES):
        reference = reference_caption(scene, random.Random(i))
        detailed.append(rewards(scene, base_caption(scene, random.Random(i), "detailed"), reference))
        caption = base_caption(scene, random.Random(i), "enumerating")
        enumerating.append(rewards(scene, caption, reference))
        past_twice.append(len(words_of(caption)) > 2 * len(words_of(reference)))
    assert statistics.mean(past_twice) >= 0.3  # where tau_u = 2 binds (measured: 18 of 48)
    mean = lambda xs, key: statistics.mean(getattr(x, key) for x in xs)  # noqa: E731
    assert mean(enumerating, "recall") > mean(detailed, "recall") + 0.04  # measured: 0.72 vs 0.67
    # a guess in the shape's own place is wrong on one claim of four (its size, colour or kind), so
    # enumeration costs less precision than when a wrong attribute sank the whole shape (measured
    # 0.81 vs 0.92)
    assert mean(enumerating, "precision") < mean(detailed, "precision") - 0.08
    assert mean(enumerating, "linguistic") < mean(detailed, "linguistic")


def held_out_b_capscore(scene, caption, reference):
    """b-CapScore as the demo's held-out evaluation computes it (evaluation rubric, no length mask)."""
    r = score_rollout(oracle_verdict(scene, caption, reference, "evaluation"), BCAPSCORE_REWARDS)
    return b_capscore(r.precision, r.recall, r.linguistic)


def test_at_evaluation_a_terse_caption_scores_below_a_describing_one():
    # The paper: without length control captions get shorter and DCScore regresses; saying less must
    # cost more recall than it gains precision, for a captioner that sees the shapes (the base
    # captioner's detailed mode, its later shapes wrong more often).
    terse, detailed = [], []
    for i, scene in enumerate(DEMO_SCENES):
        reference = reference_caption(scene, random.Random(i))
        for mode, scores in (("terse", terse), ("detailed", detailed)):
            caption = base_caption(scene, random.Random(i), mode)
            scores.append(held_out_b_capscore(scene, caption, reference))
    assert statistics.mean(terse) < statistics.mean(detailed) - 0.15  # measured: 0.47 vs 0.83
    below = sum(t < d for t, d in zip(terse, detailed, strict=True))
    assert below > 0.75 * len(DEMO_SCENES)  # measured: 46 of 48


def test_every_reference_is_within_the_word_budget_and_an_overloaded_caption_is_not():
    rng = random.Random(5)
    for scene in generate_scenes(500, seed=11):
        reference = reference_caption(scene, rng)
        assert len(words_of(reference)) <= word_budget(len(scene.objects)), reference
    scene = DEMO_SCENES[1]
    reference = reference_caption(scene, random.Random(0))
    sentences = [s.strip() + "." for s in reference.split(".") if s.strip()]
    padded = " ".join(sentences + sentences[1:] * 3)  # the same facts, over and over
    verdict = oracle_verdict(scene, padded, reference)
    assert "overloaded caption" in verdict.explanation and verdict.clarity < 10


def test_the_original_reference_is_weaker_and_the_oracle_decomposes_all_of_it():
    scene = Scene(
        "s", (SceneObject("circle", "red", "large", 0, 0), SceneObject("star", "blue", "small", 2, 2))
    )
    # an original caption with an error (the star is blue) and commentary nobody can point at
    original = (
        "The image shows two shapes on a plain white background. A large red circle sits in the top left "
        "corner. There is a small green star in the bottom right corner. The layout is visually pleasing."
    )
    verdict = oracle_verdict(scene, "A small green star sits in the bottom right corner.", original)
    covered = {a.text for a in verdict.reference_assertions if a.covered}
    assert "there is a green shape at the bottom right" in covered  # it repeats the reference's error
    assert any("pleasing" in a.text for a in verdict.reference_assertions)  # commentary is decomposed too
    r = score_verdict(verdict)
    assert r.precision < 1.0  # ... and it is still false of the image
    # the original annotator's captions: shorter, less complete and less true than the re-captioned ones
    orig, recap = [], []
    for i, s in enumerate(DEMO_SCENES):
        recap_ref = reference_caption(s, random.Random(i))
        orig.append(rewards(s, original_caption(s, random.Random(i)), recap_ref))
        recap.append(rewards(s, recap_ref, recap_ref))
    assert (
        statistics.mean(x.recall for x in orig) < 0.85 and statistics.mean(x.precision for x in orig) < 0.95
    )


def test_the_probe_command_samples_groups_from_a_policy(tiny_dataset, tmp_path):
    from typer.testing import CliRunner

    from balcaprl.cli import app
    from balcaprl.data.format import read_split_rows
    from balcaprl.synthetic.probe import policy_groups

    runner = CliRunner()
    policy = tmp_path / "policy"
    assert runner.invoke(app, ["synthetic", "init-policy", "--out", str(policy)]).exit_code == 0
    groups = policy_groups(policy, tiny_dataset, prompts=2, rollouts=3, max_new_tokens=6)
    rows = read_split_rows(tiny_dataset, "train")[:2]
    assert [g.scene.id for g in groups] == [r["id"] for r in rows]
    assert [g.reference for g in groups] == [r["reference"] for r in rows]
    assert [len(g.captions) for g in groups] == [3, 3]
    args = ["synthetic", "probe", "--policy", str(policy), "--data", str(tiny_dataset)]
    result = runner.invoke(app, [*args, "--prompts", "2", "--rollouts", "3", "--max-new-tokens", "6"])
    assert result.exit_code == 0, result.output
    assert "6 captions (2 x 3)" in result.output and "advantage correlation" in result.output
