"""`score` streams: it holds the verdicts of a few spans of captions at once, never the whole run's."""

from __future__ import annotations

import json
import weakref

from judge_testkit import config, png_bytes

from balcaprl.evaluate.score import score_captions
from balcaprl.judge.client import build_judge
from balcaprl.judge.protocol import JudgeFailure

N = 120
CONCURRENCY = 3


def test_score_holds_verdicts_bounded_by_the_concurrency_not_by_the_run(tmp_path, judge_server):
    server = judge_server()
    images = tmp_path / "images"
    images.mkdir()
    (images / "0.png").write_bytes(png_bytes())
    for i in range(1, N):
        (images / f"{i}.png").hardlink_to(images / "0.png")
    captions = [{"image": f"{i}.png", "caption": f"A red square with {i} dots."} for i in range(N)]
    (tmp_path / "captions.jsonl").write_text("".join(json.dumps(c) + "\n" for c in captions))
    (tmp_path / "references.json").write_text(json.dumps({f"{i}.png": "A red square." for i in range(N)}))
    judge = build_judge(config(server.base_url, concurrency=CONCURRENCY), image_root=images)

    alive = most = 0

    def released() -> None:
        nonlocal alive
        alive -= 1

    judge_batch = judge.judge_batch_with_stats

    async def counting(requests, on_outcome=None):  # every verdict counted from its arrival to its end
        def arrived(i, outcome):
            nonlocal alive, most
            if not isinstance(outcome, JudgeFailure):
                alive += 1
                most = max(most, alive)
                weakref.finalize(outcome.verdict, released)
            on_outcome(i, outcome)

        return await judge_batch(requests, on_outcome=arrived)

    judge.judge_batch_with_stats = counting  # type: ignore[method-assign]
    run = score_captions(judge, tmp_path / "captions.jsonl", tmp_path / "references.json", tmp_path / "out")

    assert run.summary["n_scored"] == N and server.counters.total == N
    assert most <= 4 * CONCURRENCY  # two spans of twice the concurrency (the whole run would be N)
    rows = [json.loads(line) for line in (tmp_path / "out" / "scores.jsonl").read_text().splitlines()]
    verdicts = [json.loads(line) for line in (tmp_path / "out" / "verdicts.jsonl").read_text().splitlines()]
    assert [r["image"] for r in rows] == [v["image"] for v in verdicts] == [c["image"] for c in captions]
    assert all(v["verdict"] is not None for v in verdicts)
    assert not list((tmp_path / "out" / ".score").glob("*.part"))  # the parts took their final names
