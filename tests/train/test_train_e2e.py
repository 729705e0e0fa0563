"""End to end through TRL's GRPOTrainer: a tiny random Qwen2.5-VL on CPU, a scripted judge.

Checks what reaches TRL: one judge call per batch, rewards as the judge implies (mask included),
failures as NaN, advantages exactly c_gdpo_advantages (or the GRPO / linear-penalty variants), and the
metrics written to metrics.jsonl.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from train_testkit import ScriptedJudge, tiny_recipe_dict

from balcaprl import c_gdpo_advantages, grpo_advantages, linear_length_penalty
from balcaprl.recipe import recipe_from_dict
from balcaprl.rewards import RolloutRecord
from balcaprl.train.advantages import group_index_from_ids
from balcaprl.train.metrics import read_jsonl

STEP_KEYS = [
    "loss",
    "learning_rate",
    "rewards/precision/mean",
    "rewards/precision/std",
    "rewards/recall/mean",
    "rewards/recall/std",
    "rewards/linguistic/mean",
    "rewards/linguistic/std",
    "rewards/linguistic_unmasked/mean",
    "length/caption_tokens_mean",
    "length/ratio_mean",
    "length/masked_share",
    "length/out_of_band_share",
    "assertions/non_pointable_share",
    "assertions/non_visible_share",
    "judge/calls",
    "judge/requests",
    "judge/failures",
    "judge/failures/timeout",
    "judge/usage/prompt_tokens",
    "judge/usage/cost_usd",
    "advantages/mean",
]


def run_tiny(tiny_policy, tiny_dataset, output_dir, judge, **sections):
    """Train with build_trainer, recording what each generation batch handed to the loss."""
    from balcaprl.train import build_trainer

    recipe = recipe_from_dict(tiny_recipe_dict(tiny_policy, tiny_dataset, output_dir, **sections))
    trainer = build_trainer(recipe, judge)
    batches = []
    original = trainer._generate_and_score_completions

    def recording(inputs):
        output = original(inputs)
        batches.append(
            {
                "ids": [x["id"] for x in inputs],
                "rewards": trainer._gathered_rewards.clone(),
                "advantages": output["advantages"].clone(),
                "rollouts": list(trainer.scorer.last_batch.rollouts),
            }
        )
        return output

    trainer._generate_and_score_completions = recording
    initial = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    trainer.train()
    return trainer, batches, initial


@pytest.fixture(scope="module")
def c_gdpo_run(tiny_policy, tiny_dataset, tmp_path_factory):
    judge = ScriptedJudge(fail_every=3)
    out = tmp_path_factory.mktemp("e2e-run")
    trainer, batches, initial = run_tiny(tiny_policy, tiny_dataset, out, judge)
    return {"judge": judge, "out": out, "trainer": trainer, "batches": batches, "initial": initial}


def test_one_judge_call_per_batch_of_rollouts(c_gdpo_run):
    judge, batches = c_gdpo_run["judge"], c_gdpo_run["batches"]
    assert len(batches) == 3
    assert judge.calls == 3  # precision, recall and linguistic share each verdict
    assert len(judge.requests) == 3 * 8
    assert c_gdpo_run["trainer"].scorer.judge_calls == 3


def requests_of(run, step_index):
    """The judge requests of one generation batch (the judge is called once per batch, in order)."""
    return run["judge"].requests[8 * step_index : 8 * (step_index + 1)]


def test_rewards_are_the_judges_with_failures_as_nan(c_gdpo_run):
    judge = c_gdpo_run["judge"]
    n_failed = 0
    for i, batch in enumerate(c_gdpo_run["batches"]):
        requests = requests_of(c_gdpo_run, i)
        for row, rollout, request in zip(batch["rewards"], batch["rollouts"], requests, strict=True):
            assert request.caption == rollout.caption
            expected = judge.expected(rollout.caption, request.reference)
            if expected is None:
                n_failed += 1
                assert torch.isnan(row).all() and rollout.failure == "timeout"
                continue
            masked_ling = expected.linguistic if 0.5 <= rollout.length_ratio <= 2.0 else 0.0
            torch.testing.assert_close(
                row, torch.tensor([expected.precision, expected.recall, masked_ling]), atol=1e-6, rtol=0
            )
    assert n_failed > 0, "the scripted judge should have failed on some captions"


def test_reference_lengths_are_recounted_with_the_policy_tokenizer(c_gdpo_run):
    for i, batch in enumerate(c_gdpo_run["batches"]):
        for rollout, request in zip(batch["rollouts"], requests_of(c_gdpo_run, i), strict=True):
            # The dataset's column counts characters; the policy's word-level tokenizer counts words.
            assert rollout.reference_tokens == len(request.reference.split()) != len(request.reference)
            assert rollout.caption_tokens == len(rollout.caption.split())


def test_advantages_reaching_the_loss_are_c_gdpo(c_gdpo_run):
    for batch in c_gdpo_run["batches"]:
        groups = group_index_from_ids(batch["ids"])
        assert sorted(torch.bincount(groups).tolist()) == [4, 4]  # 2 prompts x 4 rollouts
        expected = c_gdpo_advantages(batch["rewards"], groups, [0.1, 0.3, 0.3], eps=1e-6)
        torch.testing.assert_close(batch["advantages"], expected, atol=1e-6, rtol=0)
        failed = torch.isnan(batch["rewards"]).all(dim=1)
        assert torch.all(batch["advantages"][failed] == 0)


def test_metrics_jsonl_has_every_step_and_metric(c_gdpo_run):
    records = read_jsonl(c_gdpo_run["out"] / "metrics.jsonl")
    steps = [r for r in records if r["kind"] == "step"]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert records[-1]["kind"] == "summary"
    for record, batch in zip(steps, c_gdpo_run["batches"], strict=True):
        missing = [k for k in STEP_KEYS if k not in record]
        assert not missing, missing
        failures = sum(r.failure is not None for r in batch["rollouts"])
        assert record["judge/failures"] == failures == record["judge/failures/timeout"]
        assert record["judge/calls"] == 1 and record["judge/requests"] == 8
        precision = batch["rewards"][:, 0]
        assert record["rewards/precision/mean"] == pytest.approx(float(precision.nanmean()), abs=1e-6)
        assert record["length/ratio_mean"] == pytest.approx(
            sum(r.length_ratio for r in batch["rollouts"]) / 8, abs=1e-6
        )
        assert record["judge/usage/prompt_tokens"] > 0
    json.dumps(records)  # no NaN/inf leaked into the file


def test_rollout_log_and_checkpoints(c_gdpo_run):
    out = c_gdpo_run["out"]
    rows = read_jsonl(out / "rollouts.jsonl")
    assert len(rows) == 24
    for step, batch in enumerate(c_gdpo_run["batches"], start=1):
        logged = [r["advantage"] for r in rows if r["step"] == step]
        assert logged == pytest.approx(batch["advantages"].tolist(), abs=1e-6)
        # Each line is the rollout's record in its one row form (NaN written as null), plus step/group/advantage.
        read_back = [RolloutRecord.from_row(r) for r in rows if r["step"] == step]
        assert [r.row().keys() for r in read_back] == [r.row().keys() for r in batch["rollouts"]]
        for got, scored in zip(read_back, batch["rollouts"], strict=True):
            assert got.id == scored.id and got.caption == scored.caption and got.failure == scored.failure
            assert got.as_tuple() == pytest.approx(scored.as_tuple(), nan_ok=True)
    assert sorted(p.name for p in out.glob("checkpoint-*")) == [
        "checkpoint-1",
        "checkpoint-2",
        "checkpoint-3",
    ]


def test_the_policy_was_updated(c_gdpo_run):
    trainer, initial = c_gdpo_run["trainer"], c_gdpo_run["initial"]
    changed = [k for k, v in trainer.model.state_dict().items() if not torch.equal(v, initial[k])]
    assert changed, "no parameter moved in 3 optimizer steps"


def test_mask_zeroes_linguistic_outside_the_band(tiny_policy, tiny_dataset, tmp_path):
    judge = ScriptedJudge(fail_every=None)
    _, batches, _ = run_tiny(
        tiny_policy,
        tiny_dataset,
        tmp_path,
        judge,
        rewards={"length": {"mode": "mask", "tau_low": 0.0, "tau_high": 0.3}},
        train={"max_steps": 1},
    )
    rollouts = batches[0]["rollouts"]
    assert any(r.masked for r in rollouts)
    for row, rollout in zip(batches[0]["rewards"], rollouts, strict=True):
        assert rollout.masked == (rollout.length_ratio > 0.3)
        if rollout.masked:
            assert row[2] == 0 and rollout.linguistic_raw > 0
    record = read_jsonl(tmp_path / "metrics.jsonl")[0]
    assert record["length/masked_share"] == pytest.approx(sum(r.masked for r in rollouts) / 8)


def test_grpo_and_linear_length_penalty_switches(tiny_policy, tiny_dataset, tmp_path):
    judge = ScriptedJudge(fail_every=None)
    _, batches, _ = run_tiny(
        tiny_policy,
        tiny_dataset,
        tmp_path,
        judge,
        advantage={"estimator": "grpo"},
        rewards={"length": {"mode": "linear", "tau_low": 0.9, "tau_high": 1.1, "linear_strength": 0.5}},
        train={"max_steps": 1},
    )
    batch = batches[0]
    penalty = torch.tensor(
        [
            linear_length_penalty(r.caption_tokens, r.reference_tokens, 0.9, 1.1, 0.5)
            for r in batch["rollouts"]
        ]
    )
    assert penalty.sum() > 0
    expected = (
        grpo_advantages(batch["rewards"], group_index_from_ids(batch["ids"]), [0.1, 0.3, 0.3]) - penalty
    )
    torch.testing.assert_close(batch["advantages"], expected, atol=1e-6, rtol=0)
    # Linear mode never gates the linguistic reward.
    assert all(r.linguistic == r.linguistic_raw for r in batch["rollouts"])
    assert not math.isnan(batch["advantages"].sum().item())


def test_lora_trains_only_adapters(tiny_policy, tiny_dataset, tmp_path):
    judge = ScriptedJudge(fail_every=None)
    trainer, batches, initial = run_tiny(
        tiny_policy,
        tiny_dataset,
        tmp_path,
        judge,
        model={"lora": {"r": 4, "alpha": 8, "dropout": 0.0}},
        train={"max_steps": 1},
    )
    assert type(trainer.model).__name__.startswith("Peft")
    trainable = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    changed = {k for k, v in trainer.model.state_dict().items() if not torch.equal(v, initial[k])}
    assert changed and all("lora_" in k for k in changed)
    assert (tmp_path / "checkpoint-1" / "adapter_model.safetensors").is_file()
    assert judge.calls == 1 and len(batches) == 1


def test_a_dead_judge_stops_the_trainer_on_the_gathered_batch(tiny_policy, tiny_dataset, tmp_path):
    """Every caption fails: the trainer (not the per-process scorer) stops the run after 2 batches."""
    from balcaprl.train import build_trainer

    recipe = recipe_from_dict(
        tiny_recipe_dict(
            tiny_policy,
            tiny_dataset,
            tmp_path,
            rewards={"max_failed_batches_in_a_row": 2},
            train={"max_steps": 3},
        )
    )
    trainer = build_trainer(recipe, ScriptedJudge(fail_every=1))
    # the trainer's batch step counts gathered batches: one process's share of a batch is not a batch
    assert trainer.batch_step.max_failed_batches_in_a_row == 2 and not hasattr(
        trainer.scorer, "check_failures"
    )
    with pytest.raises(RuntimeError, match="the judge failed on every rollout of 2 batches in a row"):
        trainer.train()


def test_the_run_folder_and_each_checkpoint_carry_balcaprls_model_card(c_gdpo_run):
    out = c_gdpo_run["out"]
    for folder in (out, out / "checkpoint-3"):
        card = (folder / "README.md").read_text()
        assert "[None]" not in card, folder  # TRL's stub, replaced
        assert "| optimizer steps | 3 of 3 |" in card and "from_pretrained" in card
