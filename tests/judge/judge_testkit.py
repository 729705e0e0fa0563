"""Shared helpers for the judge tests (a uniquely named module, imported by the test files)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from PIL import Image

from balcaprl.judge import JudgeConfig, JudgeRequest

# A reference and a caption whose scripted verdict is worked out by hand in test_judge_client_http.py:
# caption clauses: "a red door on the left"            pointable, visible
#                  "a purple elephant"                  pointable, not visible (hallucination)
#                  "the scene has a cozy atmosphere"    not pointable (commentary), not visible
# reference clauses: "a red door on the left" (covered), "a black cat sits on the step" (not covered)
# -> precision 1/3, recall 1/2, linguistic ((8-1)+(9-1)+(7-1))/27 = 21/27
REFERENCE = "A red door on the left. A black cat sits on the step."
CAPTION = "A red door on the left, a purple elephant, the scene has a cozy atmosphere."
EXPECTED = (1 / 3, 1 / 2, 21 / 27)


def png_bytes(width: int = 32, height: int = 32, colour: tuple[int, int, int] = (200, 30, 30)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), colour).save(buffer, "PNG")
    return buffer.getvalue()


def jpeg_bytes(width: int = 32, height: int = 32, colour: tuple[int, int, int] = (30, 30, 200)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), colour).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


IMAGE = png_bytes()


def config(base_url: str, **overrides: Any) -> JudgeConfig:
    """A test config: no auth, no cache, short timeouts, no SDK retries unless asked for."""
    values: dict[str, Any] = {
        "base_url": base_url,
        "model": "scripted",
        "api_key_env": None,
        "cache_path": None,
        "timeout_s": 5.0,
        "max_retries": 0,
    }
    values.update(overrides)
    return JudgeConfig(**values)


def request(
    caption: str = CAPTION, reference: str = REFERENCE, image: Any = IMAGE, **kw: Any
) -> JudgeRequest:
    return JudgeRequest(image=image, caption=caption, reference=reference, **kw)


def judge_and_close(judge: Any, requests: list[JudgeRequest]) -> list[Any]:
    """``judge.judge_batch(requests)`` on a fresh event loop, closing the judge's connections after."""
    import asyncio

    async def go() -> list[Any]:
        try:
            return await judge.judge_batch(requests)
        finally:
            await judge.aclose()

    return asyncio.run(go())


RUN = 7  # words: no run this long may be shared with the paper's prompts


def words(text: str) -> list[str]:
    """Lower-cased words, every run of other characters a single separator (as the stored hashes)."""
    return re.sub(r"[^a-z0-9]+", " ", text.lower()).split()


def run_hashes(text: str) -> dict[str, str]:
    """sha256 (first 12 hex digits) of every run of RUN words of ``text`` -> the run."""
    w = words(text)
    runs = (" ".join(w[i : i + RUN]) for i in range(len(w) - RUN + 1))
    return {hashlib.sha256(run.encode()).hexdigest()[:12]: run for run in runs}


def paper_run_hashes() -> set[str]:
    """The hashes of every RUN-word run of the paper's judge prompts (paper_prompt_7word_runs.txt)."""
    lines = (Path(__file__).parent / "paper_prompt_7word_runs.txt").read_text().splitlines()
    return {line for line in lines if line and not line.startswith("#")}


@contextlib.contextmanager
def judge_serve(*args: str) -> Iterator[tuple[str, int]]:
    """``balcaprl judge serve --port 0 ARGS`` in a process of its own: ``(base_url, pid)``."""
    process = subprocess.Popen(
        [sys.executable, "-m", "balcaprl.cli", "judge", "serve", "--port", "0", *args],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = process.stdout.readline()
        assert line.startswith("balcaprl judge server: http://127.0.0.1:"), line
        yield line.split()[-1], process.pid
    finally:
        process.terminate()
        process.wait(timeout=10)
        process.stdout.close()


# -- first_answer's copies (balcaprl.judge.tail) -----------------------------------------------


def copies_script(first_fails_after_s: float, duplicate: str, decode_s: float = 0.0):
    """An attempt function: the first copy fails after ``first_fails_after_s`` with no first byte (cut at
    its first-byte limit); the second ``"stalls"``, ``"fails"`` at once (a 429), or ``"answers"``: its
    first byte at once, its answer ``decode_s`` later; a third answers at once. ``started``: when each
    copy started."""
    started: list[float] = []

    async def attempt(on_first_byte):
        started.append(time.perf_counter())
        index = len(started) - 1
        if index == 0:
            await asyncio.sleep(first_fails_after_s)
            raise TimeoutError("no first byte within first_byte_timeout_s")
        if index == 1 and duplicate == "stalls":
            await asyncio.sleep(3600)
        if index == 1 and duplicate == "fails":
            raise ConnectionError("429 Too Many Requests")
        on_first_byte()
        await asyncio.sleep(decode_s if index == 1 else 0.0)
        return ("first", "duplicate", "third")[index]

    return attempt, started


def room_for_two_duplicates(hedging: Any) -> None:
    """Three other calls of the run started: the lifetime share (1.0 here) allows a second duplicate."""
    for _ in range(3):
        hedging.begin()
