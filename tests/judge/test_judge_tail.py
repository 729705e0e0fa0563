"""Tail control (``balcaprl.judge.tail`` in the call path): a trickling answer ends at its deadline, a
first byte or a gap that takes too long is an attempt failed, streamed answers read as unstreamed
ones, and a stalled attempt is hedged (counted, capped). Real HTTP against the loopback server with
its latency model; no assertion on wall time: on counts and on which attempt won."""

from __future__ import annotations

import asyncio
import json
import math
import random
from statistics import NormalDist

import pytest
import yaml
from judge_testkit import (
    REFERENCE,
    config,
    copies_script,
    judge_and_close,
    png_bytes,
    request,
    room_for_two_duplicates,
)
from typer.testing import CliRunner

from balcaprl.cli import app
from balcaprl.judge import JudgeFailure, Judgement, OpenAICompatibleJudge
from balcaprl.judge.tail import Hedging, assemble_stream, first_answer
from balcaprl.testing.judge_server import LatencyModel

FAST = {"time_scale": 100.0, "seed": 1}  # calls of a few milliseconds


def _judge(server, **overrides):
    return OpenAICompatibleJudge(config(server.base_url, **{"hedge": False, **overrides}))


def test_a_trickling_answer_fails_within_its_deadline(judge_server):
    # 1 byte a second: each read arrives in time, only the deadline on the whole attempt ends it
    server = judge_server(latency=LatencyModel(trickle_bytes_per_s=1.0, first_byte_s=0.0))
    (outcome,) = judge_and_close(_judge(server, timeout_s=1.0, max_retries=1), [request()])
    assert isinstance(outcome, JudgeFailure) and outcome.reason == "timeout"
    assert server.latency.served == 2  # the attempt and its one retry, each cut at timeout_s


def test_a_silence_between_chunks_fails_the_attempt(judge_server):
    server = judge_server(latency=LatencyModel(trickle_bytes_per_s=1.0, first_byte_s=0.0))
    judge = _judge(server, timeout_s=60.0, chunk_gap_timeout_s=0.2, max_retries=0)
    (outcome,) = judge_and_close(judge, [request()])
    assert isinstance(outcome, JudgeFailure) and outcome.reason == "timeout"
    assert "chunk_gap_timeout_s" in outcome.detail


def test_no_first_byte_in_time_is_a_failed_attempt_and_the_retry_answers(judge_server):
    server = judge_server(latency=LatencyModel(**FAST, stall_first=["purple elephant"], stall_s=60.0))
    judge = _judge(server, timeout_s=60.0, first_byte_timeout_s=0.3, max_retries=1)
    (outcome,) = judge_and_close(judge, [request()])
    assert isinstance(outcome, Judgement)
    assert server.latency.served == 2 and server.latency.stalls == 1


@pytest.mark.parametrize("stream", [False, True])
def test_streamed_answers_read_as_unstreamed_ones(judge_server, stream):
    server = judge_server(latency=LatencyModel(**FAST, chunks=5))
    plain = judge_server()  # no latency model: the plain answer to compare with
    requests = [request(caption=f"A red door on the left, number {i}.") for i in range(6)]
    got = OpenAICompatibleJudge(config(server.base_url, stream=stream))
    want = OpenAICompatibleJudge(config(plain.base_url))
    ours, theirs = judge_and_close(got, requests), judge_and_close(want, requests)
    assert [o.verdict for o in ours] == [o.verdict for o in theirs]
    assert got.stats.prompt_tokens == want.stats.prompt_tokens > 0  # usage from the stream's last event
    assert got.stats.completion_tokens == want.stats.completion_tokens > 0


def test_a_stalled_first_attempt_among_120_captions_is_hedged_in_balcaprl_score(judge_server, tmp_path):
    server = judge_server(latency=LatencyModel(**FAST, stall_first=["STALLED"], stall_s=120.0))
    images = tmp_path / "images"
    images.mkdir()
    for i in range(12):
        (images / f"{i}.png").write_bytes(png_bytes(colour=(i * 20, 0, 0)))
    captions = tmp_path / "captions.jsonl"
    rows = [
        {"image": f"{i % 12}.png", "caption": f"A red door on the left, caption {i}."} for i in range(120)
    ]
    rows[77]["caption"] = "A red door on the left, STALLED caption."
    captions.write_text("".join(json.dumps(row) + "\n" for row in rows))
    references = tmp_path / "references.json"
    references.write_text(json.dumps({f"{i}.png": REFERENCE for i in range(12)}))
    judge_yaml = tmp_path / "judge.yaml"
    # timeout_s 120: without the hedge the stalled call would hold the command for two minutes
    judge_yaml.write_text(yaml.safe_dump({
        "base_url": server.base_url, "model": "scripted", "api_key_env": None, "cache_path": None,
        "timeout_s": 120.0, "max_retries": 0, "stream": True, "hedge_floor_s": 2.0,
    }))  # fmt: skip
    args = ["score", "--images", str(images), "--captions", str(captions), "--references", str(references),
            "--judge", str(judge_yaml), "--out", str(tmp_path / "out")]  # fmt: skip
    result = CliRunner(env={"COLUMNS": "120"}).invoke(app, args)
    assert result.exit_code == 0, result.output
    scores = [json.loads(line) for line in (tmp_path / "out" / "scores.jsonl").read_text().splitlines()]
    assert len(scores) == 120 and all(s["failure"] is None for s in scores)
    assert server.latency.stalls == 1
    assert (
        server.counters.by_text["A red door on the left, STALLED caption."] == 2
    )  # the stalled one + its hedge
    accounting = json.loads((tmp_path / "out" / "summary.json").read_text())["accounting"]
    hedges = accounting["hedges"]
    # one duplicate for the stall; on a loaded machine a normal call may pass the 2 s floor too, but
    # never more than the 5% cap, and every duplicate is a served and counted call
    assert 1 <= hedges <= 6 and accounting["hedge_wins"] >= 1
    assert accounting["calls"] == server.latency.served == 120 + hedges


# ------------------------------------------------------------------------------------- the pieces


def test_hedging_threshold_is_the_quantile_with_a_floor_and_the_cap_is_a_share():
    hedging = Hedging(quantile=0.95, floor_s=0.5, max_share=0.05, min_seen=4, window=100)
    assert hedging.threshold_s() is None  # too few first bytes seen
    for seconds in [0.1 * i for i in range(1, 21)]:  # 0.1 .. 2.0
        hedging.observe(seconds)
    assert hedging.threshold_s() == pytest.approx(1.9)  # the 19th of 20 sorted
    low = Hedging(quantile=0.5, floor_s=0.5, max_share=0.05, min_seen=1)
    low.observe(0.1)
    assert low.threshold_s() == 0.5  # the floor
    hedging.started = 19
    assert not hedging.allow()  # 1 > 0.05 x 19
    hedging.started = 20
    assert hedging.allow()  # 1 <= 0.05 x 20
    hedging.hedges = 1
    assert not hedging.allow()  # 2 > 0.05 x 20


def test_the_threshold_counts_a_waiting_attempt_only_for_the_time_it_has_waited():
    # First bytes: 80% at 0.2 s, 15% at 2 s, 5% at 10 s, so the 90th percentile is 2 s. 40 attempts
    # started long ago have all answered; of 60 started 1 s ago the 48 fast answered, 12 still wait.
    hedging = Hedging(quantile=0.9, floor_s=0.1, max_share=0.05, min_seen=4)
    now = 100.0
    for seconds in [0.2] * 32 + [2.0] * 6 + [10.0] * 2 + [0.2] * 48:
        hedging.observe(seconds)
    hedging.waiting.update({i: now - 1.0 for i in range(12)})
    # Taken as first bytes at 1 s, the waits put the 90th of 100 values at 1.0 s (80 at 0.2 s, then
    # the 12): an attempt at its 80th percentile would get a duplicate. Product-limit: 80 of 100 by
    # 0.2 s (1 - F = 0.2); the 12 leave at 1 s; 6 of the 8 left by 2 s: 1 - F = 0.2 x 2/8 = 0.05.
    assert hedging.threshold_s(now) == 2.0
    # nothing is told while fewer than min_seen are known at the quantile (by default at least
    # 1 / (1 - quantile): 50 for the 98th percentile)
    young = Hedging(quantile=0.9, floor_s=0.1, max_share=0.05, min_seen=10)
    for _ in range(9):
        young.observe(0.2)
    young.waiting[0] = now - 0.15  # gone from view before 0.2 s: 9 known there
    assert young.threshold_s(now) is None
    young.observe(0.2)
    assert young.threshold_s(now) == pytest.approx(0.2)
    # more than 10% never answered: the 90th percentile may be past any wait, so none is told
    stalls = Hedging(quantile=0.9, floor_s=0.1, max_share=0.05, min_seen=4)
    for seconds in [0.2] * 8 + [0.5] * 4:
        stalls.observe(seconds)
    for _ in range(4):
        stalls.observe(30.0, first_byte=False)
    assert stalls.threshold_s(now) is None
    stalls.observe(0.6)
    for _ in range(23):
        stalls.observe(0.1)
    assert stalls.threshold_s(now) == 0.6  # 4 of 40 (10%): told, at the last first byte
    assert Hedging(quantile=0.98, floor_s=5.0, max_share=0.05).min_seen == 50
    assert Hedging(quantile=0.5, floor_s=5.0, max_share=0.05).min_seen == 16


def test_calls_starting_one_by_one_get_duplicates_only_in_the_tail():
    # A fresh client whose calls start one by one, more and more often (rollouts judged as they
    # finish, the short ones first): 160 first bytes at the quantiles of a lognormal (median 60 ms,
    # sigma 1.12, the latency model's), in a fixed shuffled order. Early on the fast have answered and
    # the slow not yet: read as first bytes, their waits put the 90th percentile near the 66th, and
    # the duplicates went to calls faster than the 80th.
    log_first_byte = NormalDist(math.log(0.06), 1.12)

    def quantile(q: float) -> float:
        return math.exp(log_first_byte.inv_cdf(q))

    first_bytes = [quantile((i + 0.5) / 160) for i in range(160)]
    random.Random(3).shuffle(first_bytes)

    async def go() -> list[float]:
        hedging = Hedging(quantile=0.9, floor_s=0.04, max_share=1.0)
        duplicated: list[float] = []

        async def one(first_byte_s: float) -> None:
            copies = []

            async def attempt(seen):
                copies.append(first_byte_s)
                await asyncio.sleep(first_byte_s if len(copies) == 1 else 0.0)
                seen()

            await first_answer(attempt, hedging)
            if len(copies) > 1:
                duplicated.append(first_byte_s)

        calls, start = [], asyncio.get_running_loop().time()
        for k, first_byte_s in enumerate(first_bytes):  # the k-th at 2 sqrt(k / 160) s
            await asyncio.sleep(max(0.0, start + 2 * math.sqrt(k / 160) - asyncio.get_running_loop().time()))
            calls.append(asyncio.ensure_future(one(first_byte_s)))
        await asyncio.gather(*calls)
        return duplicated

    duplicated = asyncio.run(go())
    assert not [s for s in duplicated if s < quantile(0.8)]  # 10 on the old estimate
    slowest = [s for s in first_bytes if s > quantile(0.95)]  # 8: a duplicate for most
    assert len([s for s in duplicated if s in slowest]) >= len(slowest) - 2


def _seen_fast(hedging: Hedging) -> None:
    """Twenty first bytes at 10 ms: with an attempt waiting past them, 20 of 21 answered by then, so
    the 90th percentile is told (a quantile the attempt waiting might itself be beyond is not)."""
    for _ in range(20):
        hedging.observe(0.01)


def _attempts(script):
    """An attempt function playing ``script``: per call, (seconds to first byte or None, result)."""
    calls = []

    async def attempt(on_first_byte):
        index = len(calls)
        calls.append("started")
        first_byte_s, result = script[index]
        if first_byte_s is None:
            await asyncio.sleep(3600)  # stalled
        await asyncio.sleep(first_byte_s)
        on_first_byte()
        calls[index] = "answered"
        if isinstance(result, Exception):
            raise result
        return result

    return attempt, calls


def test_a_stalled_attempt_gets_a_duplicate_which_wins_and_the_first_is_cancelled():
    hedging = Hedging(quantile=0.9, floor_s=0.05, max_share=1.0, min_seen=1)
    _seen_fast(hedging)
    attempt, calls = _attempts([(None, "first"), (0.0, "duplicate")])
    told = []
    result = asyncio.run(first_answer(attempt, hedging, told.append))
    assert result == "duplicate" and told == [True] and hedging.hedges == 1
    assert calls == ["started", "answered"]


def test_no_duplicate_past_the_cap_or_for_an_attempt_that_has_answered():
    capped = Hedging(quantile=0.9, floor_s=0.01, max_share=0.0, min_seen=1)
    _seen_fast(capped)
    attempt, calls = _attempts([(0.1, "first")])
    assert asyncio.run(first_answer(attempt, capped)) == "first" and capped.hedges == 0 and len(calls) == 1
    quick = Hedging(quantile=0.9, floor_s=0.5, max_share=1.0, min_seen=1)
    _seen_fast(quick)
    attempt, calls = _attempts([(0.0, "first")])
    assert asyncio.run(first_answer(attempt, quick)) == "first" and quick.hedges == 0


def test_when_both_fail_the_first_attempts_failure_is_raised():
    hedging = Hedging(quantile=0.9, floor_s=0.05, max_share=1.0, min_seen=1)
    _seen_fast(hedging)
    attempt, _ = _attempts([(0.2, ValueError("first")), (0.0, ValueError("second"))])
    told = []
    with pytest.raises(ValueError, match="first"):
        asyncio.run(first_answer(attempt, hedging, told.append))
    assert told == [False]


def test_a_duplicate_left_alone_without_a_first_byte_gets_a_duplicate_of_its_own():
    """The first attempt is cut with no first byte while its duplicate stalls: the duplicate, alone now,
    is watched by the same rule and gets its own duplicate, which answers (before, the call waited on
    the stalled duplicate until that one's own limit: here, for ever)."""
    hedging = Hedging(quantile=0.9, floor_s=0.05, max_share=1.0, min_seen=1)
    _seen_fast(hedging)
    room_for_two_duplicates(hedging)
    attempt, started = copies_script(first_fails_after_s=0.3, duplicate="stalls")
    told = []
    result = asyncio.run(asyncio.wait_for(first_answer(attempt, hedging, told.append), timeout=10.0))
    assert result == "third" and told == [False, True] and hedging.hedges == 2
    assert started[2] - started[0] >= 0.3  # sent when the first copy failed, not while both were in flight


def test_a_duplicate_left_alone_with_its_first_byte_is_only_awaited():
    hedging = Hedging(quantile=0.9, floor_s=0.05, max_share=1.0, min_seen=1)
    _seen_fast(hedging)
    room_for_two_duplicates(hedging)
    attempt, started = copies_script(first_fails_after_s=0.1, duplicate="answers", decode_s=0.3)
    told = []
    assert asyncio.run(first_answer(attempt, hedging, told.append)) == "duplicate"
    assert told == [True] and hedging.hedges == 1 and len(started) == 2


def test_a_duplicate_that_fails_at_once_is_not_sent_again():
    """Each copy gets one duplicate: the first copy, left alone by a duplicate refused at once, waits for
    its own end (here: cut, and its failure raised for the caller's retry and backoff), however much
    room the cap has."""
    hedging = Hedging(quantile=0.9, floor_s=0.05, max_share=1.0, min_seen=1)
    _seen_fast(hedging)
    room_for_two_duplicates(hedging)
    attempt, started = copies_script(first_fails_after_s=0.3, duplicate="fails")
    told = []
    with pytest.raises(TimeoutError, match="first_byte"):
        asyncio.run(first_answer(attempt, hedging, told.append))
    assert len(started) == 2 and told == [False] and hedging.hedges == 1


def test_a_call_given_up_with_its_duplicate_in_flight_still_reports_the_duplicate():
    async def go():
        hedging = Hedging(quantile=0.9, floor_s=0.05, max_share=1.0, min_seen=1)
        _seen_fast(hedging)
        attempt, started = copies_script(first_fails_after_s=3600, duplicate="stalls")
        told = []
        call = asyncio.ensure_future(first_answer(attempt, hedging, told.append))
        while len(started) < 2:  # the duplicate sent
            await asyncio.sleep(0.01)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        return told

    assert asyncio.run(go()) == [False]  # paid for: counted in the accounting


def test_a_first_attempt_cut_while_its_duplicate_answers_is_counted_at_its_own_end():
    """The first copy's wait, cut short at 0.1 s, is what the quantile learns of it (a first byte later
    than that), not the 1.5 s its duplicate took to answer."""
    hedging = Hedging(quantile=0.9, floor_s=0.05, max_share=1.0, min_seen=1)
    _seen_fast(hedging)
    attempt, _ = copies_script(first_fails_after_s=0.1, duplicate="answers", decode_s=1.5)
    assert asyncio.run(first_answer(attempt, hedging)) == "duplicate"
    (cut,) = [seconds for seconds, first_byte in hedging._seen if not first_byte]
    assert 0.1 <= cut < 1.0


def test_assemble_stream_joins_the_deltas_and_keeps_the_last_usage():
    events = [
        {
            "id": "c1",
            "model": "m",
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": '{"a"'}}],
        },
        {
            "id": "c1",
            "model": "m",
            "choices": [{"index": 0, "delta": {"content": ": 1}"}, "finish_reason": None}],
        },
        {"id": "c1", "model": "m", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        {"id": "c1", "model": "m", "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3}},
    ]
    raw = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    completion = json.loads(assemble_stream(raw))
    assert completion["choices"][0]["message"]["content"] == '{"a": 1}'
    assert completion["choices"][0]["finish_reason"] == "stop"
    assert completion["usage"] == {"prompt_tokens": 7, "completion_tokens": 3}
    assert assemble_stream(b'{"not": "a stream"}') == b'{"not": "a stream"}'
    error = json.loads(assemble_stream(b'data: {"error": {"message": "overloaded"}}\n\n'))
    assert error == {"error": {"message": "overloaded"}}


class _Pause:
    """An awaitable that suspends once: a coroutine left mid-batch, as a task cancelled at exit is."""

    def __await__(self):
        yield


def test_a_batch_closed_from_another_context_ends_without_an_error():
    """A run interrupted while rollouts are judged leaves coroutines inside a hedge batch; Python closes
    them later from another context (garbage collection), where the batch's token cannot be reset."""
    import contextvars

    from balcaprl.judge import tail

    async def judged():
        with tail.hedge_batch():
            await _Pause()

    coroutine = judged()
    contextvars.copy_context().run(coroutine.send, None)  # enters the batch in a task's own context
    coroutine.close()  # from this one, as the collector does: no ValueError escapes
    assert tail._BATCH.get() is None
