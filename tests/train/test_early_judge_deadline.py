"""The trainer's deadline for its rewards, as :class:`EarlyJudge` tells it to a judge that can use it:
learned in one step (end of generation -> rewards asked for), told at the next step's end of
generation, withdrawn once the rewards are in; nothing told to a judge without the extension. And
the real client hands it to its hedging."""

from __future__ import annotations

import asyncio
import time

import pytest

from balcaprl.judge import JudgeConfig, JudgeFailure, JudgeRequest, OpenAICompatibleJudge, SupportsDeadline
from balcaprl.train.early_judge import EarlyJudge

REQUEST = JudgeRequest(image=b"png", caption="A red door.", reference="A red door on the left.")


class DeadlineJudge:
    """A judge that answers at once and records what it is told of the deadline."""

    def __init__(self):
        self.told: list[tuple[float, float | None]] = []  # (when told, the deadline)

    async def judge_batch(self, requests):
        return [JudgeFailure("bad_input", "test") for _ in requests]

    def rewards_wanted_at(self, when):
        self.told.append((time.perf_counter(), when))


def test_the_deadline_is_the_end_of_generation_plus_the_last_steps_lead():
    async def go():
        judge = DeadlineJudge()
        early = EarlyJudge(judge, asyncio.get_running_loop())
        assert isinstance(judge, SupportsDeadline)
        # step 1: nothing to tell at the end of generation (no lead yet); 0.2 s later the rewards are asked
        early.generation_done()
        assert judge.told == []
        await asyncio.sleep(0.2)
        await early.judge_batch_counted([REQUEST])
        lead = early.lead_s
        assert judge.told[-1][1] is None  # rewards in: no deadline
        # step 2: told at the end of generation, once (settle at the same point does not tell it again)
        early.start([REQUEST])
        early.generation_done()
        early.settle([REQUEST])
        told_at, deadline = judge.told[-1]
        assert len(judge.told) == 2 and deadline == pytest.approx(told_at + lead, abs=0.05)
        await early.judge_batch_counted([REQUEST])
        assert judge.told[-1][1] is None and len(judge.told) == 3
        # a step that failed before its rewards: dropped with its deadline
        early.generation_done()
        assert judge.told[-1][1] is not None
        early.forget_started()
        assert judge.told[-1][1] is None
        return lead

    lead = asyncio.run(go())
    assert 0.2 <= lead < 2.0


def test_a_judge_without_the_extension_is_told_nothing():
    class Plain:
        async def judge_batch(self, requests):
            return [JudgeFailure("bad_input", "test") for _ in requests]

    async def go():
        early = EarlyJudge(Plain(), asyncio.get_running_loop())
        for _ in range(2):
            early.generation_done()
            outcomes, _ = await early.judge_batch_counted([REQUEST])
            assert len(outcomes) == 1

    assert not isinstance(Plain(), SupportsDeadline)
    asyncio.run(go())


def test_the_client_hands_the_deadline_to_its_hedging():
    async def go():
        config = JudgeConfig(base_url="http://127.0.0.1:9/v1", model="m", api_key_env=None, cache_path=None)
        judge = OpenAICompatibleJudge(config)
        try:
            now = time.perf_counter()
            judge.rewards_wanted_at(now + 5.0)
            hedging = judge._endpoint.runtime().hedging
            assert hedging is not None and hedging.deadline == now + 5.0
            judge.rewards_wanted_at(None)
            assert hedging.deadline is None
            off = OpenAICompatibleJudge(config.model_copy(update={"hedge": False}))
            off.rewards_wanted_at(now)  # no hedging: nothing to tell, no error
            await off.aclose()
        finally:
            await judge.aclose()

    asyncio.run(go())


def test_only_a_training_batch_tells_the_end_of_generation(monkeypatch):
    # TRL's evaluation batches are generated and settled too: their wait is not a training step's
    from types import SimpleNamespace

    from balcaprl.train import judge_overlap

    ends: list[bool] = []
    settled: list[list] = []
    early = SimpleNamespace(generation_done=lambda: ends.append(True), settle=settled.append)
    model = SimpleNamespace(training=False)
    overlap = object.__new__(judge_overlap.TrlJudgeOverlap)
    overlap.trainer = SimpleNamespace(model=model, scorer=None)
    overlap.early_judge, overlap._inputs, overlap._shared = early, [{"row": 0}], False
    monkeypatch.setattr(judge_overlap, "requests_for", lambda scorer, inputs, completions: [REQUEST])
    overlap.settle(["a completion"])
    assert ends == [] and settled == [[REQUEST]]
    model.training = True
    overlap.settle(["a completion"])
    assert ends == [True] and len(settled) == 2
