"""Generic calls (`JudgeCaller`) over real HTTP against the loopback server's scripted handler:
what goes on the wire, caching and its keys, coalescing, re-asks, failures, accounting."""

from __future__ import annotations

import asyncio
import json

import pytest
from judge_testkit import IMAGE, config, request
from pydantic import BaseModel, ConfigDict

from balcaprl.judge import JudgeCache, JudgeCaller, JudgeConfigError, Judgement, OpenAICompatibleJudge
from balcaprl.testing.judge_server import GenericCall


class Sum(BaseModel):
    model_config = ConfigDict(extra="forbid")
    total: int
    note: str


SYSTEM = "Add the numbers."


def messages(text: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]


class Adder:
    """Answers JSON calls with the sum of the integers in the user text, text calls with 'sum=N'."""

    def __init__(self):
        self.calls: list[GenericCall] = []

    def __call__(self, call: GenericCall):
        self.calls.append(call)
        total = sum(int(w) for w in call.text.split() if w.lstrip("-").isdigit())
        if call.schema_name is None:
            return f"sum={total}"
        return {"total": total, "note": f"{call.kind}:{call.temperature}"}


def run(coro_fn):
    return asyncio.run(coro_fn())


def test_json_and_text_calls_over_http(judge_server, tmp_path):
    adder = Adder()
    server = judge_server(handler=adder)
    caller = JudgeCaller(config(server.base_url, temperature=0.0, max_tokens=64))

    async def go():
        async with caller:
            a = await caller.call_json(messages("2 3 4"), Sum, kind="add", temperature=0.0)
            b = await caller.call_text(
                messages("5 6"), kind="add_text", temperature=0.7, extra_body={"top_p": 0.9}
            )
            return a, b

    a, b = run(go)
    assert a.ok and a.value == Sum(total=9, note="add:0.0") and not a.cached
    assert b.ok and b.value == "sum=11"
    first, second = adder.calls
    # the server knows the step from the response format's name; a free-text call under a system
    # message that is no packaged rubric has no kind
    assert first.kind == "add" and first.schema_name == "balcaprl_add" and second.kind is None
    assert first.schema["additionalProperties"] is False and set(first.schema["required"]) == {
        "total",
        "note",
    }
    assert first.body["response_format"]["json_schema"]["strict"] is True
    assert first.max_tokens == 64 and first.temperature == 0.0
    assert "response_format" not in second.body and second.temperature == 0.7 and second.body["top_p"] == 0.9
    stats = caller.stats
    assert (stats.requests, stats.judged, stats.calls, stats.cache_hits) == (2, 2, 2, 0)
    assert stats.prompt_tokens > 0 and stats.completion_tokens > 0
    assert a.prompt_tokens > 0 and server.counters.by_kind == {"add": 1, "generic": 1}


def test_cache_keys_and_resume(judge_server, tmp_path):
    adder = Adder()
    server = judge_server(handler=adder)
    cfg = config(server.base_url, cache_path=tmp_path / "cache.sqlite")

    async def ask(caller, **kw):
        return await caller.call_json(messages("1 2"), Sum, kind="add", **{"temperature": 0.0, **kw})

    async def first_run():
        async with JudgeCaller(cfg) as caller:
            results = [
                await ask(caller),
                await ask(caller),
                await ask(caller, trial=1),
                await ask(caller, temperature=1.0),
            ]
            return results, caller.stats

    results, stats = run(first_run)
    assert [r.cached for r in results] == [False, True, False, False]
    assert len(adder.calls) == 3 and stats.cache_hits == 1
    assert len({r.key for r in results}) == 3  # trial and temperature are part of the key

    async def second_run():  # a new process: everything comes from the sqlite cache
        async with JudgeCaller(cfg) as caller:
            return [await ask(caller), await ask(caller, trial=1)], caller.stats

    again, stats = run(second_run)
    assert all(r.cached and r.value.total == 3 for r in again) and len(adder.calls) == 3
    assert stats.calls == 0 and stats.cache_hits == 2


def test_identity_stands_in_for_the_messages(judge_server):
    caller = JudgeCaller(config("http://127.0.0.1:9/v1"), cache=None)
    by_identity = caller.key("k", temperature=0.0, identity={"image_sha256": "ab", "prompt": "p"})
    assert by_identity == caller.key("k", temperature=0.0, identity={"prompt": "p", "image_sha256": "ab"})
    assert by_identity != caller.key("k", temperature=0.0, identity={"image_sha256": "ab", "prompt": "q"})
    assert caller.key("k", temperature=0.0, messages=messages("1")) != caller.key(
        "k", temperature=0.0, messages=messages("2")
    )
    assert caller.key("k", temperature=0.0, messages=messages("1")) != caller.key(
        "k", temperature=0.0, messages=messages("1"), schema=Sum
    )
    with pytest.raises(ValueError, match="exactly one"):
        caller.key("k", temperature=0.0)
    with pytest.raises(ValueError, match="need an `identity`"):  # messages built lazily: no hash to take
        asyncio.run(caller.call(lambda: messages("1"), kind="k", temperature=0.0))
    # an identity is kept apart from the key's own fields: it cannot stand in for another model
    assert caller.key("k", temperature=0.0, identity={"model": "other"}) != JudgeCaller(
        config("http://127.0.0.1:9/v1", model="other"), cache=None
    ).key("k", temperature=0.0, identity={})


def test_identical_calls_in_flight_share_one(judge_server):
    adder = Adder()
    server = judge_server(handler=adder, always="slow:0.2")

    async def go():
        async with JudgeCaller(config(server.base_url)) as caller:
            results = await asyncio.gather(
                *[caller.call_json(messages("7 8"), Sum, kind="add", temperature=0.0) for _ in range(5)]
            )
            return results, caller.stats

    results, stats = run(go)
    assert len(adder.calls) == 1 and all(r.value.total == 15 for r in results)
    assert sum(r.shared for r in results) == 4 and stats.coalesced == 4 and stats.calls == 1


@pytest.mark.parametrize(
    ("faults", "reason", "hits"),
    [
        (["invalid_json"], None, 2),  # re-asked once, then fine
        (["schema_violation", "schema_violation"], "schema_violation", 2),
        (["truncated"], "truncated_output", 1),
        (["refusal"], "refused", 1),
        (["content_filter"], "refused", 1),
        (["server_error", "server_error"], "server_error", 2),  # 1 try + 1 SDK retry
        (["rate_limit", "rate_limit"], "rate_limited", 2),
        (["drop", "drop"], "server_error", 2),
    ],
)
def test_faults_become_failure_reasons(judge_server, tmp_path, faults, reason, hits):
    adder = Adder()
    server = judge_server({"FAULTY": faults}, handler=adder)
    cfg = config(server.base_url, max_retries=1, cache_path=tmp_path / "c.sqlite")

    async def go():
        async with JudgeCaller(cfg) as caller:
            bad = await caller.call_json(messages("FAULTY 1 2"), Sum, kind="add", temperature=0.0)
            good = await caller.call_json(messages("3 4"), Sum, kind="add", temperature=0.0)
            return bad, good, caller.stats

    bad, good, stats = run(go)
    assert good.ok and good.value.total == 7
    assert server.counters.by_text["FAULTY 1 2"] == hits
    if reason is None:
        assert bad.ok and bad.value.total == 3 and stats.reasks == 1
    else:
        assert bad.failure is not None and bad.failure.reason == reason and bad.value is None
        assert stats.failures == {reason: 1}
        cache = JudgeCache(tmp_path / "c.sqlite")
        assert cache.get(bad.key) is None and cache.get(good.key) is not None  # failures never cached
        cache.close()


def test_text_answers_accept_and_empty(judge_server):
    def handler(call: GenericCall):
        return {"letter": "   ", "maybe": "Perhaps B"}.get(call.text, "A")

    server = judge_server(handler=handler)

    def letter(text: str) -> None:
        if text.strip() not in ("A", "B"):
            raise ValueError(f"expected a single letter, got {text!r}")

    async def go():
        async with JudgeCaller(config(server.base_url)) as caller:
            empty = await caller.call_text(messages("letter"), kind="qa", temperature=0.0)
            rejected = await caller.call_text(messages("maybe"), kind="qa", temperature=0.0, accept=letter)
            fine = await caller.call_text(messages("other"), kind="qa", temperature=0.0, accept=letter)
            return empty, rejected, fine, caller.stats

    empty, rejected, fine, stats = run(go)
    assert empty.failure.reason == "invalid_json" and server.counters.by_text["letter"] == 1  # no re-ask
    assert rejected.failure.reason == "schema_violation" and server.counters.by_text["maybe"] == 2
    assert "single letter" in rejected.failure.detail
    assert fine.value == "A" and stats.reasks == 1


def test_a_rejected_key_raises(judge_server):
    server = judge_server({"x": ["unauthorized"]}, handler=Adder())

    async def go():
        async with JudgeCaller(config(server.base_url)) as caller:
            await caller.call_text(messages("x"), kind="qa", temperature=0.0)

    with pytest.raises(JudgeConfigError, match="HTTP 401"):
        run(go)


def test_a_judge_lends_its_endpoint_and_cache(judge_server, tmp_path):
    adder = Adder()
    server = judge_server(handler=adder)
    judge = OpenAICompatibleJudge(config(server.base_url, cache_path=tmp_path / "c.sqlite"))

    async def go():
        caller = judge.caller()
        try:
            verdict = (await judge.judge_batch([request()]))[0]
            answer = await caller.call_json(messages("1 1"), Sum, kind="add", temperature=0.0)
            assert caller.endpoint is judge._endpoint and caller.cache is judge.cache
            await caller.aclose()  # closes nothing of the judge's
            again = await caller.call_json(messages("1 1"), Sum, kind="add", temperature=0.0)
            return verdict, answer, again
        finally:
            await judge.aclose()

    verdict, answer, again = run(go)
    assert isinstance(verdict, Judgement) and answer.value.total == 2 and again.cached
    assert server.counters.by_kind["verdict"] == 1 and len(adder.calls) == 1


def test_generic_requests_carry_images(judge_server):
    seen = []
    server = judge_server(handler=lambda call: seen.append(call) or "ok")
    from balcaprl.judge.images import ImageLoader

    image = ImageLoader(1024).load(IMAGE)
    msgs = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": image.data_url}},
                                     {"type": "text", "text": "what is it"}]},
    ]  # fmt: skip

    async def go():
        async with JudgeCaller(config(server.base_url)) as caller:
            return await caller.call_text(msgs, kind="look", temperature=0.0)

    assert run(go).value == "ok"
    assert seen[0].images == [IMAGE] and seen[0].text == "what is it"
    assert json.loads(json.dumps(seen[0].messages))[1]["content"][1]["text"] == "what is it"
