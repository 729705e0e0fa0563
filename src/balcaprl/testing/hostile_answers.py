"""Answers whose size is the attack, for the loopback judge server's fault script: a client must bound
what it reads (``balcaprl.judge.calls.answer_byte_limit``) and fail them as ``oversized_answer``.
``huge_explanation[:MB]`` (default 20 MB), ``gzip_bomb[:MB]`` (a completion padded with MB of spaces,
default 1024, gzip-compressed to a thousandth of it), ``endless_body`` (a chunked body that never
ends; what it produced before the client hung up is counted in :data:`SENT`).
"""

from __future__ import annotations

import asyncio
import json
import zlib
from collections import Counter
from functools import cache

from fastapi.responses import Response, StreamingResponse

HOSTILE_FAULTS = ("huge_explanation", "gzip_bomb", "endless_body")

SENT: Counter = Counter()  # bytes handed to the HTTP server per hostile fault (this process)
_MB = 1 << 20


def _completion(content: str, model: str) -> dict:
    from balcaprl.testing.judge_server import _completion  # that module hooks this one in

    return _completion(model, content, "stop", prompt_tokens=1)


@cache
def _gzip_body(content: str, model: str, megabytes: int) -> bytes:
    """A chat completion padded with ``megabytes`` MB of spaces, gzip-compressed a MB at a time."""
    padded = {**_completion(content, model), "padding": "\0"}
    head, tail = json.dumps(padded).encode().split(b"\\u0000")
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: a gzip header
    parts = [packer.compress(head), *(packer.compress(b" " * _MB) for _ in range(megabytes))]
    return b"".join([*parts, packer.compress(tail), packer.flush()])


def hostile_response(fault: str, content: str, model: str) -> Response:
    """The response for one of :data:`HOSTILE_FAULTS` (``fault``: ``name`` or ``name:MB``) in place of
    ``content``, the answer the judge would have given (a JSON verdict or a text)."""
    name, _, arg = fault.partition(":")
    if name == "endless_body":

        async def forever():
            chunk = b" " * (64 * 1024)
            yield b'{"object": "chat.completion", "padding": "'
            while True:
                SENT[name] += len(chunk)  # one event loop: no lock needed
                yield chunk
                # a turn of the loop per chunk: once the client has gone, sending returns at once,
                # and only a turn lets the server notice the disconnect and stop this generator
                await asyncio.sleep(0)

        return StreamingResponse(forever(), media_type="application/json")
    if name == "gzip_bomb":
        body = _gzip_body(content, model, int(arg or 1024))
        SENT[name] += len(body)
        return Response(body, media_type="application/json", headers={"Content-Encoding": "gzip"})
    if name != "huge_explanation":
        raise ValueError(f"not a hostile fault: {fault!r}")
    excess = "x" * int(float(arg or 20) * _MB)
    try:
        content = json.dumps({**json.loads(content), "explanation": excess})
    except (ValueError, TypeError):  # a free-text answer: the text itself is the excess
        content = f"{content} {excess}"
    body = json.dumps(_completion(content, model)).encode()
    SENT[name] += len(body)
    return Response(body, media_type="application/json")
