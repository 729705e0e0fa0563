"""Paths as the OS gives them: a folder named with a byte that is not UTF-8 (``imgs\\xff``, which Python
decodes as the lone surrogate U+DCFF) works in ``score``, ``inspect``, ``caption --images`` and
``synthetic build --out``: real processes, real folders. What is printed shows the byte escaped
(``\\xff``), what is written holds the path as a JSON escape that reads back as the same path, and
nothing crashes after the work was done (``summary.json`` of a paid ``score`` is written)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from PIL import Image

from balcaprl.testing.judge_server import JudgeServer
from balcaprl.testing.scripted_judge import ScriptedJudge


def balcaprl(*args: bytes) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "100", "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run(
        [os.fsencode(sys.executable), b"-m", b"balcaprl.cli", *args],
        capture_output=True,
        env=env,
        timeout=600,
    )


def ok(done: subprocess.CompletedProcess) -> str:
    """The output of a command that succeeded, decoded strictly: nothing unprintable reached it."""
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]
    assert b"Traceback" not in done.stderr
    return done.stdout.decode("utf-8") + done.stderr.decode("utf-8")


@pytest.fixture()
def ws(tmp_path: Path) -> bytes:
    """``tmp_path`` as bytes, with images in ``imgs\\xff/``."""
    base = os.fsencode(tmp_path)
    images = base + b"/imgs\xff"
    os.mkdir(images)
    for i in range(2):
        Image.new("RGB", (16, 16), (90 * i, 10, 10)).save(os.fsdecode(images + f"/{i}.png".encode()))
    (tmp_path / "captions.jsonl").write_text(
        "".join(json.dumps({"image": f"{i}.png", "caption": "A red door."}) + "\n" for i in range(2))
    )
    (tmp_path / "references.json").write_text(json.dumps({f"{i}.png": "A red door." for i in range(2)}))
    return base


def test_score_then_inspect_in_folders_named_with_a_byte_that_is_not_utf8(ws: bytes):
    with JudgeServer(ScriptedJudge()) as server:
        judge = Path(os.fsdecode(ws)) / "judge.yaml"
        judge.write_text(yaml.safe_dump({"base_url": server.base_url, "model": "m", "api_key_env": None,
                                         "cache_path": None}))  # fmt: skip
        output = ok(balcaprl(b"score", b"--images", ws + b"/imgs\xff", b"--captions", ws + b"/captions.jsonl",
                             b"--references", ws + b"/references.json", b"--judge", os.fsencode(judge),
                             b"--out", ws + b"/out\xff", b"--no-progress"))  # fmt: skip
        assert server.counters.total == 2
    shown = os.fsdecode(ws)
    assert f"wrote {shown}/out\\xff/summary.json" in output
    summary = json.loads((Path(os.fsdecode(ws + b"/out\xff")) / "summary.json").read_text(encoding="utf-8"))
    assert summary["n_scored"] == 2
    assert summary["image_root"] == os.fsdecode(ws + b"/imgs\xff")  # the path reads back as it was given

    output = ok(balcaprl(b"inspect", ws + b"/out\xff", b"--out", ws + b"/page\xff.html"))
    assert f"wrote {shown}/page\\xff.html" in output
    assert os.path.getsize(ws + b"/page\xff.html") > 0


def test_caption_and_synthetic_build_in_folders_named_with_a_byte_that_is_not_utf8(ws: bytes):
    from balcaprl.synthetic.policy import create_policy

    policy = create_policy(Path(os.fsdecode(ws)) / "policy")
    output = ok(balcaprl(b"caption", b"--model", os.fsencode(policy), b"--images", ws + b"/imgs\xff", b"--out",
                         ws + b"/caps\xff.jsonl", b"--no-progress", b"--max-new-tokens", b"4"))  # fmt: skip
    assert f"wrote {os.fsdecode(ws)}/caps\\xff.jsonl" in output
    captions = (Path(os.fsdecode(ws + b"/caps\xff.jsonl"))).read_text(encoding="utf-8").splitlines()
    assert len(captions) == 2

    output = ok(
        balcaprl(b"synthetic", b"build", b"--out", ws + b"/syn\xff", b"--n-train", b"2", b"--n-eval", b"1")
    )
    assert f"to {os.fsdecode(ws)}/syn\\xff" in output
    from balcaprl.data.format import read_split_rows

    assert len(read_split_rows(os.fsdecode(ws + b"/syn\xff"), "train")) == 2
