"""Three reward functions, one judge call per rollout; failures are None (NaN), never 0; the batch step's
stop rule for a judge that fails on whole batches."""

from __future__ import annotations

import asyncio
import dataclasses
import math

import pytest
from train_testkit import ScriptedJudge

from balcaprl.judge.protocol import JudgeFailure
from balcaprl.rewards import REWARD_NAMES, LengthControlConfig, RewardConfig, linear_length_penalty
from balcaprl.train.advantages import AdvantageStep
from balcaprl.train.judging import JUDGE_EXCEPTION, caption_text, judge_usage
from balcaprl.train.rewards import SharedVerdictScorer
from balcaprl.train.step import BatchStep, reward_table

EOS, PAD = 100, 101
REFERENCE = "a red circle on the left ."  # 7 tokens


def batch(captions, ids=None, image="img.png"):
    n = len(captions)
    completions = [[{"role": "assistant", "content": c}] for c in captions]
    # One fake token id per word, then EOS (and padding) that must not count as caption tokens.
    completion_ids = [[1] * len(c.split()) + [EOS, PAD] for c in captions]
    columns = {
        "id": ids or ["row"] * n,
        "image_path": [image] * n,
        "reference": [REFERENCE] * n,
        "reference_tokens": [7] * n,
    }
    return completions, completion_ids, columns


def _AnyImageJudge(fail_every=3):
    """The scripted judge without the image-file check (these tests send names, not files)."""
    return ScriptedJudge(fail_every=fail_every, check_images=False)


def run_like_trl(scorer, completions, completion_ids, columns):
    """TRL gathers async reward functions with asyncio.gather on one event loop."""

    async def gather():
        return await asyncio.gather(
            *(
                f(prompts=None, completions=completions, completion_ids=completion_ids, **columns)
                for f in scorer.reward_functions()
            )
        )

    return dict(zip(REWARD_NAMES, asyncio.run(gather()), strict=True))


CAPTIONS = [
    "a red circle on the left .",
    "this image shows a red square",
    "blue",
    "a red circle on the left on the left on the left a red circle on the left",
    "green triangle",
]


def test_three_reward_functions_share_one_judge_call():
    judge = _AnyImageJudge(fail_every=None)
    scorer = SharedVerdictScorer(judge, special_token_ids=[EOS, PAD])
    out = run_like_trl(scorer, *batch(CAPTIONS))
    assert judge.calls == 1 and len(judge.requests) == len(CAPTIONS)
    for caption, p, r, ling in zip(CAPTIONS, out["precision"], out["recall"], out["linguistic"], strict=True):
        expected = judge.expected(caption, REFERENCE)
        assert p == pytest.approx(expected.precision) and r == pytest.approx(expected.recall)
        in_band = 0.5 <= len(caption.split()) / 7 <= 2.0
        assert ling == pytest.approx(expected.linguistic if in_band else 0.0)
    # The same functions called one after another (a sync caller) still hit the memo.
    completions, ids, columns = batch(CAPTIONS)
    for f in scorer.reward_functions():
        asyncio.run(f(prompts=None, completions=completions, completion_ids=ids, **columns))
    assert judge.calls == 1
    # A new generation batch is judged again.
    scorer.begin_batch()
    run_like_trl(scorer, *batch(CAPTIONS))
    assert judge.calls == 2 and scorer.judge_calls == 2 and scorer.judge_requests == 2 * len(CAPTIONS)


def test_a_different_batch_is_never_served_from_the_memo():
    judge = _AnyImageJudge(fail_every=None)
    scorer = SharedVerdictScorer(judge)
    run_like_trl(scorer, *batch(CAPTIONS))
    run_like_trl(scorer, *batch(CAPTIONS[:2]))
    assert judge.calls == 2
    assert [r.caption for r in scorer.last_batch.rollouts] == CAPTIONS[:2]


def test_failures_are_none_for_all_three_rewards_never_zero():
    judge = _AnyImageJudge(fail_every=2)
    scorer = SharedVerdictScorer(judge, special_token_ids=[EOS, PAD])
    out = run_like_trl(scorer, *batch(CAPTIONS))
    failed = [judge.fails(c) for c in CAPTIONS]
    assert any(failed) and not all(failed)
    for i, did_fail in enumerate(failed):
        values = [out[name][i] for name in REWARD_NAMES]
        assert (values == [None, None, None]) == did_fail
    rows, _ = reward_table(scorer.last_batch.rollouts)
    assert rows.shape == (len(CAPTIONS), 3)
    assert [bool(row.isnan().all()) for row in rows] == failed
    rollout = next(r for r in scorer.last_batch.rollouts if r.failure)
    assert rollout.failure == "timeout" and not rollout.masked  # the gate is not applied without a verdict


def test_a_text_that_is_no_valid_unicode_is_a_failed_rollout_never_sent():
    # A JSON escape can put a lone surrogate into a dataset's reference: the rollout fails as bad_input
    # (NaN, counted, never 0) naming the text and the row; the judge sees only the other rollouts.
    judge = _AnyImageJudge(fail_every=None)
    scorer = SharedVerdictScorer(judge, special_token_ids=[EOS, PAD])
    completions, completion_ids, columns = batch(CAPTIONS[:3], ids=["r0", "r1", "r2"])
    columns["reference"][1] = "a red \ud800circle on the left ."
    out = run_like_trl(scorer, completions, completion_ids, columns)
    assert [out[name][1] for name in REWARD_NAMES] == [None, None, None]
    assert all(out[name][i] is not None for name in REWARD_NAMES for i in (0, 2))
    rollout = scorer.last_batch.rollouts[1]
    assert rollout.failure == "bad_input" and rollout.failure_detail == (
        "the reference of row 'r1' is not valid Unicode: a lone surrogate U+D800 at character 7"
    )
    assert judge.calls == 1 and [r.caption for r in judge.requests] == [CAPTIONS[0], CAPTIONS[2]]
    rows, _ = reward_table(scorer.last_batch.rollouts)
    assert [bool(row.isnan().all()) for row in rows] == [False, True, False]
    # a batch with nothing to send makes no call at all
    scorer.begin_batch()
    completions, completion_ids, columns = batch(["a red \udfff circle"], ids=["r3"])
    out = run_like_trl(scorer, completions, completion_ids, columns)
    assert out["precision"] == [None] and judge.calls == 1
    assert scorer.last_batch.rollouts[0].failure_detail == (
        "the caption of row 'r3' is not valid Unicode: a lone surrogate U+DFFF at character 7"
    )


def test_a_judge_that_raises_gives_failures_not_rewards():
    class Broken:
        async def judge_batch(self, requests):
            raise ConnectionError("endpoint down")

    scorer = SharedVerdictScorer(Broken())
    out = run_like_trl(scorer, *batch(CAPTIONS[:2]))
    assert out["precision"] == [None, None]
    assert {r.failure for r in scorer.last_batch.rollouts} == {JUDGE_EXCEPTION}
    assert "endpoint down" in scorer.last_batch.rollouts[0].failure_detail


def test_consecutive_fully_failed_batches_stop_the_run():
    scorer = SharedVerdictScorer(_AnyImageJudge(fail_every=1))
    step = BatchStep(AdvantageStep(weights=(0.1, 0.3, 0.3)), max_failed_batches_in_a_row=2)
    run_like_trl(scorer, *batch(CAPTIONS[:2]))
    result = step(scorer.last_batch.rollouts, ["row", "row"])
    assert result.advantages.tolist() == [0.0, 0.0] and step.failed_in_a_row == 1
    scorer.begin_batch()
    run_like_trl(scorer, *batch(CAPTIONS[:2]))
    with pytest.raises(RuntimeError, match="2 batches in a row"):
        step(scorer.last_batch.rollouts, ["row", "row"])


def test_the_failure_guard_judges_the_batch_gathered_from_every_process():
    scorer = SharedVerdictScorer(_AnyImageJudge(fail_every=1))
    step = BatchStep(AdvantageStep(weights=(0.1, 0.3, 0.3)), max_failed_batches_in_a_row=2)
    for _ in range(3):  # this process's share failed three times: scoring it decides nothing
        scorer.begin_batch()
        run_like_trl(scorer, *batch(CAPTIONS[:2]))
    mine = scorer.last_batch.rollouts
    another_process = [dataclasses.replace(mine[0], failure=None, failure_detail="")]
    step.check_failures(mine + another_process)  # the run's batch had a judged rollout
    step.check_failures(mine)
    with pytest.raises(RuntimeError, match="2 batches in a row"):
        step.check_failures(mine + mine)


def test_a_judge_breaking_the_one_outcome_per_request_rule_is_an_error():
    class Short:
        async def judge_batch(self, requests):
            return [JudgeFailure("timeout")]

    with pytest.raises(RuntimeError, match="exactly one outcome per request"):
        run_like_trl(SharedVerdictScorer(Short()), *batch(CAPTIONS[:3]))


def test_caption_tokens_leave_special_tokens_out_and_drive_the_mask():
    scorer = SharedVerdictScorer(
        _AnyImageJudge(fail_every=None),
        RewardConfig(length=LengthControlConfig(tau_low=0.5, tau_high=1.0)),
        special_token_ids=[EOS, PAD],
    )
    run_like_trl(scorer, *batch(CAPTIONS))
    by_caption = {r.caption: r for r in scorer.last_batch.rollouts}
    long = by_caption[CAPTIONS[3]]
    assert long.caption_tokens == 18 and long.reference_tokens == 7
    assert long.length_ratio == pytest.approx(18 / 7) and not long.in_band
    assert long.masked and long.linguistic == 0.0 and long.linguistic_raw > 0
    exact = by_caption[CAPTIONS[0]]
    assert exact.in_band and not exact.masked and exact.linguistic == exact.linguistic_raw


@pytest.mark.parametrize("mode", ["linear", "none"])
def test_without_the_mask_mode_linguistic_is_left_as_judged(mode):
    length = LengthControlConfig(mode=mode, tau_high=1.0, linear_strength=0.5)
    scorer = SharedVerdictScorer(
        _AnyImageJudge(fail_every=None), RewardConfig(length=length), special_token_ids=[EOS, PAD]
    )
    run_like_trl(scorer, *batch(CAPTIONS))
    long = next(r for r in scorer.last_batch.rollouts if r.caption == CAPTIONS[3])
    assert not long.in_band and not long.masked and long.linguistic == long.linguistic_raw
    # the linear mode's p_len is scored with the rewards, for the advantage step (eq. A.5)
    expected = float(linear_length_penalty(18, 7, 0.5, 1.0, 0.5)) if mode == "linear" else 0.0
    assert long.length_penalty == pytest.approx(expected) and (mode == "none" or expected > 0)


@pytest.mark.parametrize(
    ("pointability", "rubric"), [(True, "training"), (False, "training_without_pointability")]
)
def test_pointability_switch_picks_the_rubric_and_rescores_the_verdict(pointability, rubric):
    caption = "this image shows a red circle"  # 'this', 'image', 'shows' are not pointable
    judge = _AnyImageJudge(fail_every=None)
    scorer = SharedVerdictScorer(judge, RewardConfig(pointability=pointability))
    out = run_like_trl(scorer, *batch([caption]))
    # the judge is asked to apply the rubric of the run: the ablation's leaves pointability out
    assert [r.rubric for r in judge.requests] == [rubric]
    expected = judge.expected(caption, REFERENCE, pointability=pointability)
    assert out["precision"][0] == pytest.approx(expected.precision)
    rollout = scorer.last_batch.rollouts[0]
    if pointability:
        assert rollout.non_pointable_share == pytest.approx(3 / 6)
    else:  # not judged under the ablation's rubric: unknown, not 0
        assert math.isnan(rollout.non_pointable_share)


def test_judge_usage_is_reported_per_batch():
    judge = _AnyImageJudge(fail_every=None)
    scorer = SharedVerdictScorer(judge)
    run_like_trl(scorer, *batch(CAPTIONS[:2]))
    first = scorer.last_batch.usage["prompt_tokens"]
    scorer.begin_batch()
    run_like_trl(scorer, *batch(CAPTIONS[2:4]))
    assert scorer.last_batch.usage["prompt_tokens"] == pytest.approx(
        sum(len(c.split()) + 7 for c in CAPTIONS[2:4])
    )
    assert first == pytest.approx(sum(len(c.split()) + 7 for c in CAPTIONS[:2]))
    assert judge_usage(object()) == {}


def test_missing_columns_and_non_judges_are_clear_errors():
    with pytest.raises(TypeError, match="judge_batch"):
        SharedVerdictScorer(object())
    completions, ids, columns = batch(CAPTIONS[:1])
    del columns["reference_tokens"]
    with pytest.raises(KeyError, match="reference_tokens"):
        run_like_trl(SharedVerdictScorer(_AnyImageJudge()), completions, ids, columns)


def test_caption_text_accepts_trl_completion_shapes():
    assert caption_text(" plain ") == "plain"
    assert caption_text([{"role": "assistant", "content": "a cat "}]) == "a cat"
    assert caption_text([{"role": "assistant", "content": [{"type": "text", "text": "a dog"}]}]) == "a dog"
    assert math.isnan(float("nan"))
