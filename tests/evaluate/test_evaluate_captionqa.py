"""CaptionQA: option preparation (seed-0 shuffle, the cannot-answer option), letter reading and
scoring by hand, and the protocol over the loopback server on a parquet question file in the hub's
row format."""

from __future__ import annotations

import json

import pytest
from evaluate_testkit import ProtocolJudge, judge_config, write_captionqa

from balcaprl.evaluate.captionqa import (
    CANNOT_ANSWER,
    extract_letter,
    is_yes_no_question,
    prepare_questions,
    question_prompt,
    run_captionqa,
    score_answer,
)
from balcaprl.evaluate.formats import read_caption_sets, read_captionqa
from balcaprl.judge import JudgeCaller


def test_questions_options_and_the_seed_0_shuffle(tmp_path):
    entries = read_captionqa(write_captionqa(tmp_path))
    assert [e.id for e in entries] == ["nat_001", "nat_002", "doc_001"] and entries[0].image.startswith(
        b"\x89PNG"
    )
    questions = prepare_questions(entries, seed=0)
    # "How many?" has no valid answer and is skipped without drawing from the RNG
    assert [(q.entry_id, q.index) for q in questions] == [
        ("nat_001", 0), ("nat_001", 1), ("nat_002", 0), ("nat_002", 1), ("doc_001", 0)
    ]  # fmt: skip
    assert [len(q.options) for q in questions] == [4, 2, 3, 5, 3]  # cannot-answer added except on yes/no
    # random.Random(0): one shuffle of range(n) per usable question, in file order
    assert [q.permutation for q in questions] == [(2, 0, 1, 3), (0, 1), (0, 1, 2), (0, 4, 1, 2, 3), (1, 0, 2)]
    colour = questions[0]
    assert colour.shown == ["Blue", "Red", "Green", CANNOT_ANSWER] and colour.category == "Attribute"
    assert question_prompt("A red door.", colour) == (  # the official layout, the caption a data block
        "Caption:\n<caption>\nA red door.\n</caption>\n\nQuestion:\nWhat colour is the door?\n\n"
        "Options:\nA. Blue\nB. Red\nC. Green\nD. Cannot answer from the caption\n\nAnswer:"
    )
    assert prepare_questions(entries, seed=1)[0].permutation != colour.permutation


@pytest.mark.parametrize(
    ("question", "choices", "expected"),
    [
        ("Is there a cat?", ["Yes", "No"], True),
        ("What is it?", ["yes, a dog", "no dog"], True),  # substrings, as the official test
        ("Does it rain?", ["A", "B"], True),  # an auxiliary verb first
        ("How many dogs?", ["None", "Two"], False),  # "no" in "None", but no "yes"
        ("What colour?", ["Red", "Blue"], False),
    ],
)
def test_yes_no_questions(question, choices, expected):
    assert is_yes_no_question(question, choices) is expected


@pytest.mark.parametrize(
    ("answer", "n", "letter"),
    [
        ("B", 4, "B"),
        ("Answer: C", 4, "C"),
        ("<think>maybe A</think>D", 4, "D"),
        ("3", 4, "C"),
        ("The answer is B", 4, "B"),
        ("E", 4, None),  # out of range
        ("B\nbecause the caption says so", 4, None),  # the official reader keeps what follows a newline
        ("I think none", 5, None),  # "I" is a standalone capital, out of range: no letter
        ("", 4, None),
    ],
)
def test_letters_are_read_as_the_official_reader_reads_them(answer, n, letter):
    assert extract_letter(answer, n) == letter


def test_scores_by_hand(tmp_path):
    colour, cat, where, brand, _ = prepare_questions(read_captionqa(write_captionqa(tmp_path)))
    assert score_answer(colour, "B") == (1.0, "correct")  # Red
    assert score_answer(colour, "A") == (0.0, "wrong")
    assert score_answer(colour, "D") == (pytest.approx(1 / 3 + 0.05), "cannot_answer")  # 1/3 original choices
    assert score_answer(where, "C") == (pytest.approx(1 / 2 + 0.05), "cannot_answer")
    assert score_answer(brand, None) == (0.0, "unparsed")
    assert not cat.has_cannot_answer


def write_captions(tmp_path):
    path = tmp_path / "model.captionqa.json"
    path.write_text(json.dumps({"nat_001": "CAP1", "nat_002": "CAP2"}))  # doc_001 has no caption
    return path


ANSWERS = {
    ("CAP1", "What colour is the door?"): "Red",  # correct: 1
    ("CAP1", "Is there a cat?"): "No",  # wrong: 0
    ("CAP2", "Where is the car parked?"): CANNOT_ANSWER,  # 1/2 + 0.05
    ("CAP2", "What brand is the car?"): "raw:I think it is none of these",  # unparsed: 0
}


def test_protocol_over_http(tmp_path, eval_server):
    handler = ProtocolJudge(answers=ANSWERS)
    server = eval_server(handler)
    entries = read_captionqa(write_captionqa(tmp_path))
    captions = read_caption_sets(["captionqa=" + str(write_captions(tmp_path))])["captionqa"]
    result = run_captionqa(JudgeCaller(judge_config(server.base_url)), entries, captions, tmp_path / "out")
    assert result.score == pytest.approx(100 * (1 + 0 + 0.55 + 0) / 4)
    metrics = result.metrics
    assert metrics["accuracy"] == 25.0 and metrics["cannot_answer_rate"] == 25.0 and metrics["unparsed"] == 1
    assert metrics["per_category"]["Attribute"] == {"score": 50.0, "accuracy": 50.0, "n": 2}
    assert metrics["per_category"]["Spatial"]["score"] == pytest.approx(55.0)
    assert metrics["n_questions"] == 5 and result.n_scored == 4
    assert result.missing == ["doc_001"] and not result.failures
    call = handler.seen[0]
    assert call.kind == "captionqa_answer" and not call.images and call.schema_name is None  # text only
    assert call.temperature == 0.0 and call.max_tokens == 4  # the official answer budget
    assert "single letter" in call.system
    rows = [json.loads(line) for line in (tmp_path / "out" / "items.jsonl").read_text().splitlines()]
    assert [r["outcome"] for r in rows] == ["correct", "wrong", "cannot_answer", "unparsed"]


def test_failed_calls_are_left_out_not_scored_zero(tmp_path, eval_server):
    handler = ProtocolJudge(answers=ANSWERS)
    server = eval_server(handler, rules={"What brand": ["server_error"], "Is there a cat": ["refusal"]})
    entries = read_captionqa(write_captionqa(tmp_path))
    captions = read_caption_sets([write_captions(tmp_path)])[None]
    result = run_captionqa(JudgeCaller(judge_config(server.base_url)), entries, captions, tmp_path / "out")
    assert result.failures == {"server_error": 1, "refused": 1}
    assert result.score == pytest.approx(100 * (1 + 0.55) / 2) and result.n_scored == 2
