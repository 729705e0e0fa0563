"""Unit cases over real HTTP against a loopback server that answers from a script: what goes on the
wire, and how each kind of answer is classified."""

from __future__ import annotations

import asyncio
import gzip
import json
import time
import zlib
from datetime import UTC

import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st
from judge_testkit import CAPTION, REFERENCE, config, request

from balcaprl.judge import JudgeFailure, Judgement, OpenAICompatibleJudge
from balcaprl.judge.rubrics import load_rubric
from balcaprl.rewards import score_verdict

VERDICT = {
    "caption_assertions": [
        {"text": "a red door", "pointable": True, "visible": True},
        {"text": "a cozy feel", "pointable": False, "visible": False},
    ],
    "reference_assertions": [
        {"text": "a red door", "covered": True},
        {"text": "a cat", "covered": False},
        {"text": "a step", "covered": True},
    ],  # fmt: skip
    "clarity": 10,
    "fluency": 10,
    "coherency": 1,
    "explanation": "ok",
}


def completion(content=None, finish_reason="stop", refusal=None, usage=(120, 30), choices=True):
    message = {"role": "assistant", "content": content, "refusal": refusal}
    return {
        "id": "x",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}] if choices else [],
        "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)},
    }


class ScriptedAnswers:
    """A loopback HTTP server answering chat completions in order from ``responses`` (dicts, raw
    bytes, or (status, headers, body)); it records every request body it receives."""

    def __init__(self, responses):
        self.queue, self.seen, self.runner = list(responses), [], None

    async def handle(self, req: web.Request) -> web.Response:
        self.seen.append(json.loads(await req.read()))
        item = self.queue.pop(0)
        if callable(item):  # a handler of its own: (request) -> response
            return await item(req)
        if isinstance(item, bytes):
            return web.Response(body=item, content_type="application/json")
        if isinstance(item, tuple):
            status, headers, body = item
            if isinstance(body, bytes):
                return web.Response(
                    body=body, status=status, headers=headers, content_type="application/json"
                )
            return web.json_response(body, status=status, headers=headers)
        return web.json_response(item)

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/v1"


def judge_with(responses, **overrides):
    """A judge factory and the server whose scripted answers it will get (see :func:`judge_one`)."""
    server = ScriptedAnswers(responses)
    return (lambda base_url: OpenAICompatibleJudge(config(base_url, **overrides))), server


def judge_one(judge_and_server, req=None):
    make_judge, server = judge_and_server

    async def go():
        judge = make_judge(await server.start())
        try:
            return await judge.judge_batch_with_stats([req or request()])
        finally:
            await judge.aclose()
            await server.runner.cleanup()

    return asyncio.run(go())


def test_the_length_bounds_admit_what_they_name():
    at_bounds = {
        **VERDICT,
        "explanation": "x" * 4000,
        "caption_assertions": [VERDICT["caption_assertions"][0]] * 512,
        "reference_assertions": [{"text": "a" * 1000, "covered": True}],
    }
    result = judge_one(judge_with([completion(json.dumps(at_bounds))]))
    assert isinstance(result.outcomes[0], Judgement)


def test_request_body_structured_output_sampling_and_layout():
    scripted = judge_with([completion(json.dumps(VERDICT))], temperature=0.0, max_tokens=777)
    result = judge_one(scripted)
    (body,) = scripted[1].seen
    assert body["model"] == "scripted"
    assert body["temperature"] == 0.0 and body["max_completion_tokens"] == 777
    fmt = body["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["strict"] is True
    schema = fmt["json_schema"]["schema"]
    assert schema["additionalProperties"] is False
    assert set(schema["required"]) == set(VERDICT)
    assert "minLength" not in json.dumps(schema) and "maximum" not in json.dumps(schema)  # portable subset
    system, user = body["messages"]
    assert system == {"role": "system", "content": load_rubric("training").text}
    assert [p["type"] for p in user["content"]] == ["image_url", "text"]  # rubric, then image, then text
    assert user["content"][0]["image_url"]["url"].startswith("data:image/png;base64,")
    text = user["content"][1]["text"]
    assert text.index("<reference>") < text.index("<caption>")  # the per-rollout part comes last
    assert f"<caption>\n{CAPTION}\n</caption>" in text and f"<reference>\n{REFERENCE}\n</reference>" in text
    (outcome,) = result.outcomes
    assert isinstance(outcome, Judgement)
    # precision 1/2, recall 2/3, linguistic (9 + 9 + 0) / 27
    assert score_verdict(outcome.verdict).as_tuple() == pytest.approx((0.5, 2 / 3, 18 / 27))
    assert (result.stats.prompt_tokens, result.stats.completion_tokens) == (120, 30)


def test_null_temperature_is_omitted():
    scripted = judge_with([completion(json.dumps(VERDICT))], temperature=None)
    judge_one(scripted)
    assert "temperature" not in scripted[1].seen[0]


def test_reask_carries_the_rejected_answer_and_the_problem():
    bad = dict(VERDICT, clarity=0)
    scripted = judge_with([completion(json.dumps(bad)), completion(json.dumps(VERDICT))])
    result = judge_one(scripted)
    assert isinstance(result.outcomes[0], Judgement)
    first, second = scripted[1].seen
    assert len(second["messages"]) == len(first["messages"]) + 2
    assert second["messages"][-2] == {"role": "assistant", "content": json.dumps(bad)}
    assert (
        "schema_violation" in second["messages"][-1]["content"]
        and "clarity" in second["messages"][-1]["content"]
    )
    # both calls' tokens are accounted, the rejected one included
    assert result.stats.calls == 2 and result.stats.reasks == 1 and result.stats.prompt_tokens == 240


@pytest.mark.parametrize(
    ("answers", "reason"),
    [
        ([completion('{"caption_assertions": ['), completion("still { not json")], "invalid_json"),
        ([completion(""), completion(None)], "invalid_json"),
        ([completion(choices=False), completion(choices=False)], "invalid_json"),
        ([b"<html>oops</html>", b'["not", "a", "completion"]'], "invalid_json"),  # not a chat completion
        ([{"choices": [{"message": "?"}]}, {"choices": [None]}], "invalid_json"),  # malformed fields
        ([completion(json.dumps({**VERDICT, "extra": 1}))] * 2, "schema_violation"),
        ([completion(json.dumps({**VERDICT, "reference_assertions": []}))] * 2, "schema_violation"),
        ([completion(json.dumps({**VERDICT, "clarity": "8"}))] * 2, "schema_violation"),
        ([completion(json.dumps(VERDICT)[:50], finish_reason="length")], "truncated_output"),
        ([completion(None, refusal="I cannot help with that.")], "refused"),
        ([completion(None, finish_reason="content_filter")], "refused"),
        ([(400, {}, {"error": {"message": "image too large"}})], "bad_input"),
        ([(422, {}, {"error": {"message": "bad"}})], "bad_input"),
        # past a length bound of the schema: a failure at once, not re-asked (schemas.MAX_*)
        ([completion(json.dumps({**VERDICT, "explanation": "x" * 4001}))], "oversized_answer"),
        (
            [
                completion(
                    json.dumps({**VERDICT, "caption_assertions": [VERDICT["caption_assertions"][0]] * 513})
                )
            ],
            "oversized_answer",
        ),  # fmt: skip
        (
            [
                completion(
                    json.dumps({**VERDICT, "reference_assertions": [{"text": "a" * 1001, "covered": True}]})
                )
            ],
            "oversized_answer",
        ),  # fmt: skip
    ],
)
def test_answers_are_classified(answers, reason):
    scripted = judge_with(answers)
    result = judge_one(scripted)
    (outcome,) = result.outcomes
    assert isinstance(outcome, JudgeFailure) and outcome.reason == reason
    assert len(scripted[1].seen) == len(answers)  # exactly one re-ask for invalid answers, none otherwise


def test_retry_after_is_honoured():
    scripted = judge_with(
        [(429, {"retry-after": "0.3"}, {"error": {"message": "slow down"}}), completion(json.dumps(VERDICT))],
        max_retries=1,
    )
    start = time.perf_counter()
    result = judge_one(scripted)
    assert isinstance(result.outcomes[0], Judgement)
    assert len(scripted[1].seen) == 2 and time.perf_counter() - start >= 0.3


def test_rate_limiters_are_acquired_per_attempt(monkeypatch):
    acquired: list[tuple[float, float]] = []

    class RecordingLimiter:
        def __init__(self, capacity, window_s=60.0):
            self.max_rate = capacity

        async def acquire(self, amount=1):
            acquired.append((self.max_rate, amount))

    monkeypatch.setattr("balcaprl.judge.calls.RateWindow", RecordingLimiter)
    scripted = judge_with([completion(json.dumps(VERDICT))], requests_per_minute=500, tokens_per_minute=3000,
                          max_tokens=1000)  # fmt: skip
    judge_one(scripted)
    rpm = [a for a in acquired if a[0] == 500]
    tpm = [a for a in acquired if a[0] == 3000]
    assert rpm == [(500, 1)]
    # estimate = prompt text (~4 chars a token) + image + the answer budget (RateWindow caps it at
    # the whole window's capacity)
    (amount,) = [a[1] for a in tpm]
    assert amount > 1000


@pytest.mark.parametrize(
    ("answers", "reason", "hits"),
    [
        # the server's x-should-retry decides first, either way
        ([(500, {"x-should-retry": "false"}, {"error": {"message": "no"}})], "server_error", 1),
        (
            [
                (400, {"x-should-retry": "true"}, {"error": {"message": "again"}}),
                completion(json.dumps(VERDICT)),
            ],
            "ok",
            2,
        ),  # fmt: skip
        # a server asking for a wait longer than RETRY_AFTER_CAP_S is not retried at all
        ([(429, {"retry-after": "600"}, {"error": {"message": "come back later"}})], "rate_limited", 1),
        (
            [(409, {"retry-after-ms": "1"}, {"error": {"message": "busy"}}), completion(json.dumps(VERDICT))],
            "ok",
            2,
        ),
    ],
)
def test_which_statuses_are_retried(answers, reason, hits):
    scripted = judge_with(answers, max_retries=1)
    (outcome,) = judge_one(scripted).outcomes
    assert getattr(outcome, "reason", "ok") == reason, outcome
    assert len(scripted[1].seen) == hits


def test_the_wait_a_server_asks_for_is_read_in_every_form():
    from datetime import datetime, timedelta
    from email.utils import format_datetime

    from balcaprl.judge.calls import _retry_after_s

    assert _retry_after_s({"retry-after-ms": "250", "retry-after": "9"}) == 0.25  # milliseconds first
    assert _retry_after_s({"retry-after": "1.5"}) == 1.5
    in_a_minute = format_datetime(datetime.now(UTC) + timedelta(seconds=60), usegmt=True)
    assert 55 < _retry_after_s({"retry-after": in_a_minute}) <= 60
    assert _retry_after_s({"retry-after": "soon"}) is None and _retry_after_s({}) is None


@given(retry=st.integers(0, 40), asked=st.one_of(st.none(), st.floats(-10, 1000)))
def test_backoff_follows_the_server_or_doubles_to_a_cap(retry, asked):
    from balcaprl.judge.calls import RETRY_AFTER_CAP_S, backoff_s

    wait = backoff_s(retry, asked)
    if asked is not None and 0 < asked <= RETRY_AFTER_CAP_S:
        assert wait == asked
    else:  # 0.5 s doubling per retry up to 8 s, less a random 0-25%
        full = min(0.5 * 2**retry, 8.0)
        assert 0.75 * full <= wait <= full


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_a_compressed_answer_is_read(encoding):
    raw = json.dumps(completion(json.dumps(VERDICT))).encode()
    packed = gzip.compress(raw) if encoding == "gzip" else zlib.compress(raw)
    (outcome,) = judge_one(judge_with([(200, {"Content-Encoding": encoding}, packed)])).outcomes
    assert isinstance(outcome, Judgement) and score_verdict(outcome.verdict).precision == 0.5


def test_timeout_s_bounds_a_whole_attempt_even_a_trickling_one():
    # a byte every 50 ms: no gap between bytes ever reaches timeout_s, the whole answer would take 20 s
    async def trickle(req):
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(req)
        for _ in range(400):
            await response.write(b" ")
            await asyncio.sleep(0.05)
        return response

    scripted = judge_with([trickle], timeout_s=0.5)
    (outcome,) = judge_one(scripted).outcomes
    assert isinstance(outcome, JudgeFailure) and outcome.reason == "timeout", outcome
    assert "timeout_s (0.5 s)" in outcome.detail and len(scripted[1].seen) == 1
