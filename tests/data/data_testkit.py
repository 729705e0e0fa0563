"""Helpers for the data tests (a uniquely named module, so no other test folder's `conftest` can
shadow it): a scripted re-captioning "model" behind an OpenAI-compatible FastAPI app."""


class ScriptedCaptioner:
    """Answers re-caption requests with canned captions; ``faults[image_sha256]`` lists what to do
    on each call for that image ("ok", "server_error", "rate_limit", "bad_request", "refusal",
    "length", "empty", "content_filter", "unauthorized"); when the list is used up, "ok"."""

    def __init__(self, faults=None, always="ok"):
        self.faults = {k: list(v) for k, v in (faults or {}).items()}
        self.always = always
        self.calls = []  # (image_sha256, instruction) per call, in arrival order
        self.bodies = []

    @staticmethod
    def caption_for(image_sha256: str, instruction: str) -> str:
        return f"A re-captioned image {image_sha256[:8]}: a detailed scene, as asked by '{instruction}'."

    def next_fault(self, digest):
        queue = self.faults.get(digest)
        if queue:
            return queue.pop(0)
        return "ok" if queue is not None else self.always


def scripted_app(model: ScriptedCaptioner):
    import base64
    import hashlib
    import html
    import re
    import time

    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse

    from balcaprl.judge.rubrics import load_rubric

    app = FastAPI()

    def completion(content, finish="stop", refusal=None):
        return JSONResponse(
            {
                "id": f"chatcmpl-{time.monotonic_ns()}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": "scripted",
                "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120},
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": finish,
                        "logprobs": None,
                        "message": {"role": "assistant", "content": content, "refusal": refusal},
                    }
                ],
            }
        )

    def error(status, message):
        return JSONResponse(
            {"error": {"message": message, "type": "x", "param": None, "code": None}},
            status_code=status,
            headers={"retry-after-ms": "1"},
        )

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        model.bodies.append(body)
        assert "response_format" not in body  # free text, not a structured verdict
        user = body["messages"][-1]
        url = next(p["image_url"]["url"] for p in user["content"] if p["type"] == "image_url")
        text = next(p["text"] for p in user["content"] if p["type"] == "text")
        if len(body["messages"]) == 1:  # the paper's way: the original prompt is the whole instruction
            instruction = text
        else:  # --rubric strict: the rubric as system message, the prompt as a data block
            assert body["messages"][0]["content"] == load_rubric("recaption_strict").text
            instruction = html.unescape(
                re.search(r"<instruction>\n(.*?)\n</instruction>", text, re.S).group(1)
            )
        digest = hashlib.sha256(base64.b64decode(url.split(",", 1)[1])).hexdigest()
        model.calls.append((digest, instruction))
        fault = model.next_fault(digest)
        if fault == "server_error":
            return error(500, "internal error (scripted)")
        if fault == "rate_limit":
            return error(429, "rate limited (scripted)")
        if fault == "bad_request":
            return error(400, "temperature is not supported with this model (scripted)")
        if fault == "unauthorized":
            return error(401, "invalid api key (scripted)")
        if fault == "refusal":
            return completion(None, refusal="I can't describe this image.")
        if fault == "length":
            return completion("A caption that was cut off in the mid", finish="length")
        if fault == "empty":
            return completion("   ")
        if fault == "content_filter":
            return completion(None, finish="content_filter")
        return completion(model.caption_for(digest, instruction))

    return app
