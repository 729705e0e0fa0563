"""One chat-completions call and what came of it: a validated answer, or a failure reason.

Retries, backoff (honouring ``retry-after``) and timeouts are the `openai` SDK's own
(``AsyncOpenAI(max_retries=, timeout=)``); this module only classifies the end result.

Why not ``chat.completions.parse()``:
``.parse()`` raises on invalid JSON *inside* the SDK, which loses the token usage of that answer (we
pay for it, so the accounting must see it) and blurs "not JSON" with "JSON of the wrong shape".
Here both are told apart and either one is worth one re-ask.

Authentication, permission and not-found errors (401/403/404) are not failures of one request but
a broken configuration that would fail every request; they raise :class:`JudgeConfigError` instead
of filling a training run with NaN rewards.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx2
import openai
from pydantic import BaseModel, ValidationError

from balcaprl.judge.config import JudgeConfigError
from balcaprl.judge.protocol import FailureReason, JudgeFailure

__all__ = ["CallAnswer", "call_endpoint", "redact", "reask_messages"]

_DETAIL_CHARS = 300


def redact(text: str, secret: str | None) -> str:
    """``text`` with every occurrence of ``secret`` replaced (API keys must not reach logs or files)."""
    if secret and len(secret) >= 4:
        text = text.replace(secret, "[REDACTED]")
    return text


@dataclass(frozen=True)
class CallAnswer:
    """The result of one call: ``parsed`` or ``failure``; ``content`` kept for a re-ask."""

    parsed: Any
    failure: JudgeFailure | None
    content: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def worth_reasking(self) -> bool:
        return self.failure is not None and self.failure.reason in ("invalid_json", "schema_violation")


_NO_CHOICE: Any = object()


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _completion_fields(raw: bytes) -> tuple[Any, str | None, str | None, dict[str, int]] | None:
    """``(content, refusal, finish_reason, token usage)`` of a chat-completion body; None when it is
    not one. ``content`` is ``_NO_CHOICE`` when the answer has no choices. Fields of the wrong type
    read as absent (a lenient reading, as the SDK's own ``construct`` was)."""
    try:
        data = json.loads(raw)
    except ValueError:  # invalid JSON or invalid UTF-8
        return None
    if not isinstance(data, dict):
        return None
    usage = data.get("usage")
    usage = usage if isinstance(usage, dict) else {}
    tokens = {
        "prompt_tokens": _count(usage.get("prompt_tokens")),
        "completion_tokens": _count(usage.get("completion_tokens")),
    }
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return _NO_CHOICE, None, None, tokens
    choice = choices[0]
    message = choice.get("message")
    message = message if isinstance(message, dict) else {}

    def text(value: Any) -> str | None:
        return value if isinstance(value, str) else None

    return (
        text(message.get("content")),
        text(message.get("refusal")),
        text(choice.get("finish_reason")),
        tokens,
    )


def _fail(reason: FailureReason, detail: str, secret: str | None, **usage: Any) -> CallAnswer:
    return CallAnswer(None, JudgeFailure(reason, redact(detail, secret)[:_DETAIL_CHARS]), **usage)


def _connection_failure(error: BaseException) -> BaseException | None:
    """The refused or dropped connection behind a "timeout", if that is what it was. The SDK's aiohttp transport
    maps every aiohttp connection error to httpx's ``ConnectTimeout``, so the SDK reports those as
    timeouts too; the chain of causes still holds aiohttp's own error, which says what happened."""
    aiohttp = sys.modules.get("aiohttp")  # loaded if, and only if, that transport was used
    cause = error.__cause__
    while aiohttp is not None and cause is not None:
        if isinstance(cause, TimeoutError):  # aiohttp's real timeouts are TimeoutErrors
            return None
        if isinstance(cause, aiohttp.ClientConnectionError):
            return cause
        cause = cause.__cause__
    return None


def _classify(error: openai.OpenAIError, secret: str | None, where: str) -> CallAnswer:
    name = type(error).__name__
    message = redact(str(error), secret)
    failed = _connection_failure(error) if isinstance(error, openai.APITimeoutError) else None
    if failed is not None:
        cause = f"{type(failed).__name__}: {redact(str(failed), secret)}"
        return _fail("server_error", f"{name}: connection failed or dropped ({cause})", secret)
    if isinstance(error, openai.APITimeoutError):
        return _fail("timeout", f"{name}: no answer within the timeout, after the SDK's retries", secret)
    if isinstance(error, openai.APIConnectionError):
        return _fail("server_error", f"{name}: connection failed or dropped ({message})", secret)
    if isinstance(error, openai.RateLimitError):
        return _fail(
            "rate_limited", f"{name}: still rate limited after the SDK's retries ({message})", secret
        )
    if isinstance(error, openai.AuthenticationError | openai.PermissionDeniedError | openai.NotFoundError):
        raise JudgeConfigError(
            f"the judge endpoint {where} rejected the request with HTTP {error.status_code} ({name}): "
            "check base_url, model and the API key variable named by api_key_env"
        ) from None
    if isinstance(error, openai.APIStatusError):
        status = error.status_code
        if status == 408:
            return _fail("timeout", f"HTTP 408 from the server: {message}", secret)
        if status >= 500 or status == 409:
            return _fail("server_error", f"HTTP {status} from the server: {message}", secret)
        return _fail("bad_input", f"HTTP {status}: the server rejected the request: {message}", secret)
    return _fail("server_error", f"{name}: {message}", secret)


async def call_endpoint(
    client: openai.AsyncOpenAI,
    *,
    model: str,
    messages: list[dict[str, Any]],
    temperature: float | None,
    max_tokens: int,
    response_format: dict[str, Any] | None = None,
    schema: type[BaseModel] | None = None,
    check: Callable[[Any], None] | None = None,
    extra_body: dict[str, Any] | None = None,
    secret: str | None = None,
    truncated_ok: bool = False,
) -> CallAnswer:
    """Make one chat-completions call and classify what came back.

    With ``schema`` the answer must be a JSON object that validates against it (``parsed`` is the
    model instance); without, the answer is free text (``parsed`` is the stripped string). ``check``
    may raise ``ValueError`` for answers that parse but are still unusable (a schema violation too,
    worth one re-ask, like invalid JSON). ``extra_body`` adds sampling fields (``top_p``, ``seed``...).
    ``truncated_ok``: a free-text answer cut off at ``max_tokens`` is kept (e.g. a letter followed by
    an explanation nobody asked for) instead of failing as ``truncated_output``.
    """
    body: dict[str, Any] = {"model": model, "messages": messages, "max_completion_tokens": max_tokens}
    if response_format is not None:
        body["response_format"] = response_format
    if temperature is not None:
        body["temperature"] = temperature
    if extra_body:
        body.update(extra_body)
    try:
        # The SDK's generic `post` (its documented way to send a body as is), not
        # `chat.completions.create`: same endpoint, same retries, backoff and timeouts, but without
        # `create`'s recursive TypedDict transform of the messages and the schema (~1 ms of CPU per
        # call, measured). And the raw response rather than a typed `ChatCompletion`: the SDK builds
        # that model field by field (its lenient `construct`, deep-copying every default), the largest
        # item of its response handling in a profile; we read the four fields we use ourselves.
        response = await client.post("/chat/completions", body=body, cast_to=httpx2.Response)
    except openai.OpenAIError as error:
        return _classify(error, secret, where=str(client.base_url))

    fields = _completion_fields(response.content)
    if fields is None:
        return _fail("invalid_json", "the answer is not a chat completion", secret)
    content, refusal, finish_reason, tokens = fields
    if content is _NO_CHOICE:
        return _fail("invalid_json", "the answer has no choices", secret, **tokens)
    keep_cut = truncated_ok and schema is None and bool(content and content.strip())
    if finish_reason == "length" and not keep_cut:
        return _fail(
            "truncated_output", f"the answer hit max_tokens ({max_tokens}) and was cut off", secret, **tokens
        )
    if finish_reason == "content_filter":
        return _fail("refused", "the answer was stopped by the server's content filter", secret, **tokens)
    if refusal:
        return _fail("refused", f"the judge refused: {refusal}", secret, **tokens)
    if not content or not content.strip():
        return _fail("invalid_json", "the answer is empty", secret, **tokens)
    if schema is None:
        parsed: Any = content.strip()
    else:
        try:
            data = json.loads(content)
        except json.JSONDecodeError as error:
            return CallAnswer(None, JudgeFailure("invalid_json", f"not JSON: {error}"), content, **tokens)
        try:
            parsed = schema.model_validate(data)
        except ValidationError as error:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or '<answer>'}: {e['msg']}" for e in error.errors()[:5]
            )
            return CallAnswer(
                None, JudgeFailure("schema_violation", problems[:_DETAIL_CHARS]), content, **tokens
            )
    if check is not None:
        try:
            check(parsed)
        except ValueError as error:
            return CallAnswer(
                None, JudgeFailure("schema_violation", str(error)[:_DETAIL_CHARS]), content, **tokens
            )
    return CallAnswer(parsed, None, content, **tokens)


def reask_messages(messages: list[dict[str, Any]], answer: CallAnswer) -> list[dict[str, Any]]:
    """The conversation for the one re-ask: the rejected answer, then what was wrong with it."""
    assert answer.failure is not None
    extra: list[dict[str, Any]] = []
    if answer.content:
        extra.append({"role": "assistant", "content": answer.content[:8000]})
    extra.append(
        {
            "role": "user",
            "content": f"That answer cannot be used ({answer.failure.reason}: {answer.failure.detail}). "
            "Judge the same material again and reply with only the JSON object in the required format.",
        }
    )
    return [*messages, *extra]
