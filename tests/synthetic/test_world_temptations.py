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
from pathlib import Path

import numpy as np
import pytest

from balcaprl.demo.config import DatasetSettings
from balcaprl.rewards import score_verdict
from balcaprl.synthetic.captioners import (
    base_caption,
    error_probability,
    salience_order,
)
from balcaprl.synthetic.captions import reference_caption
from balcaprl.synthetic.lexicon import words_of
from balcaprl.synthetic.linguistic import word_budget
from balcaprl.synthetic.mechanisms import Direction, measure_mechanisms
from balcaprl.synthetic.oracle import oracle_verdict
from balcaprl.synthetic.probe import (
    ONE_PER_BATCH,
    Group,
    load_groups,
    probe_groups,
    save_groups,
    stand_in_groups,
)
from balcaprl.synthetic.scenes import Scene, SceneObject, generate_scenes

DEMO_SCENES = generate_scenes(48, seed=0, spec=DatasetSettings().scene_spec())
FULL_SCENES = generate_scenes(60, seed=7)


@pytest.fixture(scope="module")
def mechanisms():
    """Each temptation's direction over the demo's scenes, paired (balcaprl.synthetic.mechanisms)."""
    return measure_mechanisms(DEMO_SCENES)


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


# ---------------------------------------------------------------------------------- at the start
# Each check names the paper's statement it holds the world to; its threshold comes from that
# statement or from the arithmetic of the estimate, written before the world it tests was measured.
#
# ONE_PER_BATCH: a mechanism acting on a kind of rollout acts in an average 8 x 8 batch only if that kind
# is at least 1 in 64. A direction the paper states is there only when a within-group correlation is past
# the noise bound 1.96 / sqrt(N - G - 1) on the stated side (WorldProbe.noise_bound).


def noise_bound(probe) -> float:
    return probe.noise_bound


@pytest.fixture(params=["start", "sft_start"])
def each_start(request):
    """The stand-in, then the SFT policy's sample: every check below holds for both."""
    return request.getfixturevalue(request.param)


def test_terse_captions_and_captions_below_the_band_are_within_reach(each_start):
    # Table 4 discussion: without tau_l the policy makes captions short "to over-avoid mistakes"; Sec.
    # 2.3: a linear penalty is worst "when the reference caption has a very different length compared
    # to the policy model's original caption length". The lower bound has something to act on only if
    # such captions are there to sample.
    assert each_start.terse_share >= ONE_PER_BATCH and each_start.below_band_share >= ONE_PER_BATCH


def test_the_stand_in_also_leaves_the_band_above(start):
    # the enumerating mode models captions made long "to increase recall"; tau_u acts only on rollouts
    # past it. Not asked of the SFT policy's start: its captions must grow first (measured 1.3%).
    assert start.above_band_share >= ONE_PER_BATCH


def test_precision_and_recall_trade_off_with_length(each_start):
    # Sec. 2.3: models "could produce excessively long captions ... to increase recall, or conversely
    # aim to maximize precision by reducing caption length": precision falls with length, recall rises
    precision_vs_length, recall_vs_length, _ = each_start.length_corr
    assert precision_vs_length < -noise_bound(each_start) and recall_vs_length > noise_bound(each_start)


def test_c_gdpo_and_grpo_advantages_differ(each_start):
    # Proposition 1: GRPO's advantage sees a rollout only through its summed reward, c-GDPO's does not;
    # the two coincide (correlation 1) only when the rewards' within-group spreads are equal. The paper
    # gives no size for the difference, so the check is that it is there beyond resampling the prompts.
    _, high = each_start.table.interval(lambda t: t.advantage_corr())
    assert high < 1.0
    assert sum(each_start.variance_shares) == pytest.approx(1.0)


def test_failed_checks_names_what_the_checks_above_assert(start, sft_start):
    # one function gives the verdicts of the checks above (the preflight tables' "fails" column)
    assert start.failed_checks() == [] and sft_start.failed_checks(upper_side=False) == []
    scene = DEMO_SCENES[0]
    reference = reference_caption(scene, random.Random(1))
    terse = base_caption(scene, random.Random(2), "terse")
    probe = probe_groups([Group(scene, reference, (reference, reference, terse, reference))])
    failed = probe.failed_checks()  # 1 of 4 terse and below the band, none above; 4 captions
    assert "above" in failed and "terse" not in failed and "below" not in failed
    assert "above" not in probe.failed_checks(upper_side=False)


def test_the_interval_over_prompts_resamples_whole_groups():
    # hand-made table: two groups whose advantages agree exactly, one where they are opposite; the
    # statistic over a resample is the correlation of the rows drawn, whole groups at a time
    from balcaprl.synthetic.probe import ProbeTable

    groups = np.repeat([0, 1, 2], 2)
    adv = np.array([1.0, -1.0, 1.0, -1.0, 1.0, -1.0])
    table = ProbeTable(groups, np.zeros((6, 3)), np.zeros(6), adv, adv * np.array([1, 1, 1, 1, -1, -1]))
    assert table.advantage_corr() == pytest.approx(1 / 3)
    low, high = table.interval(lambda t: t.advantage_corr(), samples=400)
    assert low == pytest.approx(-1.0) and high == pytest.approx(1.0)  # all-opposite and all-agreeing draws


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


def test_hard_to_see_shapes_come_last_and_go_wrong_more_often(mechanisms):
    for scene in FULL_SCENES:
        sizes = [o.size for o in salience_order(scene)]
        assert sizes == sorted(sizes, key=["large", "medium", "small"].index)
    big, small = SceneObject("circle", "red", "large", 0, 0), SceneObject("circle", "red", "small", 0, 0)
    assert error_probability(0, big) < error_probability(2, big) < error_probability(2, small)
    # measured: the first shape named is right more often than the last
    assert mechanisms.directions["first named right"].holds


def test_enumerating_buys_recall_with_precision_and_overloads_the_caption(mechanisms):
    assert mechanisms.enumerating_past_twice >= ONE_PER_BATCH  # where tau_u = 2 binds
    # the paper: captions made long to raise recall, at the cost of hallucination and fluency
    for what in ("recall", "precision", "linguistic"):
        assert mechanisms.directions[f"enumerating {what}"].holds, what


def test_at_evaluation_a_terse_caption_scores_below_a_describing_one(mechanisms):
    # The paper: without length control captions get shorter and DCScore regresses; saying less must
    # cost more recall than it gains precision, for a captioner that sees the shapes (the base
    # captioner's detailed mode, its later shapes wrong more often).
    assert mechanisms.directions["terse below at evaluation"].holds


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


def test_the_original_reference_is_weaker_and_the_oracle_decomposes_all_of_it(mechanisms):
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
    assert "there is a small green star at the bottom right" in covered  # it repeats the reference's error
    assert any("pleasing" in a.text for a in verdict.reference_assertions)  # commentary is decomposed too
    r = score_verdict(verdict)
    assert r.precision < 1.0  # ... and it is still false of the image
    # the original annotator's captions: shorter, less complete and less true than the re-captioned ones
    # (the paper: "higher-quality reference captions provide a more effective recall signal")
    assert mechanisms.directions["recap recall"].holds and mechanisms.directions["recap precision"].holds
    assert mechanisms.failed_checks() == []  # the script's "fails" column says what the checks above say


def test_a_direction_holds_past_1_96_standard_errors_of_the_paired_mean():
    # by hand: differences 1, 1, 1, 0 have mean 0.75, standard deviation 0.5, standard error 0.25
    direction = Direction.of([1, 1, 1, 0], [0, 0, 0, 0])
    assert (direction.mean, direction.se) == pytest.approx((0.75, 0.25)) and direction.holds
    assert not Direction.of([1, 0, 1, 0], [0, 0, 0, 0]).holds  # 0.5 against 1.96 x 0.289
    assert not Direction.of([0, 0, 0, 1], [1, 1, 1, 1]).holds  # the other side


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
