"""`score` streams: it holds the verdicts of a few spans of captions at once, never the whole run's."""

from __future__ import annotations

import json
import weakref

from hypothesis import given, settings
from hypothesis import strategies as st
from judge_testkit import config, png_bytes

from balcaprl.evaluate.score import score_captions, verdict_json
from balcaprl.judge.calls import cached_answer
from balcaprl.judge.client import build_judge
from balcaprl.judge.protocol import JudgeFailure
from balcaprl.judge.schemas import VERDICT_RUBRICS, to_verdict, verdict_schema
from balcaprl.rewards.verdict import CaptionAssertion, ReferenceAssertion, Verdict

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


_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12).filter(str.strip)


@settings(max_examples=200, deadline=None)
@given(
    claims=st.lists(st.tuples(_TEXT, st.booleans(), st.booleans()), max_size=4),
    marks=st.lists(st.tuples(_TEXT, st.booleans()), min_size=1, max_size=4),
    scores=st.tuples(*(st.integers(1, 10),) * 3),
    explanation=st.text(st.characters(blacklist_categories=("Cs",)), max_size=20),
)
def test_a_verdict_is_spelt_as_json_dumps_spells_it_read_back(claims, marks, scores, explanation):
    """score writes a fresh verdict with pydantic's serialiser and a resumed one, read back from the
    record, with json.dumps: the two spellings must agree byte for byte (any text, controls and
    non-ASCII included), or a resumed run's verdicts.jsonl would differ from an uninterrupted one's."""
    verdict = Verdict(
        caption_assertions=[CaptionAssertion(text=t, pointable=p, visible=v) for t, p, v in claims],
        reference_assertions=[ReferenceAssertion(text=t, covered=c) for t, c in marks],
        clarity=scores[0], fluency=scores[1], coherency=scores[2], explanation=explanation,
    )  # fmt: skip
    read_back = json.loads(verdict_json(verdict))
    assert verdict_json(verdict) == json.dumps(read_back, ensure_ascii=False, separators=(",", ":"))
    assert Verdict.model_validate(read_back) == verdict


def test_a_verdict_pydantic_cannot_encode_is_still_written():
    """A lone surrogate (a judge may send one as a JSON escape, and a free-text field keeps it) takes
    json.dumps' spelling."""
    verdict = Verdict.model_validate(
        {"caption_assertions": [], "reference_assertions": [{"text": "a", "covered": True}],
         "clarity": 5, "fluency": 5, "coherency": 5, "explanation": "a \ud800 b"}
    )  # fmt: skip
    assert verdict_json(verdict).endswith('"explanation":"a \ud800 b"}')


_PADDED = st.text(st.sampled_from("ab \t"), min_size=1, max_size=6).filter(str.strip)


@settings(max_examples=200, deadline=None)
@given(
    rubric=st.sampled_from(VERDICT_RUBRICS),
    claims=st.lists(st.tuples(_PADDED, st.booleans(), st.booleans()), max_size=3),
    marks=st.lists(st.tuples(_PADDED, st.booleans()), min_size=1, max_size=3),
)
def test_a_cached_answer_makes_the_verdict_its_dump_would_make(rubric, claims, marks):
    """A cached answer's verdict is built from the JSON it was validated from (no dump): the same
    verdict as from the validated answer, untrimmed texts and rubrics without pointability included."""
    schema = verdict_schema(rubric)
    pointable = "pointable" in schema.model_fields["caption_assertions"].annotation.__args__[0].model_fields
    data = {
        "caption_assertions": [
            {"text": t, **({"pointable": p} if pointable else {}), "visible": v} for t, p, v in claims
        ],
        "reference_assertions": [{"text": t, "covered": c} for t, c in marks],
        "clarity": 3, "fluency": 4, "coherency": 5, "explanation": " why ",
    }  # fmt: skip
    answer = cached_answer({"json": data}, schema)
    assert answer is not None
    before = json.dumps(data)
    assert to_verdict(answer, data) == to_verdict(answer)
    assert json.dumps(data) == before  # the cached object is not changed under the cache's feet
