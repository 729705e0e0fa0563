"""The judge's rubric variants over real HTTP: one wire schema per verdict rubric (descriptions that
agree with its text), the "w/o pointability" rubric, the text-only reference decomposition, coverage
follow-ups for long references, and rubric edits that never reuse cached answers."""

from __future__ import annotations

import asyncio
import json
import math

import pytest
from judge_testkit import CAPTION, IMAGE, REFERENCE, config, request

from balcaprl.judge import JudgeFailure, Judgement, OpenAICompatibleJudge
from balcaprl.judge.rubrics import VERDICT_RUBRICS, load_rubric
from balcaprl.judge.schemas import (
    JUDGE_CALL_KINDS,
    CoverageMarks,
    ReferenceAssertions,
    coverage_schema,
    json_response_format,
    judge_call_kind,
    schema_name,
    verdict_schema,
)
from balcaprl.rewards import RewardConfig, score_rollout, score_verdict
from balcaprl.testing.scripted_judge import ScriptedJudge

# Six reference clauses (scripted judge: one assertion per clause); the caption covers the 1st, 3rd, 6th.
LONG_REFERENCE = (
    "A red door on the left. A black cat sits on the step. A lamp hangs above the door. "
    "A bicycle leans on the wall. A blue pot holds flowers. The window is open."
)
LONG_CAPTION = "A red door on the left, a lamp hangs above the door, the window is open."


def run(judge: OpenAICompatibleJudge, requests):
    async def go():
        try:
            return await judge.judge_batch_with_stats(requests)
        finally:
            await judge.aclose()

    return asyncio.run(go())


def _properties(schema) -> dict:
    """The caption assertion's properties as the judge receives them."""
    body = json_response_format(schema, "x")["json_schema"]["schema"]
    (caption_assertion,) = [d for name, d in body["$defs"].items() if name.endswith("CaptionAssertion")]
    return caption_assertion["properties"]


def _all_descriptions(node) -> list[str]:
    if isinstance(node, dict):
        own = [node["description"]] if isinstance(node.get("description"), str) else []
        return own + [d for v in node.values() for d in _all_descriptions(v)]
    if isinstance(node, list):
        return [d for v in node for d in _all_descriptions(v)]
    return []


# ------------------------------------------------------------------------- schemas per rubric


def test_each_verdict_rubric_has_its_own_schema_whose_descriptions_agree_with_its_text():
    names = {
        json_response_format(make(r), judge_call_kind(call, r))["json_schema"]["name"]
        for r in VERDICT_RUBRICS
        for call, make in (("verdict", verdict_schema), ("coverage", coverage_schema))
    }
    assert len(names) == 2 * len(VERDICT_RUBRICS) and "balcaprl_verdict_evaluation" in names
    for name in names:  # the loopback server knows every one of them
        assert schema_name(name.removeprefix("balcaprl_")) == name
        assert name.removeprefix("balcaprl_") in JUDGE_CALL_KINDS

    training, evaluation = _properties(verdict_schema("training")), _properties(verdict_schema("evaluation"))
    ablation = _properties(verdict_schema("training_without_pointability"))
    # strict pointability in training, evidence-based inferences pass in evaluation: as in each text
    assert "clues" not in training["pointable"]["description"] and "clues" not in load_rubric("training").text
    assert "visible clues" in evaluation["pointable"]["description"]
    assert "visible clues" in load_rubric("evaluation").text
    assert "hallucination" in training["visible"]["description"]
    assert "faintly supported" in evaluation["visible"]["description"]
    assert "faint" in load_rubric("evaluation").text
    # the ablation asks nothing about pointability, in its text or in its schema
    assert set(ablation) == {"text", "visible"}
    assert "pointable" not in json.dumps(
        json_response_format(coverage_schema("training_without_pointability"), "x")
    )
    assert coverage_schema("training") is coverage_schema("training")  # one class per rubric (cached keys)
    with pytest.raises(ValueError, match="unknown verdict rubric"):
        verdict_schema("nope")


def test_schema_descriptions_carry_no_developer_notation_and_no_rewording_hint():
    schemas = [verdict_schema(r) for r in VERDICT_RUBRICS] + [coverage_schema(r) for r in VERDICT_RUBRICS]
    for schema in [*schemas, ReferenceAssertions, CoverageMarks]:
        descriptions = _all_descriptions(json_response_format(schema, "x"))
        assert descriptions, schema.__name__
        for text in descriptions:
            assert "A_P" not in text and "A_G" not in text and "(Q" not in text, text
            assert "in a few words" not in text and "element of" not in text, text
            assert "``" not in text and " mode" not in text and "1-based" not in text, text  # no dev notes
            # coverage is "reasonably inferred", as in the rubric, never the narrower "clearly implies"
            assert "clearly implies" not in text, text


# ------------------------------------------------------------------------- the server reads the variant


class RecordingJudge:
    """The scripted judge, recording what reaches it (and its decompositions, with their images)."""

    def __init__(self) -> None:
        self.inner, self.seen, self.decomposed = ScriptedJudge(), [], []

    async def judge_batch(self, requests):
        self.seen.extend(requests)
        return await self.inner.judge_batch(requests)

    async def decompose_references(self, requests):
        self.decomposed.extend(requests)
        return await self.inner.decompose_references(requests)

    async def judge_against_fixed_reference(self, requests, reference_assertions):
        self.seen.extend(requests)
        return await self.inner.judge_against_fixed_reference(requests, reference_assertions)


@pytest.mark.parametrize("mode", ["joint", "cached-reference"])
def test_the_ablation_rubric_travels_from_request_to_server(judge_server, mode):
    recording = RecordingJudge()
    server = judge_server(judge=recording)
    requests = [request(rubric=r) for r in VERDICT_RUBRICS]
    result = run(OpenAICompatibleJudge(config(server.base_url, reference_mode=mode)), requests)
    assert {r.rubric for r in recording.seen} == set(VERDICT_RUBRICS)
    by_rubric = dict(zip(VERDICT_RUBRICS, result.outcomes, strict=True))
    assert all(isinstance(o, Judgement) for o in result.outcomes)
    # training: "the scene has a cozy atmosphere" is commentary (not pointable)
    assert [a.pointable for a in by_rubric["training"].verdict.caption_assertions] == [True, True, False]
    # the ablation's prompt and schema ask nothing about pointability: every claim is admitted, and
    # precision is `visible` alone (1 of the 3 clauses is in the reference)
    ablation = by_rubric["training_without_pointability"].verdict
    assert all(a.pointable for a in ablation.caption_assertions)
    scores = score_rollout(ablation, RewardConfig(pointability=False), 10, 10)
    assert scores.precision == pytest.approx(1 / 3) and scores.recall == pytest.approx(1 / 2)


def test_a_schema_that_contradicts_the_system_message_is_refused(judge_server):
    from balcaprl.judge.calls import JudgeCaller
    from balcaprl.judge.prompt import build_judge_messages

    server = judge_server()
    image = JudgeCaller(config(server.base_url)).images.load(IMAGE)
    messages = build_judge_messages(load_rubric("training"), image, reference=REFERENCE, caption=CAPTION)

    async def go(rubric):
        async with JudgeCaller(config(server.base_url)) as caller:
            return await caller.call_json(
                messages, verdict_schema(rubric), kind=judge_call_kind("verdict", rubric), temperature=0.0
            )

    assert asyncio.run(go("training")).ok
    refused = asyncio.run(go("evaluation"))
    assert refused.failure.reason == "bad_input" and "system message" in refused.failure.detail


# ------------------------------------------------------------------------- the reference decomposition


@pytest.mark.parametrize("with_image", [False, True])
def test_the_decomposition_is_text_only_unless_the_config_asks_for_the_image(judge_server, with_image):
    recording = RecordingJudge()
    server = judge_server(judge=recording)
    cfg = config(server.base_url, reference_mode="cached-reference", rubric={"reference_image": with_image})
    result = run(OpenAICompatibleJudge(cfg), [request()])
    assert isinstance(result.outcomes[0], Judgement)
    (decomposition,) = recording.decomposed
    if with_image:
        assert decomposition.image[:8] == b"\x89PNG\r\n\x1a\n"  # the image, re-encoded by the client
    else:
        assert decomposition.image == b""
    assert server.counters.by_kind == {"reference_assertions": 1, "coverage": 1}


# ------------------------------------------------------------------------- long references: follow-ups


def _long(cfg, server_url, tmp_path=None, **overrides):
    values = {"reference_mode": "cached-reference", **overrides}
    if tmp_path is not None:
        values["cache_path"] = tmp_path / "judge.sqlite"
    return OpenAICompatibleJudge(config(server_url, **values))


def test_a_coverage_answer_that_skips_ids_is_completed_by_a_follow_up_for_those_ids(judge_server, tmp_path):
    clean_server = judge_server()
    (expected,) = run(_long(None, clean_server.base_url), [request(LONG_CAPTION, LONG_REFERENCE)]).outcomes

    server = judge_server({"left, a lamp": ["skip_ids"]})  # the first coverage answer marks ids 1..3 only
    result = run(_long(None, server.base_url, tmp_path), [request(LONG_CAPTION, LONG_REFERENCE)])
    (outcome,) = result.outcomes
    assert isinstance(outcome, Judgement)
    assert server.counters.by_kind == {"reference_assertions": 1, "coverage": 1, "coverage_missing": 1}
    assert server.counters.followup_ids == [[4, 5, 6]]  # the follow-up names only the missing ids
    assert result.stats.calls == 3 and result.stats.reasks == 0
    # merged, not guessed: the verdict is the one an answer without gaps gives
    assert outcome.verdict == expected.verdict
    assert [a.covered for a in outcome.verdict.reference_assertions] == [
        True,
        False,
        True,
        False,
        False,
        True,
    ]
    assert score_verdict(outcome.verdict).recall == pytest.approx(3 / 6)
    # both answers are cached: a resumed run pays nothing and gets the same verdict
    again = run(_long(None, server.base_url, tmp_path), [request(LONG_CAPTION, LONG_REFERENCE)])
    assert again.outcomes[0].verdict == expected.verdict and server.counters.total == 3


def test_a_follow_up_that_still_skips_ids_fails_the_rollout(judge_server):
    server = judge_server({"left, a lamp": ["skip_ids", "skip_ids"]})
    result = run(_long(None, server.base_url), [request(LONG_CAPTION, LONG_REFERENCE)])
    (outcome,) = result.outcomes
    assert isinstance(outcome, JudgeFailure) and outcome.reason == "schema_violation"
    assert "ids [5, 6] unmarked" in outcome.detail  # the follow-up marked 4 only
    assert server.counters.followup_ids == [[4, 5, 6]] and server.counters.total == 3
    assert math.isnan(result.rewards()[0, 1])  # NaN recall, never a guess


def test_unknown_ids_are_a_broken_answer_re_asked_once_not_a_follow_up(judge_server):
    server = judge_server({"left, a lamp": ["wrong_ids"]})
    result = run(_long(None, server.base_url), [request(LONG_CAPTION, LONG_REFERENCE)])
    assert isinstance(result.outcomes[0], Judgement)
    assert result.stats.reasks == 1 and "coverage_missing" not in server.counters.by_kind


# ------------------------------------------------------------------------- edits never reuse answers


@pytest.mark.parametrize("mode", ["joint", "cached-reference"])
def test_an_edited_shared_part_misses_the_cache_in_both_modes(judge_server, tmp_path, monkeypatch, mode):
    import balcaprl.judge.rubrics as rubrics
    from balcaprl.testing import rubrics as lookup

    server = judge_server()
    cfg = config(server.base_url, reference_mode=mode, cache_path=tmp_path / "judge.sqlite")
    first = run(OpenAICompatibleJudge(cfg), [request()])
    calls = server.counters.total
    original = rubrics._part
    monkeypatch.setattr(
        rubrics, "_part", lambda p: original(p) + (" Keep it short." if p == "splitting" else "")
    )
    rubrics.load_rubric.cache_clear()
    lookup._names_by_text.cache_clear()
    try:
        edited = run(OpenAICompatibleJudge(cfg), [request()])
    finally:
        monkeypatch.undo()
        rubrics.load_rubric.cache_clear()  # nothing composed from the edited part outlives this test
        lookup._names_by_text.cache_clear()
    assert edited.stats.cache_hits == 0 and server.counters.total == 2 * calls  # every call asked again
    assert edited.outcomes[0].verdict == first.outcomes[0].verdict
