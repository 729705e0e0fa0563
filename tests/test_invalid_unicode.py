"""The one place that decides whether a text can be sent to a judge (``balcaprl.files.unicode_refusal``)
and its two users: ``score``'s rows (``usable_unicode``) and a batch of judge requests
(``balcaprl.judge.protocol.sendable_requests``), checked against simple second implementations over
texts that mix lone surrogates in; and the JSON writers that keep such a text as its escape."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from balcaprl.errors import InputError
from balcaprl.files import JsonlLog, atomic_write_json_text, jsonl_values, unicode_refusal, usable_unicode
from balcaprl.judge.protocol import JudgeFailure, JudgeRequest, sendable_requests

# mostly plain text, sometimes a lone high or low surrogate
texts = st.text(alphabet=st.sampled_from(["a", " ", "é", "\U0001f600", "\ud800", "\udfff"]), max_size=6)


def first_surrogate(text: str) -> int | None:
    """The 0-based position of the first lone surrogate (Python strings hold no pairs: every
    surrogate in one is lone)."""
    return next((i for i, c in enumerate(text) if 0xD800 <= ord(c) <= 0xDFFF), None)


def reason(text: str) -> str | None:
    at = first_surrogate(text)
    return (
        None
        if at is None
        else f"not valid Unicode: a lone surrogate U+{ord(text[at]):04X} at character {at + 1}"
    )


def test_the_reason_by_hand():
    assert unicode_refusal([("caption", "A red door.")], "row 'r1'") is None
    assert unicode_refusal([("caption", "ok"), ("reference", "A \udc80b")], "image 'a.jpg'") == (
        "the reference of image 'a.jpg' is not valid Unicode: a lone surrogate U+DC80 at character 3"
    )


@given(st.lists(st.tuples(st.sampled_from(["caption", "reference"]), texts), max_size=4))
def test_the_first_invalid_text_is_named(pairs):
    bad = [(what, text) for what, text in pairs if first_surrogate(text) is not None]
    expected = None if not bad else f"the {bad[0][0]} of row 'x' is {reason(bad[0][1])}"
    assert unicode_refusal(pairs, "row 'x'") == expected


@given(st.lists(st.tuples(texts, texts), max_size=5))
def test_score_rows_are_refused_as_before(rows):
    # score's former _usable_unicode, written out again: the image name, then the text
    refused = {}
    for i, (image, text) in enumerate(rows):
        why = reason(image) or reason(text)
        if why is not None:
            refused[i] = f"the caption of this row is {why}"
    usable, got = usable_unicode(rows, "caption")
    assert got == refused
    assert all(unicode_refusal([("t", a), ("t", b)], "-") is None for a, b in usable)  # all writable
    assert [(a, b) for i, (a, b) in enumerate(usable) if i not in refused] == [
        r for i, r in enumerate(rows) if i not in refused
    ]


@given(st.lists(st.tuples(texts, texts, texts), max_size=5))
def test_a_batch_sends_the_valid_requests_and_keeps_the_order(triples):
    requests = [
        JudgeRequest(image=f"img/{i}{name}", caption=c, reference=r) for i, (name, c, r) in enumerate(triples)
    ]
    batch = sendable_requests(requests, [f"row {i}" for i in range(len(requests))])
    valid = [
        r for r in requests if all(first_surrogate(t) is None for t in (r.image, r.caption, r.reference))
    ]
    assert batch.sent == valid
    for i, failure in batch.refused.items():
        r = requests[i]
        what, text = next((w, t) for w, t in [("image name", r.image), ("caption", r.caption),
                                              ("reference", r.reference)] if reason(t))  # fmt: skip
        assert failure == JudgeFailure("bad_input", f"the {what} of row {i} is {reason(text)}")
    judged = [JudgeFailure("timeout", f"sent {i}") for i in range(len(batch.sent))]
    outcomes = batch.outcomes(judged)
    assert len(outcomes) == len(requests)
    assert [o for i, o in enumerate(outcomes) if i not in batch.refused] == judged
    assert all(outcomes[i] is f for i, f in batch.refused.items())


def test_image_bytes_have_no_name_to_check():
    (request,) = sendable_requests(
        [JudgeRequest(image=b"\x89PNG", caption="a", reference="b")], ["row 0"]
    ).sent
    assert request.image == b"\x89PNG"


def test_json_writers_keep_a_lone_surrogate_as_its_escape(tmp_path):
    record = {"caption": "A red \ud800door.", "café": "é"}
    with JsonlLog(tmp_path / "record.jsonl") as log:
        log.append(record)
    assert JsonlLog(tmp_path / "record.jsonl").read() == [record]
    atomic_write_json_text(tmp_path / "a.json", json.dumps(record, ensure_ascii=False))
    assert json.loads((tmp_path / "a.json").read_text(encoding="utf-8")) == record
    assert "é" in (tmp_path / "a.json").read_text(encoding="utf-8")  # valid text stays as it is


def test_jsonl_values_number_lines_skip_blanks_and_keep_u2028_inside_a_string():
    text = '{"a": 1}\n\n  \n"x\u2028y"\n[2]\n'
    assert list(jsonl_values(text, "f.jsonl")) == [(1, {"a": 1}), (4, "x\u2028y"), (5, [2])]
    with pytest.raises(InputError, match=r"^f\.jsonl:2: not JSON \(Expecting value\)$"):
        list(jsonl_values('{"a": 1}\noops', "f.jsonl"))
