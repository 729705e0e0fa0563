"""The real judge client over real HTTP against the loopback server: verdicts, faults, coalescing,
caching, accounting, reference modes. Server hit counts are exact, so a wasted call fails a test."""

from __future__ import annotations

import asyncio
import gc
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from judge_testkit import CAPTION, EXPECTED, IMAGE, REFERENCE, config, jpeg_bytes, png_bytes, request

from balcaprl.judge import (
    JudgeCache,
    JudgeConfigError,
    JudgeFailure,
    Judgement,
    OpenAICompatibleJudge,
    rewards_tensor,
)
from balcaprl.judge.sync import SyncJudge
from balcaprl.rewards import score_verdict


def run(judge: OpenAICompatibleJudge, requests):
    async def go():
        try:
            return await judge.judge_batch_with_stats(requests)
        finally:
            await judge.aclose()

    return asyncio.run(go())


def test_hand_computed_rewards_over_http(judge_server):
    server = judge_server()
    result = run(OpenAICompatibleJudge(config(server.base_url)), [request()])
    (outcome,) = result.outcomes
    assert isinstance(outcome, Judgement)
    assert score_verdict(outcome.verdict).as_tuple() == pytest.approx(EXPECTED)
    assert [a.text for a in outcome.verdict.caption_assertions] == [
        "a red door on the left",
        "a purple elephant",
        "the scene has a cozy atmosphere",
    ]
    assert score_verdict(outcome.verdict).non_pointable_share == pytest.approx(1 / 3)
    assert score_verdict(outcome.verdict).non_visible_share == pytest.approx(
        1 / 2
    )  # 1 of 2 pointable is false
    assert server.counters.total == 1
    assert result.stats.calls == 1 and result.stats.judged == 1
    assert result.stats.prompt_tokens > 0 and result.stats.completion_tokens > 0


@pytest.mark.parametrize(
    ("faults", "reason", "hits"),
    [
        (["invalid_json", "invalid_json"], "invalid_json", 2),  # re-asked once, then a failure
        (["schema_violation", "schema_violation"], "schema_violation", 2),
        (["truncated"], "truncated_output", 1),  # finish_reason "length": no re-ask
        (["refusal"], "refused", 1),
        (["content_filter"], "refused", 1),
        (["server_error", "server_error"], "server_error", 2),  # 1 try + 1 retry
        (["unavailable", "unavailable"], "server_error", 2),
        (["rate_limit", "rate_limit"], "rate_limited", 2),
        (["drop", "drop"], "server_error", 2),  # connection dropped mid-response
    ],
)
def test_each_fault_is_one_failure_and_never_fails_the_batch(judge_server, faults, reason, hits):
    server = judge_server({"FAULTY": faults})
    judge = OpenAICompatibleJudge(config(server.base_url, max_retries=1))
    result = run(judge, [request("FAULTY red door"), request()])
    bad, good = result.outcomes
    assert isinstance(bad, JudgeFailure) and bad.reason == reason, bad
    assert isinstance(good, Judgement) and score_verdict(good.verdict).as_tuple() == pytest.approx(EXPECTED)
    assert server.counters.by_text["FAULTY red door"] == hits
    assert result.stats.failures == {reason: 1}
    rewards = rewards_tensor(result.outcomes)
    assert torch.isnan(rewards[0]).all() and not torch.isnan(rewards[1]).any()


@pytest.mark.parametrize("fault", ["invalid_json", "schema_violation", "rate_limit", "server_error", "drop"])
def test_a_transient_fault_recovers(judge_server, fault):
    # invalid answers get one re-ask; transport faults one retry (429 honours retry-after).
    server = judge_server({"FLAKY": [fault]})
    judge = OpenAICompatibleJudge(config(server.base_url, max_retries=1))
    result = run(judge, [request("FLAKY red door")])
    (outcome,) = result.outcomes
    assert isinstance(outcome, Judgement)
    assert server.counters.by_text["FLAKY red door"] == 2
    assert result.stats.reasks == (1 if fault in ("invalid_json", "schema_violation") else 0)


def test_slow_answer_times_out(judge_server):
    server = judge_server({"SLOW": ["slow:2", "slow:2"]})
    judge = OpenAICompatibleJudge(config(server.base_url, timeout_s=0.3, max_retries=1))
    result = run(judge, [request("SLOW red door"), request()])
    assert isinstance(result.outcomes[0], JudgeFailure) and result.outcomes[0].reason == "timeout"
    assert isinstance(result.outcomes[1], Judgement)
    assert server.counters.by_text["SLOW red door"] == 2


def test_unauthorized_raises_a_config_error_naming_the_fix(judge_server):
    server = judge_server({"": ["unauthorized"]})
    with pytest.raises(JudgeConfigError, match="api_key_env"):
        run(OpenAICompatibleJudge(config(server.base_url)), [request()])


def test_identical_in_flight_requests_are_coalesced_into_one_call(judge_server):
    from balcaprl.testing.scripted_judge import ScriptedJudge

    server = judge_server(judge=ScriptedJudge(latency_s=0.2))
    judge = OpenAICompatibleJudge(config(server.base_url))
    result = run(judge, [request() for _ in range(8)] + [request("a black cat")])
    assert server.counters.total == 2
    assert server.counters.by_text[CAPTION] == 1
    assert result.stats.coalesced == 7 and result.stats.judged == 2 and result.stats.calls == 2
    first = result.outcomes[0]
    # one answer, shared (each request turns the rubric's wire answer into its own equal Verdict)
    assert all(o.verdict == first.verdict for o in result.outcomes[:8])


def test_cache_hits_across_batches_and_judges_and_failures_are_not_cached(judge_server, tmp_path):
    server = judge_server({"ONCE-BROKEN": ["refusal"]})
    cache_path = tmp_path / "judge.sqlite"
    requests = [request(), request("ONCE-BROKEN red door")]

    first = run(OpenAICompatibleJudge(config(server.base_url, cache_path=cache_path)), requests)
    assert isinstance(first.outcomes[1], JudgeFailure)
    assert server.counters.total == 2

    # A new judge on the same cache file: the success is a hit, the failure is judged again.
    second = run(OpenAICompatibleJudge(config(server.base_url, cache_path=cache_path)), requests)
    assert server.counters.total == 3
    assert second.stats.cache_hits == 1 and second.stats.judged == 1
    assert second.outcomes[0].verdict == first.outcomes[0].verdict
    assert isinstance(second.outcomes[1], Judgement)

    third = run(OpenAICompatibleJudge(config(server.base_url, cache_path=cache_path)), requests)
    assert server.counters.total == 3 and third.stats.cache_hits == 2
    with JudgeCache(cache_path) as cache:
        assert len(cache) == 2


def test_a_cache_hit_never_prepares_its_image_and_finds_what_the_full_path_stored(
    judge_server, tmp_path, monkeypatch
):
    """A warm cache is read with keys made from the hash of each image's bytes, before any image is
    decoded: those keys are the ones the full path stored under (written by the cold run), and only
    the requests the cache cannot answer prepare their image."""
    import balcaprl.judge.images as images_module

    server = judge_server()
    (tmp_path / "a.png").write_bytes(png_bytes())
    (tmp_path / "b.jpg").write_bytes(jpeg_bytes())
    requests = [
        request(image="a.png"),
        request(image="b.jpg", caption="A red door on the left."),
        request(image=png_bytes(colour=(9, 9, 9))),
        request(image="a.png", rubric="evaluation"),
    ]
    cfg = config(server.base_url, cache_path=tmp_path / "judge.sqlite")
    hashed = []
    real_hash = images_module.sha256_hex
    monkeypatch.setattr(images_module, "sha256_hex", lambda data: hashed.append(1) or real_hash(data))
    first = run(OpenAICompatibleJudge(cfg, image_root=tmp_path), requests[:2]).outcomes
    assert len(hashed) == 2  # each file hashed once: preparing a file hashed for its key does not again
    first += run(OpenAICompatibleJudge(cfg, image_root=tmp_path), requests[2:]).outcomes
    assert server.counters.total == 4

    prepared = []
    real_load = images_module.ImageLoader.load
    monkeypatch.setattr(
        images_module.ImageLoader,
        "load",
        lambda self, image: prepared.append(image) or real_load(self, image),
    )
    second = run(
        OpenAICompatibleJudge(cfg, image_root=tmp_path),
        [*requests, request(image="missing.png"), request(image="a.png", caption=" ")],
    )
    assert server.counters.total == 4 and second.stats.cache_hits == 4
    assert [o.verdict for o in second.outcomes[:4]] == [o.verdict for o in first]
    assert prepared == ["missing.png"]  # the one request that takes the full path (and fails there)
    assert second.outcomes[4].reason == "bad_input" and second.outcomes[5].verdict.caption_assertions == []


@pytest.mark.parametrize(
    "change",
    [{"model": "other-model"}, {"temperature": 0.7}, {"max_tokens": 1000}, {"max_image_side": 512},
     {"reference_mode": "cached-reference"}],
)  # fmt: skip
def test_cache_key_covers_model_sampling_image_side_and_mode(judge_server, tmp_path, change):
    server = judge_server()
    cache_path = tmp_path / "judge.sqlite"
    run(OpenAICompatibleJudge(config(server.base_url, cache_path=cache_path)), [request()])
    before = server.counters.total
    result = run(OpenAICompatibleJudge(config(server.base_url, cache_path=cache_path, **change)), [request()])
    assert result.stats.cache_hits == 0
    assert server.counters.total > before


def test_cache_key_covers_rubric_image_and_texts(judge_server, tmp_path):
    server = judge_server()
    cache_path = tmp_path / "judge.sqlite"
    run(OpenAICompatibleJudge(config(server.base_url, cache_path=cache_path)), [request()])
    variants = [
        request(rubric="evaluation"),
        request(image=png_bytes(colour=(1, 2, 3))),
        request(caption=CAPTION + " More."),
        request(reference=REFERENCE + " More."),
    ]
    result = run(OpenAICompatibleJudge(config(server.base_url, cache_path=cache_path)), variants)
    assert result.stats.cache_hits == 0 and result.stats.judged == 4
    assert server.counters.total == 5


def test_concurrency_limit_is_respected(judge_server):
    from balcaprl.testing.scripted_judge import ScriptedJudge

    server = judge_server(judge=ScriptedJudge(latency_s=0.1))
    judge = OpenAICompatibleJudge(config(server.base_url, concurrency=3))
    result = run(judge, [request(f"caption {i}") for i in range(10)])
    assert len(result.outcomes) == 10 and server.counters.total == 10
    assert server.counters.max_in_flight == 3


def test_empty_caption_scores_zero_without_a_call_and_failures_are_nan(judge_server):
    server = judge_server({"BROKEN": ["refusal"]})
    result = run(
        OpenAICompatibleJudge(config(server.base_url)),
        [request(""), request("   \n\t"), request("BROKEN"), request()],
    )
    rewards = rewards_tensor(result.outcomes)
    assert rewards.shape == (4, 3)
    assert rewards[0].tolist() == [0.0, 0.0, 0.0] and rewards[1].tolist() == [0.0, 0.0, 0.0]
    assert all(math.isnan(v) for v in rewards[2].tolist())
    assert rewards[3].tolist() == pytest.approx(list(EXPECTED))
    assert result.stats.skipped_empty == 2
    assert server.counters.total == 2  # neither empty caption was sent


def test_accounting_per_batch_and_lifetime(judge_server, caplog):
    import logging

    from balcaprl.judge import PriceTable

    caplog.set_level(logging.INFO, logger="balcaprl.judge")
    server = judge_server()
    cfg = config(server.base_url, price_per_million_tokens=PriceTable(prompt=1.0, completion=2.0))
    judge = OpenAICompatibleJudge(cfg)

    async def go():
        a = await judge.judge_batch_with_stats([request(), request(), request("")])
        b = await judge.judge_batch_with_stats([request("a black cat")])
        await judge.aclose()
        return a, b

    a, b = asyncio.run(go())
    assert (a.stats.requests, a.stats.calls, a.stats.coalesced, a.stats.skipped_empty) == (3, 1, 1, 1)
    summary = a.stats.as_dict(cfg.price_per_million_tokens)
    expected_cost = (a.stats.prompt_tokens * 1.0 + a.stats.completion_tokens * 2.0) / 1e6
    assert summary["estimated_cost_usd"] == pytest.approx(expected_cost)
    assert (
        summary["latency_s"]["p50"] is not None and summary["latency_s"]["p99"] >= summary["latency_s"]["p50"]
    )
    assert judge.stats.requests == 4 and judge.stats.calls == 2
    assert judge.stats.prompt_tokens == a.stats.prompt_tokens + b.stats.prompt_tokens
    lines = [r.getMessage() for r in caplog.records if r.name == "balcaprl.judge"]
    assert len(lines) == 2 and lines[0].startswith(
        "judge: 3 requests, 1 calls, 0 cache hits, 1 coalesced, 1 empty"
    )
    assert "~$" in lines[0]


def test_cached_reference_mode_decomposes_each_reference_once(judge_server, tmp_path):
    server = judge_server()
    other_image = png_bytes(colour=(9, 9, 9))
    captions = [f"a red door on the left, rollout {i}" for i in range(8)]
    requests = [request(c) for c in captions] + [request(c, image=other_image) for c in captions[:2]]
    cfg = config(server.base_url, reference_mode="cached-reference", cache_path=tmp_path / "c.sqlite")
    result = run(OpenAICompatibleJudge(cfg), requests)
    # the split is text only: one decomposition serves both images that share the reference
    assert server.counters.by_kind == {"reference_assertions": 1, "coverage": 10}
    assert result.stats.reference_calls == 1 and result.stats.calls == 11
    for outcome in result.outcomes:
        assert isinstance(outcome, Judgement)
        assert [a.text for a in outcome.verdict.reference_assertions] == [
            "a red door on the left",
            "a black cat sits on the step",
        ]
        assert score_verdict(outcome.verdict).recall == 0.5
    # A second judge on the same cache: the reference decomposition is cached too.
    run(OpenAICompatibleJudge(cfg), [request("a brand new caption")])
    assert server.counters.by_kind["reference_assertions"] == 1


def test_cached_reference_mode_matches_joint_rewards(judge_server):
    server = judge_server()
    joint = run(OpenAICompatibleJudge(config(server.base_url)), [request()])
    cached = run(
        OpenAICompatibleJudge(config(server.base_url, reference_mode="cached-reference")), [request()]
    )
    assert score_verdict(cached.outcomes[0].verdict).as_tuple() == pytest.approx(
        score_verdict(joint.outcomes[0].verdict).as_tuple()
    )


def test_cached_reference_mode_rejects_coverage_with_wrong_ids(judge_server):
    server = judge_server({"WRONG": ["wrong_ids", "wrong_ids"]})
    cfg = config(server.base_url, reference_mode="cached-reference")
    result = run(OpenAICompatibleJudge(cfg), [request("WRONG red door")])
    (outcome,) = result.outcomes
    assert isinstance(outcome, JudgeFailure) and outcome.reason == "schema_violation"
    assert "exactly once" in outcome.detail
    assert result.stats.reasks == 1


def test_failed_reference_decomposition_fails_its_group_only(judge_server):
    server = judge_server({"cat sits": ["refusal"]})
    cfg = config(server.base_url, reference_mode="cached-reference")
    requests = [request("rollout 1"), request("rollout 2"), request(reference="A blue kite near the top.")]
    result = run(OpenAICompatibleJudge(cfg), requests)
    assert [getattr(o, "reason", None) for o in result.outcomes] == ["refused", "refused", None]
    assert server.counters.by_kind == {"reference_assertions": 2, "coverage": 1}


def test_bad_images_are_bad_input_without_a_call(judge_server, tmp_path):
    server = judge_server()
    root = tmp_path / "images"
    root.mkdir()
    (root / "ok.png").write_bytes(IMAGE)
    (root / "corrupt.png").write_bytes(IMAGE[:40])
    (tmp_path / "secret.png").write_bytes(IMAGE)
    judge = OpenAICompatibleJudge(config(server.base_url), image_root=root)
    result = run(
        judge,
        [
            request(image="ok.png"),
            request(image="missing.png"),
            request(image="corrupt.png"),
            request(image="../secret.png"),
            request(image=str(tmp_path / "secret.png")),
            request(image=b"not an image at all"),
            request(reference=""),
        ],
    )
    reasons = [getattr(o, "reason", "ok") for o in result.outcomes]
    assert reasons == ["ok"] + ["bad_input"] * 6
    details = [o.detail for o in result.outcomes[1:]]
    assert "cannot be read" in details[0]
    assert "not a readable image" in details[1]
    assert "escapes the image root" in details[2] and "escapes the image root" in details[3]
    assert "empty" in details[5]
    assert server.counters.total == 1
    assert result.stats.rejected == 6


def test_a_new_event_loop_gets_a_working_client(judge_server, caplog):
    server = judge_server()
    judge = OpenAICompatibleJudge(config(server.base_url))
    first = asyncio.run(judge.judge_batch([request()]))
    second = asyncio.run(judge.judge_batch([request("a black cat")]))  # a new loop: must not break
    assert isinstance(first[0], Judgement) and isinstance(second[0], Judgement)
    gc.collect()  # the first loop's clients: aiohttp logs an error for any it finds unclosed
    assert not [r for r in caplog.records if "Unclosed" in r.getMessage()]


def test_closing_from_another_loop_closes_the_sessions_on_their_own(judge_server, caplog):
    # TRL runs async reward functions on a loop of its own thread; the demo closes the judge
    # afterwards with asyncio.run on the main thread
    server = judge_server()
    judge = OpenAICompatibleJudge(config(server.base_url))
    sync = SyncJudge(judge)
    try:
        assert isinstance(sync.judge_batch([request()])[0], Judgement)
        asyncio.run(judge.aclose())  # waits for the close it schedules on the judge's loop
    finally:
        sync._loop.call_soon_threadsafe(sync._loop.stop)
        sync._thread.join(timeout=30)
        sync._loop.close()
    gc.collect()
    assert not [r for r in caplog.records if "Unclosed" in r.getMessage()]


def test_a_judge_left_open_exits_without_unclosed_session_errors(judge_server):
    # aiohttp logs an error for each session garbage-collected unclosed; a one-shot script that never
    # calls aclose() must still exit quietly (calls.retire)
    server = judge_server()
    script = (
        "import asyncio, sys; sys.path.insert(0, sys.argv[2]); from judge_testkit import config, request; "
        "from balcaprl.judge import OpenAICompatibleJudge; from balcaprl.rewards import score_verdict; "
        "judge = OpenAICompatibleJudge(config(sys.argv[1])); "
        "print(score_verdict(asyncio.run(judge.judge_batch([request()]))[0].verdict).precision)"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, server.base_url, str(Path(__file__).parent)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == str(EXPECTED[0]), done.stderr
    assert "Unclosed" not in done.stderr, done.stderr


@pytest.mark.parametrize("peer", ["refuses", "hangs up"])
def test_a_failed_connection_is_a_server_error_not_a_timeout(peer):
    async def go():
        async def hang_up(reader, writer):
            await reader.read(100)
            writer.transport.abort()

        listener = await asyncio.start_server(hang_up, "127.0.0.1", 0)
        port = listener.sockets[0].getsockname()[1]
        if peer == "refuses":
            listener.close()
            await listener.wait_closed()
        judge = OpenAICompatibleJudge(config(f"http://127.0.0.1:{port}/v1"))
        try:
            return (await judge.judge_batch([request()]))[0]
        finally:
            await judge.aclose()
            listener.close()

    outcome = asyncio.run(go())
    assert isinstance(outcome, JudgeFailure) and outcome.reason == "server_error", outcome
    assert "connection failed or dropped" in outcome.detail


def test_invalid_utf8_and_control_characters_arrive_cleaned(judge_server):
    server = judge_server()
    dirty = b"a red door\x00 on the \x1b[1mleft\xff\r\n"
    result = run(OpenAICompatibleJudge(config(server.base_url)), [request(caption=dirty)])
    assert isinstance(result.outcomes[0], Judgement)
    assert list(server.counters.by_text) == ["a red door on the [1mleft\ufffd"]


class RecordingJudge:
    """The scripted judge, remembering the requests the server handed it (rubric included)."""

    def __init__(self):
        from balcaprl.testing.scripted_judge import ScriptedJudge

        self.inner, self.seen = ScriptedJudge(), []

    async def judge_batch(self, requests):
        self.seen.extend(requests)
        return await self.inner.judge_batch(requests)


@pytest.mark.parametrize("mode", ["joint", "cached-reference"])
def test_the_server_tells_the_rubric_from_the_text_alone(judge_server, mode):
    recording = RecordingJudge()
    server = judge_server(judge=recording)
    requests = [request(rubric="evaluation"), request("a black cat", rubric="training")]
    result = run(OpenAICompatibleJudge(config(server.base_url, reference_mode=mode)), requests)
    assert all(isinstance(o, Judgement) for o in result.outcomes)
    by_caption = {r.caption: r.rubric for r in recording.seen if r.caption != r.reference}
    assert by_caption == {CAPTION: "evaluation", "a black cat": "training"}


def test_an_edited_rubric_never_reuses_cached_verdicts(judge_server, tmp_path, monkeypatch):
    import balcaprl.judge.rubrics as rubrics
    from balcaprl.judge.rubrics import load_rubric
    from balcaprl.testing import rubrics as lookup

    server = judge_server()
    cfg = config(server.base_url, cache_path=tmp_path / "judge.sqlite")
    old = OpenAICompatibleJudge(cfg)
    old_version = old.rubric_version()
    run(old, [request()])
    original = rubrics._part
    monkeypatch.setattr(
        rubrics, "_part", lambda part: original(part) + (" Be brief." if part == "linguistic" else "")
    )
    load_rubric.cache_clear()
    try:
        edited = OpenAICompatibleJudge(cfg)
        assert edited.rubric_version() != old_version
        result = run(edited, [request()])
    finally:
        monkeypatch.undo()
        load_rubric.cache_clear()  # nothing composed from the edited part outlives this test
        lookup._names_by_text.cache_clear()
    assert result.stats.cache_hits == 0 and result.stats.judged == 1 and server.counters.total == 2
    again = run(OpenAICompatibleJudge(cfg), [request()])  # the old text again: its verdict is still there
    assert again.stats.cache_hits == 1 and server.counters.total == 2


def test_verdict_calls_and_generic_calls_share_one_path_and_one_key_scheme(judge_server, tmp_path):
    from balcaprl.judge.calls import prompt_identity
    from balcaprl.judge.prompt import build_judge_messages
    from balcaprl.judge.rubrics import load_rubric
    from balcaprl.judge.schemas import judge_call_kind, to_verdict, verdict_schema

    server = judge_server()
    judge = OpenAICompatibleJudge(config(server.base_url, cache_path=tmp_path / "judge.sqlite"))

    async def go():
        try:
            judged = await judge.judge_batch([request()])
            caller = judge.caller()
            image = judge.images.load(IMAGE)
            rubric = load_rubric("training")
            again = await caller.call_json(
                build_judge_messages(rubric, image, reference=REFERENCE, caption=CAPTION),
                verdict_schema("training"), kind=judge_call_kind("verdict", "training"), temperature=0.0, identity=prompt_identity(rubric, image, 1024, reference=REFERENCE, caption=CAPTION),
            )  # fmt: skip
            return judged, again, caller.stats
        finally:
            await judge.aclose()

    judged, again, stats = asyncio.run(go())
    # the generic call with the verdict's identity is the verdict judge's own cache entry
    assert again.cached and to_verdict(again.value) == judged[0].verdict and server.counters.total == 1
    assert (stats.requests, stats.cache_hits, stats.calls) == (1, 1, 0)


def test_the_server_reports_the_clients_own_token_estimate(judge_server):
    from balcaprl.judge.images import ImageLoader
    from balcaprl.judge.prompt import build_judge_messages
    from balcaprl.judge.rubrics import load_rubric
    from balcaprl.judge.tokens import approx_image_tokens, approx_prompt_tokens, approx_tokens

    server = judge_server()
    judge = OpenAICompatibleJudge(config(server.base_url, max_image_side=32))  # IMAGE is 32 x 32
    result = run(judge, [request()])
    messages = build_judge_messages(load_rubric("training"), ImageLoader(32).load(IMAGE), reference=REFERENCE,
                                    caption=CAPTION)  # fmt: skip
    text = messages[0]["content"] + messages[1]["content"][1]["text"]
    assert approx_image_tokens(32, 32) == 85 + 170  # one tile
    estimate = approx_prompt_tokens(messages, 32)
    assert (
        estimate
        == approx_tokens(messages[0]["content"]) + approx_tokens(messages[1]["content"][1]["text"]) + 255
    )
    assert estimate >= len(text) / 4 + 255
    # what the client's rate limiter budgets is what the loopback server reports as the usage
    assert result.stats.prompt_tokens == estimate == judge._endpoint.estimate_tokens(messages)
