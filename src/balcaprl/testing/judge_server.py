"""`balcaprl judge serve`: any :class:`Judge` behind an OpenAI-compatible `/v1/chat/completions`.

What it is for: tests and the offline demo drive the *real* judge client over *real* HTTP against a
local judge (the scripted judge, or the synthetic oracle judge), so the code path is the one a
training run takes against OpenAI or vLLM. It reads the image, reference and caption back out of the
request the client built (:func:`~balcaprl.judge.prompt.parse_judge_messages`), asks the judge, and
returns the verdict JSON as the assistant message.

Fault injection (:class:`FaultScript`) reproduces what real endpoints do: 429 with ``retry-after``,
500/503, answers slower than the client's timeout, invalid JSON, JSON cut off with finish_reason
``length``, schema violations, refusals, content filtering, dropped connections.

How a request is recognised, from what a real judge receives too (production prompts carry nothing
for this server): the verdict judge's calls by their ``response_format`` name, which names the call
and, where the schema follows the rubric, the rubric too (``balcaprl_verdict_training``,
``balcaprl_coverage_evaluation``, ``balcaprl_reference_assertions``, ``balcaprl_coverage_missing``:
:data:`~balcaprl.judge.schemas.JUDGE_CALL_KINDS`); a bare ``balcaprl_verdict`` takes its rubric from
the system message, compared with the packaged rubrics (:mod:`balcaprl.testing.rubrics`). Answers
follow the variant's schema: under ``training_without_pointability`` caption assertions carry no
``pointable``; a ``coverage_missing`` follow-up is answered for the numbers it lists, only.

Generic calls (:class:`~balcaprl.judge.calls.JudgeCaller`: evaluation protocols, re-captioning) are
answered by a scripted ``handler``: any request whose ``response_format`` is not one of the verdict
judge's own schemas goes to ``handler(GenericCall)``, which returns the answer (a JSON-able object
or a text) or a :class:`~balcaprl.judge.protocol.JudgeFailure`. The same fault script applies,
matched against the request's user text.

The usage it reports is :func:`balcaprl.judge.tokens.approx_prompt_tokens` (the client's own
estimate) with the request's largest image side, and ``approx_tokens`` of the answer.

What it reads is bounded: a request body larger than :data:`MAX_BODY_BYTES` is answered 413 (from
its ``Content-Length`` before a byte of it is read, or as soon as a chunked body passes the limit:
the body is read in the chunks the connection delivers), so a 200 MB body costs the server no more
than the limit. Every request it cannot read as a call of a protocol it serves is answered 400
naming what is wrong, never 500: a 500 is an injected fault (or a bug in this server).

Binds to 127.0.0.1 by default (port 0 picks a free port); it has no authentication unless ``api_key``
is given, so do not expose it.
"""

from __future__ import annotations

import asyncio
import inspect
import io
import itertools
import math
import random
import socket
import threading
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from PIL import Image, UnidentifiedImageError

from balcaprl.errors import ConfigError
from balcaprl.judge.images import decode_data_url
from balcaprl.judge.prompt import ParsedJudgeMessages, followup_ids, parse_judge_messages
from balcaprl.judge.protocol import Judge, JudgeFailure, Judgement, JudgeRequest, SupportsFixedReference
from balcaprl.judge.rubrics import VERDICT_RUBRICS
from balcaprl.judge.schemas import JUDGE_CALL_KINDS, schema_name
from balcaprl.judge.tokens import approx_prompt_tokens, approx_tokens
from balcaprl.testing.hostile_answers import HOSTILE_FAULTS, hostile_response
from balcaprl.testing.rubrics import packaged_rubric_name

FAULTS = (
    "ok",
    "rate_limit",  # 429 with retry-after (seconds); "rate_limit:<seconds>" after that long
    "server_error",  # 500
    "unavailable",  # 503
    "slow",  # sleep FaultScript.slow_s (or "slow:<seconds>") before answering
    "invalid_json",
    "truncated",  # half the JSON, finish_reason "length"
    "schema_violation",  # valid JSON, clarity 11 (or an empty reference list)
    "wrong_ids",  # coverage answer whose ids are not 1..M
    "skip_ids",  # coverage answer (or follow-up) that leaves out the second half of its marks
    "refusal",  # message.refusal set, no content
    "content_filter",  # finish_reason "content_filter"
    "drop",  # the connection is closed in the middle of the response
    "unauthorized",  # 401
    "echo_auth",  # 500 whose body repeats the Authorization header (tests secret redaction)
    *HOSTILE_FAULTS,  # answers whose size is the attack (balcaprl.testing.hostile_answers)
)

# The largest request body read. What the balcaprl client sends is text and one image no longer than
# the judge's max_image_side: an RGBA PNG that does not compress at all is 4 x side^2 bytes, 4/3 more in
# base64, so 32 MiB leaves room for every max_image_side up to 2,500 pixels (2.4x the default 1024).
MAX_BODY_BYTES = 32 * 2**20
# the verdict judge's own calls: response-format name -> (call, rubric or None)
_JUDGE_KINDS = {schema_name(kind): call for kind, call in JUDGE_CALL_KINDS.items()}
_SCHEMA_PREFIX = schema_name("")


def _kind_in_schema_name(name: Any) -> str | None:
    """``<kind>`` of a ``balcaprl_<kind>`` response-format name (how the client names its schemas)."""
    return name[len(_SCHEMA_PREFIX) :] if isinstance(name, str) and name.startswith(_SCHEMA_PREFIX) else None


@dataclass
class FaultScript:
    """Which fault to inject for which request.

    ``rules`` maps a substring of the caption (or, for a reference decomposition, of the reference)
    to a list of faults: each matching hit takes the next one; when the list is used up, "ok".
    ``always`` is applied to every request without a matching rule (e.g. "slow" for a benchmark).
    """

    rules: dict[str, list[str]] = field(default_factory=dict)
    always: str = "ok"
    retry_after_s: float = 0.02
    slow_s: float = 2.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        example = '{"rules": {"CAPTION TEXT": ["rate_limit", "ok"]}, "always": "ok"}'
        if not isinstance(self.rules, dict):
            raise ConfigError(
                f"fault script: 'rules' must map caption text to a list of faults, e.g. {example}"
            )
        for needle, faults in self.rules.items():
            if not isinstance(faults, list) or not all(isinstance(f, str) for f in faults):
                got = f"the string {faults!r}" if isinstance(faults, str) else type(faults).__name__
                raise ConfigError(
                    f"fault script: rules[{needle!r}] must be a list of faults (one per matching request), "
                    f"got {got}; e.g. {example}"
                )
        if not isinstance(self.always, str):
            raise ConfigError(f"fault script: 'always' must be one fault name, got {self.always!r}")
        for fault in [self.always, *itertools.chain.from_iterable(self.rules.values())]:
            if fault.split(":")[0] not in FAULTS:
                raise ConfigError(f"unknown fault '{fault}'; choose from {', '.join(FAULTS)}")

    def next_fault(self, text: str) -> str:
        with self._lock:
            for needle, faults in self.rules.items():
                if needle in text:
                    return faults.pop(0) if faults else "ok"
        return self.always

    @classmethod
    def from_json(cls, data: Any) -> FaultScript:
        """A script from parsed JSON; :class:`~balcaprl.errors.ConfigError` saying what is wrong."""
        allowed = {"rules", "always", "retry_after_s", "slow_s"}
        if not isinstance(data, dict):
            raise ConfigError(f"fault script: expected a JSON object with keys {sorted(allowed)}")
        unknown = set(data) - allowed
        if unknown:
            raise ConfigError(f"unknown fault-script keys {sorted(unknown)}; allowed: {sorted(allowed)}")
        for key in ("retry_after_s", "slow_s"):
            if key in data and (not isinstance(data[key], int | float) or data[key] < 0):
                raise ConfigError(f"fault script: {key} must be a number of seconds >= 0, got {data[key]!r}")
        return cls(**{k: (dict(v) if k == "rules" and isinstance(v, dict) else v) for k, v in data.items()})


@dataclass
class ServerCounters:
    """How often the server was hit: in total, per call kind and per caption/reference text."""

    total: int = 0
    in_flight: int = 0
    max_in_flight: int = 0  # the most chat requests being handled at once (checks client concurrency)
    by_kind: Counter = field(default_factory=Counter)
    by_text: Counter = field(default_factory=Counter)
    followup_ids: list[list[int]] = field(default_factory=list)  # what each coverage follow-up asked for
    arrivals: list[float] = field(default_factory=list)  # time.monotonic() of each chat request's arrival
    # requests that had arrived when the first 401/403 was answered (None: none answered yet)
    arrived_before_rejection: int | None = None


@dataclass(frozen=True)
class GenericCall:
    """A request that is not a verdict-judge call, as a scripted handler sees it."""

    kind: str | None  # the packaged rubric the system message is, else the kind in the response
    # format's name (balcaprl_<kind>), else None
    schema_name: str | None  # response_format.json_schema.name; None for a free-text request
    schema: dict[str, Any] | None
    system: str  # the system message's text ("" when there is none)
    text: str  # the first user message's text parts, joined with newlines
    images: list[bytes]  # the first user message's data-URL images, decoded
    messages: list[dict[str, Any]]  # the whole conversation (a re-ask appends two messages)
    model: str
    temperature: float | None
    max_tokens: int | None
    body: dict[str, Any]


GenericHandler = Callable[[GenericCall], "Awaitable[Any] | Any"]


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"
        )
    return ""


def checked_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The body's messages, each an object whose content is a text or a list of parts that are objects
    (a text part's text a string); ``ValueError`` saying what is not."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ValueError("the request has no messages")
    for number, message in enumerate(messages, 1):
        content = message.get("content") if isinstance(message, dict) else None
        parts = content if isinstance(content, list) else []
        if not isinstance(message, dict) or not isinstance(content, str | list | None):
            raise ValueError(f"message {number} is not an object with a text or a list of parts")
        if not all(isinstance(p, dict) and isinstance(p.get("text", ""), str) for p in parts):
            raise ValueError(f"message {number} has a part that is not an object with a text")
    return messages


def generic_call(body: dict[str, Any]) -> GenericCall:
    """Read a chat-completions body as a :class:`GenericCall`; ``ValueError`` for a malformed one."""
    messages = checked_messages(body)
    system = next((m for m in messages if m.get("role") == "system"), None)
    user = next((m for m in messages if m.get("role") == "user"), None)
    if user is None:
        raise ValueError("the request has no user message")
    system_text = _text_of(system["content"]) if system is not None else ""
    images = []
    if isinstance(user.get("content"), list):
        for part in user["content"]:
            if part.get("type") == "image_url":
                images.append(decode_data_url(part["image_url"]["url"])[1])
    json_schema = (body.get("response_format") or {}).get("json_schema") or {}
    return GenericCall(
        kind=packaged_rubric_name(system_text) or _kind_in_schema_name(json_schema.get("name")),
        schema_name=json_schema.get("name"),
        schema=json_schema.get("schema"),
        system=system_text,
        text=_text_of(user.get("content")),
        images=images,
        messages=messages,
        model=str(body.get("model", "balcaprl-local-judge")),
        temperature=body.get("temperature"),
        max_tokens=body.get("max_completion_tokens", body.get("max_tokens")),
        body=body,
    )


def _json_response(body: Any, status_code: int = 200, headers: dict[str, str] | None = None) -> Response:
    """A JSON response serialised with orjson (several times faster than the stdlib's json, and this
    server shares its machine with the client it serves in tests and the benchmark)."""
    return Response(
        orjson.dumps(body), status_code=status_code, headers=headers, media_type="application/json"
    )


async def bounded_body(request: Request, limit: int) -> bytearray | None:
    """The request's body, read chunk by chunk as the connection delivers it, or None as soon as it
    is known to be longer than ``limit`` bytes (its ``Content-Length`` says so, or the chunks pass it);
    never more than ``limit`` bytes are held."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        return None
    body = bytearray()
    async for chunk in request.stream():
        if len(body) + len(chunk) > limit:
            return None
        body += chunk
    return body


def _error(status: int, message: str, kind: str, headers: dict[str, str] | None = None):
    body = {"error": {"message": message, "type": kind, "param": None, "code": None}}
    return _json_response(body, status_code=status, headers=headers)


def _completion(
    model: str, content: str | None, finish_reason: str, prompt_tokens: int, refusal: str | None = None
):
    completion_tokens = approx_tokens(content or refusal or "")
    return {
        "id": f"chatcmpl-balcaprl-{time.monotonic_ns()}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content, "refusal": refusal},
                "finish_reason": finish_reason,
                "logprobs": None,
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def _prompt_tokens(messages: list[dict[str, Any]], images: list[bytes], model: str | None = None) -> int:
    """The client's own estimate (:mod:`balcaprl.judge.tokens`), with the largest image received, at
    the requested model's image rate."""
    side = 0
    for data in images:
        try:
            with Image.open(io.BytesIO(data)) as image:  # reads the header only
                side = max(side, *image.size)
        except (UnidentifiedImageError, OSError, ValueError):
            continue
    return approx_prompt_tokens(messages, side, model)


def _rubric(parsed: ParsedJudgeMessages, named: str | None) -> str:
    """The verdict rubric of a call: named by its schema (and then the system message must not be
    another verdict rubric: the client would have sent a schema that contradicts its prompt), else
    told from the system message (a reference decomposition has none of its own: training)."""
    system = packaged_rubric_name(parsed.system)
    system = system if system in VERDICT_RUBRICS else None
    if named is not None and system is not None and named != system:
        raise ValueError(f"the response format is rubric {named!r}'s but the system message is {system!r}")
    return named or system or "training"


def _request(parsed: ParsedJudgeMessages, caption: str, reference: str, rubric: str) -> JudgeRequest:
    image = parsed.image if parsed.image is not None else b""  # a text-only decomposition
    return JudgeRequest(image=image, caption=caption, reference=reference, rubric=rubric)  # type: ignore[arg-type]


async def _answer(
    judge: Judge, call: str, rubric: str, parsed: ParsedJudgeMessages, messages: list[dict[str, Any]]
) -> dict[str, Any] | JudgeFailure:
    """The answer object for one call, computed by the served judge."""
    if call == "reference_assertions":
        reference = parsed.reference or ""
        if isinstance(judge, SupportsFixedReference):
            texts = (await judge.decompose_references([_request(parsed, "", reference, rubric)]))[0]
        else:  # any judge: its own split of the reference is the decomposition
            outcome = (await judge.judge_batch([_request(parsed, reference, reference, rubric)]))[0]
            texts = (
                outcome
                if isinstance(outcome, JudgeFailure)
                else [a.text for a in outcome.verdict.reference_assertions]
            )
        if isinstance(texts, JudgeFailure):
            return texts
        return {"reference_assertions": [{"text": t} for t in texts]}

    caption = parsed.caption or ""
    if call in ("coverage", "coverage_missing"):
        given = parsed.reference_assertions or []
        request = _request(parsed, caption, " . ".join(given), rubric)
        if isinstance(judge, SupportsFixedReference):
            outcome = (await judge.judge_against_fixed_reference([request], [given]))[0]
        else:
            outcome = (await judge.judge_batch([request]))[0]
        if isinstance(outcome, JudgeFailure):
            return outcome
        verdict = outcome.verdict
        own = verdict.reference_assertions
        if len(own) == len(given):  # same split: match by position
            covered = [a.covered for a in own]
        else:  # a different split: match by text, anything unmatched is not covered
            by_text = {a.text.strip().lower(): a.covered for a in own}
            covered = [by_text.get(t.strip().lower(), False) for t in given]
        marks = [{"id": i, "covered": c} for i, c in enumerate(covered, 1)]
        if call == "coverage_missing":  # the follow-up: the numbers it lists, nothing else
            wanted = set(followup_ids(messages))
            return {"reference_coverage": [m for m in marks if m["id"] in wanted]}
        data = _shaped(verdict.model_dump(mode="json", exclude={"reference_assertions"}), rubric)
        data["reference_coverage"] = marks
        return data

    outcome = (await judge.judge_batch([_request(parsed, caption, parsed.reference or "", rubric)]))[0]
    if isinstance(outcome, JudgeFailure):
        return outcome
    assert isinstance(outcome, Judgement)
    return _shaped(outcome.verdict.model_dump(mode="json"), rubric)


def _shaped(data: dict[str, Any], rubric: str) -> dict[str, Any]:
    """A verdict as the rubric's wire schema has it: no `pointable` where the rubric does not ask."""
    if rubric == "training_without_pointability":
        data["caption_assertions"] = [
            {k: v for k, v in a.items() if k != "pointable"} for a in data["caption_assertions"]
        ]
    return data


def _failure_response(failure: JudgeFailure, model: str, prompt_tokens: int):
    if failure.reason == "bad_input":
        return _error(400, failure.detail or "bad input", "invalid_request_error")
    if failure.reason == "rate_limited":
        return _error(429, failure.detail or "rate limited", "rate_limit_error", {"retry-after-ms": "50"})
    if failure.reason == "timeout":
        return _error(504, failure.detail or "judge timed out", "server_error")
    if failure.reason == "refused":
        return _json_response(
            _completion(model, None, "stop", prompt_tokens, refusal=failure.detail or "refused")
        )
    if failure.reason == "truncated_output":
        return _json_response(_completion(model, "{", "length", prompt_tokens))
    return _error(500, failure.detail or failure.reason, "server_error")


def _dropping_response():
    """Start a response, then fail inside it: uvicorn closes the connection mid-body."""

    async def body():
        yield b'{"id": "chatcmpl-'
        raise ConnectionAbortedError("fault injection: dropping the connection")

    return StreamingResponse(body(), media_type="application/json")


def create_app(
    judge: Judge | None,
    faults: FaultScript | None = None,
    *,
    api_key: str | None = None,
    counters: ServerCounters | None = None,
    handler: GenericHandler | None = None,
    latency: LatencyModel | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
):
    """The FastAPI app serving ``judge`` (verdict calls) and ``handler`` (generic calls; see the
    module docstring). ``api_key``: when set, requests must carry it (else 401). ``latency``: answer
    at a real endpoint's speed (:class:`LatencyModel`; ``POST /latency/reset``, ``GET /latency``).
    ``max_body_bytes``: longer request bodies are answered 413."""
    faults = faults or FaultScript()
    counters = counters or ServerCounters()
    app = FastAPI(title="balcaprl judge server", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.counters = counters

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": "balcaprl-local-judge", "object": "model", "owned_by": "balcaprl"}],
        }

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    # A plain Starlette route, not a FastAPI endpoint: it takes the raw request and returns a ready
    # response, so FastAPI's per-request dependency solving and response serialisation (about a third
    # of this server's Python time per call in a profile) would only be overhead.
    async def chat_completions(request: Request) -> Response:
        counters.total += 1
        counters.arrivals.append(time.monotonic())
        counters.in_flight += 1
        counters.max_in_flight = max(counters.max_in_flight, counters.in_flight)
        try:
            response = await _handle(request)
            if response.status_code in (401, 403) and counters.arrived_before_rejection is None:
                counters.arrived_before_rejection = counters.total
            return response
        finally:
            counters.in_flight -= 1

    app.add_route("/v1/chat/completions", chat_completions, methods=["POST"])

    if latency is not None:

        @app.get("/latency")
        async def latency_counts() -> dict[str, int]:
            return latency.as_dict()

        @app.post("/latency/reset")
        async def latency_reset() -> dict[str, int]:
            latency.reset()
            return latency.as_dict()

    async def _timed(text: str, response: Response, streamed: bool = False) -> Response:
        return response if latency is None else await latency.deliver(text, response, streamed)

    async def _handle(request: Request):
        authorization = request.headers.get("authorization", "")
        if api_key is not None and authorization != f"Bearer {api_key}":
            return _error(401, "invalid API key", "invalid_request_error")
        over_rate = latency.admit() if latency is not None else None
        if over_rate is not None:
            return over_rate
        raw = await bounded_body(request, max_body_bytes)
        if raw is None:
            return _error(
                413, f"the request body is longer than this server's limit of {max_body_bytes:,} bytes",
                "invalid_request_error",
            )  # fmt: skip
        try:
            body = orjson.loads(raw)  # orjson's errors are ValueErrors
            if not isinstance(body, dict):
                raise ValueError("the body is not a JSON object")
            checked_messages(body)  # what every protocol reads (and the token estimate counts)
            model = str(body.get("model", "balcaprl-local-judge"))
            format_name = ((body.get("response_format") or {}).get("json_schema") or {}).get("name")
            judge_kind = _JUDGE_KINDS.get(format_name)
            call = generic_call(body) if judge_kind is None and handler is not None else None
            if call is None:
                if judge is None:
                    raise ValueError("this server answers generic calls only (it has no verdict judge)")
                kind, named_rubric = judge_kind or ("verdict", None)
                parsed = parse_judge_messages(body["messages"])
                rubric = _rubric(parsed, named_rubric)
                # a follow-up names the numbers it asks for: one that names none is malformed (400)
                asked = followup_ids(body["messages"]) if kind == "coverage_missing" else None
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            return _error(400, f"not a balcaprl judge request: {error}", "invalid_request_error")
        if call is not None:
            return await _timed(
                call.text, await _handle_generic(call, authorization), bool(body.get("stream"))
            )
        text = (parsed.reference or "") if kind == "reference_assertions" else (parsed.caption or "")
        counters.by_kind[kind] += 1
        counters.by_text[text] += 1
        if asked is not None:
            counters.followup_ids.append(asked)
        prompt_tokens = _prompt_tokens(body["messages"], [parsed.image] if parsed.image else [], model)

        fault = faults.next_fault(text)
        name, _, arg = fault.partition(":")
        early = await _transport_fault(name, arg, model, prompt_tokens, authorization)
        if early is not None:
            return early

        answer = await _answer(judge, kind, rubric, parsed, body["messages"])
        if isinstance(answer, JudgeFailure):
            return await _timed(text, _failure_response(answer, model, prompt_tokens))
        if name == "schema_violation":
            if "clarity" in answer:
                answer["clarity"] = 11
            else:
                answer["reference_assertions"] = []
        if name == "wrong_ids" and "reference_coverage" in answer:
            for mark in answer["reference_coverage"]:
                mark["id"] += 1
        if name == "skip_ids" and "reference_coverage" in answer:
            marks = answer["reference_coverage"]
            answer["reference_coverage"] = marks[: len(marks) // 2]
        if name in HOSTILE_FAULTS:  # balcaprl.testing.hostile_answers
            return hostile_response(fault, orjson.dumps(answer).decode(), model)
        content = _content_response(name, orjson.dumps(answer).decode(), model, prompt_tokens)
        return await _timed(text, content, bool(body.get("stream")))

    async def _handle_generic(call: GenericCall, authorization: str):
        counters.by_kind[call.kind or "generic"] += 1
        counters.by_text[call.text] += 1
        prompt_tokens = _prompt_tokens(call.messages, call.images, call.model)
        fault = faults.next_fault(call.text)
        name, _, arg = fault.partition(":")
        early = await _transport_fault(name, arg, call.model, prompt_tokens, authorization)
        if early is not None:
            return early
        assert handler is not None
        try:
            answer = handler(call)
            if inspect.isawaitable(answer):
                answer = await answer
        except (ValueError, LookupError, TypeError, AttributeError) as error:  # what it could not read
            return _error(400, f"not a request this judge can answer: {error}", "invalid_request_error")
        if isinstance(answer, JudgeFailure):
            return _failure_response(answer, call.model, prompt_tokens)
        if isinstance(answer, str):
            content = answer
        else:
            content = orjson.dumps(
                {"unexpected": True} if name == "schema_violation" else answer, option=orjson.OPT_NON_STR_KEYS
            ).decode()
        if name in HOSTILE_FAULTS:  # balcaprl.testing.hostile_answers
            return hostile_response(fault, content, call.model)
        return _content_response(name, content, call.model, prompt_tokens)

    async def _transport_fault(name: str, arg: str, model: str, prompt_tokens: int, authorization: str):
        """The response for a fault that replaces the answer (None: answer, then maybe spoil it)."""
        # retry-after on 5xx too, so the SDK's retries in tests wait milliseconds, not its 0.5 s backoff
        wait = {"retry-after-ms": str(max(1, int(faults.retry_after_s * 1000)))}
        if name == "rate_limit":  # "rate_limit:<seconds>": an endpoint that takes that long to refuse
            await asyncio.sleep(float(arg) if arg else 0.0)
            return _error(
                429,
                "rate limited (fault injection)",
                "rate_limit_error",
                {"retry-after": f"{faults.retry_after_s:g}"},
            )
        if name == "server_error":
            return _error(500, "internal error (fault injection)", "server_error", wait)
        if name == "unavailable":
            return _error(503, "overloaded (fault injection)", "server_error", wait)
        if name == "unauthorized":
            return _error(401, "invalid API key (fault injection)", "invalid_request_error")
        if name == "echo_auth":
            return _error(
                500, f"upstream failed for request with header Authorization: {authorization}", "server_error"
            )
        if name == "slow":
            await asyncio.sleep(float(arg) if arg else faults.slow_s)
        if name == "drop":
            return _dropping_response()
        if name == "refusal":
            return _json_response(
                _completion(model, None, "stop", prompt_tokens, refusal="I can't help with that.")
            )
        if name == "content_filter":
            return _json_response(_completion(model, None, "content_filter", prompt_tokens))
        return None

    def _content_response(name: str, content: str, model: str, prompt_tokens: int):
        if name == "invalid_json":
            return _json_response(
                _completion(model, "Here is the verdict: {caption_assertions: [", "stop", prompt_tokens)
            )
        if name == "truncated":
            return _json_response(_completion(model, content[: len(content) // 2], "length", prompt_tokens))
        return _json_response(_completion(model, content, "stop", prompt_tokens))

    return app


# ----------------------------------------------------------------------------------------------------
# The latency model: a judge at a real endpoint's speed (issue 24; kept apart from the fault script).
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AttemptTiming:
    """When one attempt's answer arrives: nothing for ``first_byte_s``, then the body in pieces until
    ``total_s``; a ``stalled`` attempt sends nothing at all (the client must give up on it)."""

    first_byte_s: float
    total_s: float
    stalled: bool


@dataclass
class LatencyModel:
    """How long a judge takes, per attempt, deterministically from ``(seed, text, attempt number)``.

    The time to the first token is ``first_byte_s`` times a lognormal factor ``exp(sigma * z)``
    (queueing and prefill at a loaded endpoint: the heavy tail); decoding the answer then takes
    ``per_char_s`` per character of the caption (a judge's answer restates the caption's assertions,
    so its decode time grows with the caption) times a milder factor ``exp(decode_sigma * z')``. With
    the defaults a call with a typical caption (700 characters) has a median about 6 s and a p99
    about 30 s, as measured against a hosted judge. A streamed request (``"stream": true``) gets its answer
    as server-sent events in ``chunks`` pieces from the first token on (usage in the last event, as
    ``stream_options.include_usage`` asks); an unstreamed one gets nothing until the whole answer is
    ready, as from a real endpoint. With probability ``stall_p`` an attempt stalls -- and the first
    attempt at a text containing one of ``stall_first`` always does: nothing is sent for ``stall_s``
    (longer than any timeout). Above ``rpm_cap``
    requests in the last minute the answer is 429 with ``retry-after`` (the request is not served and
    draws no latency). ``time_scale`` divides every duration, and the minute of ``rpm_cap`` too, so
    a benchmark runs a real endpoint's shape 10x faster. ``trickle_bytes_per_s`` instead sends the
    body at that rate from the first token on (an answer that trickles in forever).

    The n-th attempt at a text (counted here, :meth:`reset` between benchmark runs) always gets the
    n-th draw, so two schedules that send the same captions see the same first-attempt latencies.
    """

    seed: int = 0
    time_scale: float = 1.0
    first_byte_s: float = 1.8
    per_char_s: float = 0.006
    sigma: float = 1.12
    decode_sigma: float = 0.25
    stall_p: float = 0.0
    stall_s: float = 3600.0
    rpm_cap: int | None = None
    chunks: int = 8
    trickle_bytes_per_s: float | None = None
    stall_first: list[str] = field(default_factory=list)
    served: int = 0
    stalls: int = 0
    rate_limited: int = 0
    _attempts: Counter = field(default_factory=Counter, repr=False)
    _admitted: deque = field(default_factory=deque, repr=False)

    def timing(self, text: str, attempt: int) -> AttemptTiming:
        """The ``attempt``-th (0-based) attempt at ``text``: a pure function of the model's fields."""
        draw = random.Random(f"{self.seed}|{attempt}|{text}")
        queue, decode = (
            math.exp(self.sigma * draw.gauss(0.0, 1.0)),
            math.exp(self.decode_sigma * draw.gauss(0.0, 1.0)),
        )
        stalled = draw.random() < self.stall_p
        first = self.first_byte_s * queue / self.time_scale
        total = first + self.per_char_s * len(text) * decode / self.time_scale
        return AttemptTiming(first, total, stalled)

    def reset(self) -> None:
        self._attempts.clear()
        self._admitted.clear()
        self.served = self.stalls = self.rate_limited = 0

    def admit(self) -> Response | None:
        """None when the request is within ``rpm_cap``, else the 429 to answer."""
        if self.rpm_cap is None:
            return None
        now, minute = time.monotonic(), 60.0 / self.time_scale
        while self._admitted and self._admitted[0] <= now - minute:
            self._admitted.popleft()
        if len(self._admitted) < self.rpm_cap:
            self._admitted.append(now)
            return None
        self.rate_limited += 1
        wait = self._admitted[0] + minute - now
        return _error(
            429, "rate limit reached for requests per minute (latency model)", "rate_limit_error",
            {"retry-after-ms": str(max(1, int(wait * 1000)))},
        )  # fmt: skip

    async def deliver(self, text: str, response: Response, streamed: bool = False) -> Response:
        """``response`` (a ready, non-streamed one) as this model sends it for the next attempt at
        ``text``: at its first token as events (``streamed``), else whole when it is all decoded."""
        attempt = self._attempts[text]
        timing = self.timing(text, attempt)
        self._attempts[text] += 1
        self.served += 1
        if timing.stalled or (attempt == 0 and any(needle in text for needle in self.stall_first)):
            self.stalls += 1
            await asyncio.sleep(self.stall_s)
        body = bytes(response.body)
        events = _as_events(body) if streamed and response.status_code == 200 else None
        if self.trickle_bytes_per_s is not None:
            await asyncio.sleep(timing.first_byte_s)
            pieces, gap = [body[i : i + 1] for i in range(len(body))], 1.0 / self.trickle_bytes_per_s
        elif events is None:  # unstreamed: nothing until the answer is whole
            await asyncio.sleep(timing.total_s)
            return response
        else:
            await asyncio.sleep(timing.first_byte_s)
            pieces = events(self.chunks)
            gap = (timing.total_s - timing.first_byte_s) / max(1, len(pieces) - 1)

        async def trickle():
            for i, piece in enumerate(pieces):
                if i:
                    await asyncio.sleep(gap)
                yield piece

        headers = {
            k: v for k, v in response.headers.items() if k.lower() not in ("content-length", "content-type")
        }
        media_type = "text/event-stream" if events is not None else response.media_type
        return StreamingResponse(
            trickle(), status_code=response.status_code, headers=headers, media_type=media_type
        )

    def as_dict(self) -> dict[str, int]:
        return {"served": self.served, "stalls": self.stalls, "rate_limited": self.rate_limited}


def _as_events(body: bytes) -> Callable[[int], list[bytes]] | None:
    """A chat completion as server-sent events written in n pieces (content deltas; the finish_reason,
    usage and ``[DONE]`` events with the last), as a function of n; None for a body that is not a
    completion."""
    try:
        completion = orjson.loads(body)
        choice = completion["choices"][0]
        message = choice["message"]
    except (ValueError, KeyError, IndexError, TypeError):
        return None

    def events(n: int) -> list[bytes]:
        head = {k: completion.get(k) for k in ("id", "created", "model")} | {
            "object": "chat.completion.chunk"
        }
        text = message.get("content") or ""
        size = max(1, -(-len(text) // max(1, n)))
        deltas = [{"content": text[i : i + size]} for i in range(0, len(text), size)] or [{"content": text}]
        if message.get("refusal"):
            deltas.append({"refusal": message["refusal"]})
        chunks = [{**head, "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
        chunks.append(
            {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]}
        )
        chunks.append({**head, "choices": [], "usage": completion.get("usage")})
        events = [b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks] + [b"data: [DONE]\n\n"]
        pieces = events[: len(deltas)]  # one write per piece of content; the end rides with the last
        pieces[-1] += b"".join(events[len(deltas) :])
        return pieces

    return events


def _bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def _uvicorn_server(app, log_level: str, graceful_s: float = 1.0):
    import uvicorn

    config = uvicorn.Config(
        app, log_level=log_level, access_log=False, lifespan="off", timeout_graceful_shutdown=graceful_s,
        backlog=2048, timeout_keep_alive=30,
    )  # fmt: skip
    return uvicorn.Server(config)


class JudgeServer:
    """The app on a background thread (tests, benchmarks, the demo): ``with JudgeServer(judge) as s:``
    then point a judge config's ``base_url`` at ``s.base_url``. ``s.counters`` counts the hits.
    ``handler`` answers generic calls (see the module docstring)."""

    def __init__(
        self,
        judge: Judge | None,
        faults: FaultScript | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        api_key: str | None = None,
        log_level: str = "critical",
        handler: GenericHandler | None = None,
        latency: LatencyModel | None = None,
    ):
        self.counters = ServerCounters()
        self.faults = faults or FaultScript()
        self.latency = latency
        self._app = create_app(
            judge, self.faults, api_key=api_key, counters=self.counters, handler=handler, latency=latency
        )
        self._host, self._port, self._log_level = host, port, log_level
        self._server = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self._host}:{self._port}/v1"

    def start(self) -> JudgeServer:
        sock = _bind(self._host, self._port)
        self._port = sock.getsockname()[1]
        # Stopping does not wait for deliberately slow answers (fault injection) to finish.
        self._server = _uvicorn_server(self._app, self._log_level, graceful_s=0.1)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="balcaprl-judge-server", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the judge server on {self.base_url} did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)
        self._server = self._thread = None

    def __enter__(self) -> JudgeServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_forever(
    judge: Judge | None,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    faults: FaultScript | None = None,
    api_key: str | None = None,
    on_ready: Callable[[str], None] = print,
    log_level: str = "warning",
    handler: GenericHandler | None = None,
    latency: LatencyModel | None = None,
) -> None:
    """Serve in the foreground until interrupted (the `judge serve` command); ``on_ready(base_url)``
    is called once the socket is bound, so scripts can read the port when 0 was asked for."""
    sock = _bind(host, port)
    base_url = f"http://{host}:{sock.getsockname()[1]}/v1"
    app = create_app(judge, faults, api_key=api_key, handler=handler, latency=latency)
    server = _uvicorn_server(app, log_level)
    on_ready(base_url)
    server.run(sockets=[sock])
