"""Stop after k steps, resume, and the run goes on as if it had never stopped (across an epoch boundary)."""

from __future__ import annotations

import pytest
from train_testkit import ScriptedJudge, tiny_recipe_dict

from balcaprl.recipe import recipe_from_dict
from balcaprl.train import train
from balcaprl.train.metrics import read_jsonl

# 4 prompts, 2 per batch: 2 steps per epoch, so 5 steps span three epochs; the stop falls in epoch 1.
SECTIONS = {"data": {"max_samples": 4}, "train": {"max_steps": 5}}


def recipe(tiny_policy, tiny_dataset, out, **train_extra):
    sections = {k: dict(v) for k, v in SECTIONS.items()}
    sections["train"].update(train_extra)
    return recipe_from_dict(tiny_recipe_dict(tiny_policy, tiny_dataset, out, **sections))


def per_step(rows, key):
    steps = sorted({r["step"] for r in rows})
    return {s: [r[key] for r in rows if r["step"] == s] for s in steps}


@pytest.fixture(scope="module")
def runs(tiny_policy, tiny_dataset, tmp_path_factory):
    straight_dir = tmp_path_factory.mktemp("straight")
    straight_judge = ScriptedJudge(fail_every=4)
    straight = train(recipe(tiny_policy, tiny_dataset, straight_dir), straight_judge)

    split_dir = tmp_path_factory.mktemp("split")
    first_judge = ScriptedJudge(fail_every=4)
    first = train(recipe(tiny_policy, tiny_dataset, split_dir, stop_after_step=3), first_judge)
    second_judge = ScriptedJudge(fail_every=4)
    second = train(recipe(tiny_policy, tiny_dataset, split_dir), second_judge, resume=True)
    return {
        "straight": (straight, straight_dir, straight_judge),
        "first": (first, first_judge),
        "second": (second, second_judge),
        "split_dir": split_dir,
    }


def test_stop_after_step_checkpoints_and_stops(runs):
    first, first_judge = runs["first"]
    assert first.global_step == 3 and first.final_model_dir is None
    assert (runs["split_dir"] / "checkpoint-3").is_dir()
    assert first_judge.calls == 3


def test_resume_continues_in_the_same_data_order(runs):
    straight, straight_dir, _ = runs["straight"]
    second, second_judge = runs["second"]
    assert second.global_step == straight.global_step == 5
    assert second.resumed_from.name == "checkpoint-3"
    assert second_judge.calls == 2  # completed steps are not judged again
    a = read_jsonl(straight_dir / "rollouts.jsonl")
    b = read_jsonl(runs["split_dir"] / "rollouts.jsonl")
    assert per_step(a, "id") == per_step(b, "id")
    # Same prompts in the same order across epochs; with the RNG state restored, even the same captions.
    assert per_step(a, "caption") == per_step(b, "caption")
    assert [r["advantage"] for r in a] == pytest.approx([r["advantage"] for r in b], abs=1e-6)


def test_resumed_metrics_read_like_an_uninterrupted_run(runs):
    _, straight_dir, _ = runs["straight"]
    a = [r for r in read_jsonl(straight_dir / "metrics.jsonl") if r["kind"] == "step"]
    b = read_jsonl(runs["split_dir"] / "metrics.jsonl")
    assert [r["step"] for r in b if r["kind"] == "step"] == [1, 2, 3, 4, 5]
    assert sum(r["kind"] == "summary" for r in b) == 1  # the stopped run's summary was dropped
    b = [r for r in b if r["kind"] == "step"]
    for key in (
        "rewards/precision/mean",
        "rewards/recall/mean",
        "learning_rate",
        "loss",
        "length/ratio_mean",
    ):
        assert [r[key] for r in a] == pytest.approx([r[key] for r in b], abs=1e-5), key


def test_a_fresh_run_refuses_to_clobber_and_resume_refuses_another_recipe(runs, tiny_policy, tiny_dataset):
    split_dir = runs["split_dir"]
    with pytest.raises(match="--resume"):
        train(recipe(tiny_policy, tiny_dataset, split_dir), ScriptedJudge())
    changed = recipe_from_dict(
        tiny_recipe_dict(
            tiny_policy, tiny_dataset, split_dir, **SECTIONS, rewards={"weights": {"precision": 0.5}}
        )
    )
    with pytest.raises(match="rewards.weights.precision"):
        train(changed, ScriptedJudge(), resume=True)


def test_resume_without_a_checkpoint_is_an_error(tiny_policy, tiny_dataset, tmp_path):
    with pytest.raises(match="no complete checkpoint"):
        train(recipe(tiny_policy, tiny_dataset, tmp_path), ScriptedJudge(), resume=True)


def test_the_final_policy_carries_balcaprls_model_card(runs):
    straight, _, _ = runs["straight"]
    card = (straight.final_model_dir / "README.md").read_text()
    assert "| optimizer steps | 5 of 5 |" in card
    assert f'from_pretrained("{straight.final_model_dir}")' in card and "[None]" not in card
