"""What a judge answer may be: hostile answers from the loopback server (a 20 MB explanation, a gzip
bomb, an endless chunked body) end as one ``oversized_answer`` failure each, never retried, with
memory bounded by the answer byte limit, not by what the server sends."""

from __future__ import annotations

import asyncio
import tracemalloc

import pytest
from judge_testkit import EXPECTED, config, request

from balcaprl.judge import JudgeFailure, Judgement, OpenAICompatibleJudge
from balcaprl.judge.calls import answer_byte_limit
from balcaprl.rewards import score_verdict
from balcaprl.testing import hostile_answers

MiB = 1 << 20


def run(judge, requests, *, trace: bool = False):
    """The batch's outcomes and, with ``trace``, the peak of Python memory allocated while it ran."""

    async def go():
        try:
            if trace:
                tracemalloc.start()
            result = (await judge.judge_batch_with_stats(requests)).outcomes
            peak = tracemalloc.get_traced_memory()[1] if trace else None
            return result, peak
        finally:
            if trace:
                tracemalloc.stop()
            await judge.aclose()

    return asyncio.run(go())


def test_the_byte_limit_follows_max_tokens():
    # 64 KiB of envelope + 64 bytes per completion token: 320 KiB at the default 4,096 tokens
    assert answer_byte_limit(4096) == 65536 + 4096 * 64 == 320 * 1024
    assert answer_byte_limit(16) == 65536 + 1024


def test_a_20_mb_explanation_is_an_oversized_answer_and_the_batch_goes_on(judge_server):
    server = judge_server({"HUGE": ["huge_explanation:20"]})
    judge = OpenAICompatibleJudge(config(server.base_url, max_retries=1))
    (bad, good), _ = run(judge, [request("HUGE red door"), request()])
    assert isinstance(bad, JudgeFailure) and bad.reason == "oversized_answer", bad
    assert "declares" in bad.detail and f"{answer_byte_limit(4096):,}" in bad.detail
    assert server.counters.by_text["HUGE red door"] == 1  # neither retried nor re-asked
    assert isinstance(good, Judgement) and score_verdict(good.verdict).as_tuple() == pytest.approx(EXPECTED)


def test_an_explanation_past_its_length_is_oversized_within_the_byte_limit(judge_server):
    # 5 KB: far under the byte limit, over the schema's 4,000 characters
    server = judge_server({"WORDY": ["huge_explanation:0.005"]})
    (outcome,), _ = run(OpenAICompatibleJudge(config(server.base_url)), [request("WORDY red door")])
    assert isinstance(outcome, JudgeFailure) and outcome.reason == "oversized_answer", outcome
    assert "explanation" in outcome.detail and "4000" in outcome.detail
    assert server.counters.by_text["WORDY red door"] == 1


def test_a_gzip_bomb_is_never_inflated_past_the_limit(judge_server):
    # 4 bombs of 16 MiB decompressed each (16 KiB on the wire), 2 in flight at a time
    server = judge_server({"BOMB": ["gzip_bomb:16"] * 4})
    judge = OpenAICompatibleJudge(config(server.base_url, concurrency=2, max_retries=1))
    outcomes, peak = run(judge, [request(f"BOMB {i} red door") for i in range(4)], trace=True)
    assert [getattr(o, "reason", "ok") for o in outcomes] == ["oversized_answer"] * 4, outcomes
    assert all("decompressed to more than" in o.detail for o in outcomes)
    assert server.counters.total == 4
    # everything Python allocated meanwhile (the server's side included) stays a few MiB: a bomb
    # inflated whole would take 16 MiB, and parsing it as much again
    assert peak < 8 * MiB, f"{peak / MiB:.1f} MiB"


@pytest.mark.timeout(120)  # a client that reads without a bound never returns: the test fails there
def test_an_endless_chunked_body_is_cut_at_the_limit(judge_server):
    server = judge_server({"ENDLESS": ["endless_body"]})
    before = hostile_answers.SENT["endless_body"]
    judge = OpenAICompatibleJudge(config(server.base_url, max_retries=1))
    (bad, good), peak = run(judge, [request("ENDLESS red door"), request()], trace=True)
    assert isinstance(bad, JudgeFailure) and bad.reason == "oversized_answer", bad
    assert "read more than" in bad.detail
    assert isinstance(good, Judgement)
    assert server.counters.by_text["ENDLESS red door"] == 1
    # the server stopped producing soon after the client hung up: socket buffers, not the whole body
    assert hostile_answers.SENT["endless_body"] - before < 32 * MiB
    assert peak < 8 * MiB, f"{peak / MiB:.1f} MiB"
