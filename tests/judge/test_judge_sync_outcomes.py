"""The sync facade, outcomes -> NaN reward tensor, the scripted judge's rules, and the two reference
modes measured against each other."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch
from judge_testkit import CAPTION, EXPECTED, REFERENCE, config, request

from balcaprl import c_gdpo_advantages
from balcaprl.judge import (
    JudgeFailure,
    Judgement,
    OpenAICompatibleJudge,
    SyncJudge,
    empty_caption_judgement,
    rewards_tensor,
)
from balcaprl.judge.outcomes import EMPTY_CAPTION_EXPLANATION
from balcaprl.rewards import REWARD_NAMES, score_verdict
from balcaprl.testing.compare_modes import compare_reference_modes
from balcaprl.testing.scripted_judge import ScriptedJudge, clauses


def test_sync_facade_from_plain_code_threads_and_a_running_loop(judge_server):
    server = judge_server()
    judge = OpenAICompatibleJudge(config(server.base_url))
    with SyncJudge(judge) as sync:
        first = sync.judge_batch([request()])
        runtime = judge._endpoint.state
        second = sync.judge_batch([request("a black cat")])
        assert judge._endpoint.state is runtime  # one loop, one connection pool, across batches
        results = {}

        def worker(i):
            results[i] = sync.judge_batch([request(f"thread {i}")])

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

        async def inside_a_loop():  # e.g. a notebook: blocking here still works
            return sync.judge_batch([request("from a coroutine")])

        third = asyncio.run(inside_a_loop())
        with_stats = sync.judge_batch_with_stats([request()])
    assert score_verdict(first[0].verdict).as_tuple() == pytest.approx(EXPECTED)
    assert isinstance(second[0], Judgement) and isinstance(third[0], Judgement)
    assert sorted(results) == [0, 1, 2, 3] and all(isinstance(r[0], Judgement) for r in results.values())
    assert with_stats.stats.coalesced + with_stats.stats.judged + with_stats.stats.cache_hits == 1
    with pytest.raises(RuntimeError, match="closed"):
        sync.judge_batch([request()])


def test_sync_facade_wraps_any_judge_and_cancels_on_timeout():
    slow = ScriptedJudge(latency_s=5.0)
    with SyncJudge(ScriptedJudge()) as sync:
        (outcome,) = sync.judge_batch([request()])
        assert score_verdict(outcome.verdict).as_tuple() == pytest.approx(EXPECTED)
        with pytest.raises(TypeError, match="judge_batch_with_stats"):
            sync.judge_batch_with_stats([request()])
    with SyncJudge(slow) as sync:
        with pytest.raises(TimeoutError, match="cancelled"):
            sync.judge_batch([request()], timeout=0.1)
        assert slow.requests_seen == 1
        # the loop is free again: a new batch on the same facade is not stuck behind the old one
        slow.latency_s = 0.0
        assert isinstance(sync.judge_batch([request()], timeout=5)[0], Judgement)


def test_rewards_tensor_order_dtype_and_nan():
    good = asyncio.run(ScriptedJudge().judge_batch([request()]))[0]
    outcomes = [good, JudgeFailure("timeout"), empty_caption_judgement(REFERENCE)]
    rewards = rewards_tensor(outcomes)
    assert REWARD_NAMES == ("precision", "recall", "linguistic")
    assert rewards.dtype == torch.float32 and rewards.shape == (3, 3)
    assert rewards[0].tolist() == pytest.approx(list(EXPECTED))
    assert torch.isnan(rewards[1]).all()
    assert rewards[2].tolist() == [0.0, 0.0, 0.0]
    assert rewards_tensor([], dtype=torch.float64).shape == (0, 3)
    with pytest.raises(TypeError, match="outcome 0"):
        rewards_tensor(["not an outcome"])


def test_a_failure_gets_advantage_zero_not_a_penalty():
    # a failed rollout is NaN -> c-GDPO leaves it out and gives it 0; a 0 reward would be punished.
    good = asyncio.run(ScriptedJudge().judge_batch([request(), request("a red door on the left")]))
    rewards = rewards_tensor([*good, JudgeFailure("timeout")])
    advantages = c_gdpo_advantages(rewards, [0, 0, 0], [0.1, 0.3, 0.3])
    assert advantages[2] == 0.0 and advantages[0] != 0.0


def test_empty_caption_judgement():
    judgement = empty_caption_judgement(REFERENCE)
    assert score_verdict(judgement.verdict).as_tuple() == (0.0, 0.0, 0.0)
    assert judgement.verdict.explanation == EMPTY_CAPTION_EXPLANATION
    assert score_verdict(judgement.verdict).n_caption_assertions == 0


def test_scripted_judge_rules():
    assert clauses(CAPTION) == [
        "a red door on the left",
        "a purple elephant",
        "the scene has a cozy atmosphere",
    ]
    assert clauses("a candle and a lamp; a cat\nsits") == ["a candle", "a lamp", "a cat", "sits"]
    (outcome,) = asyncio.run(ScriptedJudge(clarity=10, fluency=10, coherency=10).judge_batch([request()]))
    assert score_verdict(outcome.verdict).as_tuple() == pytest.approx((1 / 3, 1 / 2, 1.0))
    jittery = ScriptedJudge(reference_jitter=1.0)  # merges every neighbour: one reference assertion
    (merged,) = asyncio.run(jittery.judge_batch([request()]))
    assert len(merged.verdict.reference_assertions) == 1
    split = asyncio.run(jittery.decompose_references([request()]))
    assert split == [["a red door on the left and a black cat sits on the step"]]


def test_reference_modes_compared():
    results = compare_reference_modes(n_prompts=6, group_size=4, reference_jitter=0.5, seed=1)
    joint, cached = results["joint"], results["cached-reference"]
    assert joint["failures"] == cached["failures"] == 0
    assert joint["calls"] == 24 and cached["calls"] == 24 + 6  # one decomposition per prompt
    assert cached["denominator_spread_mean"] == 0.0 and cached["groups_with_varying_denominator"] == 0.0
    assert joint["denominator_spread_mean"] > 0.0
    assert cached["completion_tokens"] < joint["completion_tokens"]
