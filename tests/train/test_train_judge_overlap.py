"""Judging overlapped with generation on the TRL backend (``balcaprl.train.judge_overlap``).

The tiny policy on CPU, trained twice from the same seed: with the judge's calls started as soon as
the captions exist and without. Same captions, same calls, same rewards, same advantages; with
overlap the calls start before TRL calls the reward functions; both runs log the judge's share of
the step (``judge/wall_s``, ``judge/exposed_s``).
"""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch
from train_testkit import ScriptedJudge, tiny_recipe_dict

from balcaprl.judge.protocol import JudgeRequest
from balcaprl.recipe import recipe_from_dict
from balcaprl.train.judge_overlap import EarlyJudge, judge_stage_metrics, stamped
from balcaprl.train.metrics import read_jsonl


class WhenCalledJudge(ScriptedJudge):
    """Records, per judge_batch call, whether TRL was inside its reward step when it came."""

    def __init__(self):
        super().__init__(fail_every=3)
        self.in_reward_step = threading.Event()
        self.called_in_reward_step: list[bool] = []

    async def judge_batch(self, requests):
        self.called_in_reward_step.append(self.in_reward_step.is_set())
        return await super().judge_batch(requests)


def _run(tiny_policy, tiny_dataset, out, overlap: bool):
    from balcaprl.train import build_trainer

    judge = WhenCalledJudge()
    recipe = recipe_from_dict(
        tiny_recipe_dict(tiny_policy, tiny_dataset, out, train={"judge_overlap": overlap})
    )
    trainer = build_trainer(recipe, judge)
    batches = []
    score, rewards_step = trainer._generate_and_score_completions, trainer._calculate_rewards

    def recording(inputs):
        output = score(inputs)
        batches.append(
            {
                "captions": [r.caption for r in trainer.scorer.last_batch.rollouts],
                "rewards": trainer._gathered_rewards.clone(),
                "advantages": output["advantages"].clone(),
            }
        )
        return output

    def in_reward_step(*args, **kwargs):
        judge.in_reward_step.set()
        try:
            return rewards_step(*args, **kwargs)
        finally:
            judge.in_reward_step.clear()

    trainer._generate_and_score_completions = recording
    trainer._calculate_rewards = in_reward_step
    trainer.train()
    return {"judge": judge, "trainer": trainer, "batches": batches, "out": out}


@pytest.fixture(scope="module")
def runs(tiny_policy, tiny_dataset, tmp_path_factory):
    return {
        overlap: _run(tiny_policy, tiny_dataset, tmp_path_factory.mktemp(f"overlap-{overlap}"), overlap)
        for overlap in (True, False)
    }


def test_overlap_starts_the_calls_before_the_reward_step(runs):
    assert isinstance(runs[True]["trainer"].scorer.judge, EarlyJudge)
    assert runs[True]["judge"].called_in_reward_step == [False, False, False]
    assert runs[False]["judge"].called_in_reward_step == [True, True, True]


def test_same_calls_rewards_and_advantages_with_and_without_overlap(runs):
    on, off = runs[True], runs[False]
    assert on["judge"].calls == off["judge"].calls == 3  # one batch of calls per step, none twice
    assert [r.caption for r in on["judge"].requests] == [r.caption for r in off["judge"].requests]
    assert len(on["batches"]) == len(off["batches"]) == 3
    for a, b in zip(on["batches"], off["batches"], strict=True):
        assert a["captions"] == b["captions"]
        assert torch.equal(a["rewards"].nan_to_num(-1.0), b["rewards"].nan_to_num(-1.0))
        assert torch.equal(a["advantages"], b["advantages"])
    assert any(torch.isnan(a["rewards"]).any() for a in on["batches"])  # failures (NaN) travel alike


def test_usage_is_counted_in_the_step_that_used_the_calls(runs):
    for overlap in (True, False):
        steps = [r for r in read_jsonl(runs[overlap]["out"] / "metrics.jsonl") if r["kind"] == "step"]
        tokens = [s["judge/usage/prompt_tokens"] for s in steps]
        assert all(t > 0 for t in tokens), (overlap, tokens)
    on = [r for r in read_jsonl(runs[True]["out"] / "metrics.jsonl") if r["kind"] == "step"]
    off = [r for r in read_jsonl(runs[False]["out"] / "metrics.jsonl") if r["kind"] == "step"]
    assert [s["judge/usage/prompt_tokens"] for s in on] == [s["judge/usage/prompt_tokens"] for s in off]


def test_both_schedules_log_the_judges_share_of_the_step(runs):
    for overlap in (True, False):
        steps = [r for r in read_jsonl(runs[overlap]["out"] / "metrics.jsonl") if r["kind"] == "step"]
        for step in steps:
            assert 0 <= step["judge/exposed_s"] <= step["judge/wall_s"]


# ---------------------------------------------------------------------------------- EarlyJudge alone


def _requests(*captions: str) -> list[JudgeRequest]:
    return [JudgeRequest(image=f"/img/{c}.png", caption=c, reference="a red door") for c in captions]


def test_early_judge_answers_started_requests_and_judges_the_rest():
    inner = ScriptedJudge(fail_every=None, check_images=False)

    async def go():
        early = EarlyJudge(inner, asyncio.get_running_loop())
        early.start(_requests("a red door", "a door"))
        await asyncio.sleep(0)  # the loop launches the started batch
        await asyncio.sleep(0)
        assert inner.calls == 1
        outcomes = await early.judge_batch(_requests("a door", "blue", "a red door"))
        return early, outcomes

    early, outcomes = asyncio.run(go())
    assert inner.calls == 2  # the started batch, then "blue" alone
    assert [len(r.caption) for r in inner.requests] == [len("a red door"), len("a door"), len("blue")]
    by_caption = {o.verdict.caption_assertions[0].text: o for o in outcomes}
    assert set(by_caption) == {"a", "blue"}  # in the order asked: "a door", "blue", "a red door"
    assert [o.verdict.caption_assertions[-1].text for o in outcomes] == ["door", "blue", "door"]
    assert early.usage()["prompt_tokens"] == inner.usage()["prompt_tokens"]  # both batches, once
    assert early.forget_started() == 0


def test_a_request_started_twice_is_answered_twice_and_unused_ones_are_dropped():
    inner = ScriptedJudge(fail_every=None, check_images=False)

    async def go():
        early = EarlyJudge(inner, asyncio.get_running_loop())
        early.start(_requests("x", "x", "y"))
        first = await early.judge_batch(_requests("x"))
        return early, first

    early, first = asyncio.run(go())
    assert len(first) == 1 and inner.calls == 1
    assert early.forget_started() == 2  # the second "x" and "y" were never asked for


def test_stage_metrics_from_stamps_by_hand():
    rows = [
        {"judge_started_s": 10.0, "judge_finished_s": 12.0},
        {"judge_started_s": 11.0, "judge_finished_s": 15.0},
        {"judge_started_s": 14.0, "judge_finished_s": 14.5},
        {"judge_started_s": float("nan"), "judge_finished_s": float("nan")},  # not stamped
        {},
    ]
    assert judge_stage_metrics(rows) == {"judge/wall_s": 5.0, "judge/exposed_s": 1.0}
    assert judge_stage_metrics([{}]) == {}
    result = stamped({"score": 1.0}, started=5.0)
    assert result["judge_started_s"] == 5.0 and result["judge_finished_s"] >= 5.0
