"""`balcaprl judge serve` against hostile requests: a body past the stated limit is 413 and costs the
server no more memory than the limit (a real process, real HTTP, its resident memory read from
/proc), and no malformed request of any protocol it serves is a 500 (property test over real HTTP)."""

from __future__ import annotations

import base64
import contextlib
import http.client
import io
import json
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from judge_testkit import judge_serve
from PIL import Image

from balcaprl.judge.rubrics import RUBRIC_NAMES, load_rubric
from balcaprl.judge.schemas import JUDGE_CALL_KINDS, schema_name
from balcaprl.testing.judge_server import MAX_BODY_BYTES

pytest.importorskip("balcaprl.synthetic.oracle")


def post(url: str, body: bytes | object, *, chunked: bool = False) -> tuple[int, bytes]:
    """POST ``body`` to ``url``'s chat completions; ``(status, response body)``. A body the server
    refuses part-way may break the send: the answer is read all the same."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
    try:
        headers = {"content-type": "application/json"}
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            connection.request(
                "POST", "/v1/chat/completions", body=body, headers=headers, encode_chunked=chunked
            )
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM in /proc/PID/status")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    from balcaprl.synthetic.build import build_dataset

    return build_dataset(tmp_path_factory.mktemp("synthetic"), n_train=2, n_eval=2, seed=0)


@pytest.fixture(scope="module")
def served(dataset):
    """``judge serve --oracle`` in a process of its own: ``(base_url, pid)``."""
    with judge_serve("--oracle", str(dataset)) as server:
        yield server


def test_a_body_past_the_limit_is_413_and_costs_no_more_than_the_limit(served):
    url, pid = served
    assert post(url, b"{}")[0] == 400  # warm: the first request's imports are not the body's cost
    before = peak_rss_kib(pid)
    huge = 200 * 2**20

    def chunks():  # 200 MB without a Content-Length: the server must count as it reads
        piece = b"x" * 2**20
        for _ in range(huge // len(piece)):
            yield piece

    status, answer = post(url, chunks(), chunked=True)
    assert status == 413, answer
    assert f"limit of {MAX_BODY_BYTES:,} bytes".encode() in answer
    declared = post(url, b"{" + b" " * (MAX_BODY_BYTES + 1) + b"}")  # refused from its Content-Length
    assert declared[0] == 413
    growth_mib = (peak_rss_kib(pid) - before) / 1024
    # the old server held the whole body several times over (+600 MB for 200 MB); now at most the limit
    assert growth_mib < 2 * MAX_BODY_BYTES / 2**20, growth_mib
    assert post(url, b"{}")[0] == 400  # still serving


def png_url(color=(200, 30, 30)) -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), color).save(buffer, "PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def captionqa_body(options: str, question: str = "Is there a red circle?") -> dict:
    text = f"Caption:\n<caption>\nA red circle.\n</caption>\n\nQuestion:\n{question}\n\nOptions:\n{options}\n\nAnswer:"
    return {"model": "m", "messages": [{"role": "system", "content": load_rubric("captionqa_answer").text},
                                       {"role": "user", "content": text}]}  # fmt: skip


@pytest.mark.parametrize(
    ("options", "question", "status"),
    [
        ("A. Yes\nB. No", "Is there a red circle?", 200),  # well formed: answered
        ("A Yes\nB. No", "Is there a red circle?", 400),  # an option line without ". "
        ("A. Yes", "Is there a blue star?", 400),  # one option, and not the answer
        ("A. Maybe\nB. Perhaps", "Is there a red circle?", 400),  # neither Yes nor No to choose
        ("", "Is there a red circle?", 400),  # no options at all
    ],
)
def test_captionqa_requests_the_oracle_cannot_read_are_400(served, options, question, status):
    got, answer = post(served[0], json.dumps(captionqa_body(options, question)).encode())
    assert got == status, answer


_SCHEMA_NAMES = sorted({schema_name(kind) for kind in JUDGE_CALL_KINDS}) + [
    schema_name(kind)
    for kind in ("verdict", "dcscore_extract", "dcscore_match", "dcscore_verify", "captionqa_answer",
                 "caparena_compare", "recaption_strict", "no_such_call")
]  # fmt: skip
_SYSTEMS = [load_rubric(name).text for name in RUBRIC_NAMES if load_rubric(name).text] + ["", "judge this"]
_FRAGMENTS = [
    "Question:\n", "\n\nOptions:\n", "A. Yes", "B. No", "A", "A.Yes", ". ", "\n", "\n\nAnswer:",
    "Is there a red circle?", "Is there a ?", "cannot answer", "Caption:\n", "<caption>\n", "\n</caption>",
    "<reference>\n", "\n</reference>", "<reference_assertions>\n", "\n</reference_assertions>", "1. ", "2.",
    "<facts>\n", "\n</facts>", "<predicted_facts>\n", "\n</predicted_facts>", "<oracle_facts>\n",
    "\n</oracle_facts>", "<caption_1>\n", "\n</caption_1>", "<caption_2>\n", "\n</caption_2>",
    "<reference_caption>\n", "\n</reference_caption>", " [x]", "&lt;", "a red circle", "\x00", "\ud800",
]  # fmt: skip
_lines = st.lists(st.sampled_from([*_FRAGMENTS, "A. Yes", "B. No", "C. I cannot answer", "1. a red circle",
                                    "2. a blue star [x]", ""]), max_size=4).map("\n".join)  # fmt: skip
_TAGS = ["caption", "reference", "reference_assertions", "facts", "predicted_facts", "oracle_facts", "caption_1",
         "caption_2", "reference_caption"]  # fmt: skip
_block = st.tuples(st.sampled_from(_TAGS), _lines).map(lambda t: f"<{t[0]}>\n{t[1]}\n</{t[0]}>")
_question = st.one_of(
    st.sampled_from(["Is there a red circle?", "Is there a blue star?", "What is it?", ""]), _lines
)
_captionqa_text = st.builds(
    lambda c, q, o: f"Caption:\n<caption>\n{c}\n</caption>\n\nQuestion:\n{q}\n\nOptions:\n{o}\n\nAnswer:",
    _lines, _question, _lines,
)  # fmt: skip
_text = st.one_of(
    st.lists(st.sampled_from(_FRAGMENTS), max_size=14).map("".join),
    st.lists(_block, max_size=4).map("\n\n".join),
    _captionqa_text,
)
_junk = st.one_of(st.none(), st.integers(), st.booleans(), st.just([]), st.just({}))
# SCENE_IMAGE is replaced by an image of the served dataset: the oracle knows its scene
_image_url = st.one_of(
    st.sampled_from(["SCENE_IMAGE", png_url(), "data:image/png;base64,!!!", "data:image/png;base64,aGVsbG8=",
                     "http://x/a.png"]),
    _junk,
)  # fmt: skip
_part = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": st.one_of(_text, _junk)}),
    st.fixed_dictionaries({"type": st.just("image_url"), "image_url": st.one_of(
        st.fixed_dictionaries({"url": _image_url}), _junk)}),
    _junk,
    st.text(max_size=3),
)  # fmt: skip
_content = st.one_of(_text, st.lists(_part, max_size=3), _junk)
_shaped = st.builds(
    lambda system, user: [{"role": "system", "content": system}, {"role": "user", "content": user}],
    st.sampled_from(_SYSTEMS),
    st.one_of(_text, st.lists(_part, max_size=3),
              st.builds(lambda url, text: [{"type": "image_url", "image_url": {"url": url}},
                                           {"type": "text", "text": text}], _image_url, _text)),
)  # fmt: skip
_message = st.one_of(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "user", "assistant", "tool"]), "content": _content}
    ),
    st.fixed_dictionaries({"role": st.just("system"), "content": st.sampled_from(_SYSTEMS)}),
    _junk,
    st.text(max_size=3),
)
_format = st.one_of(
    st.fixed_dictionaries({"type": st.just("json_schema"), "json_schema": st.one_of(
        st.fixed_dictionaries({"name": st.sampled_from(_SCHEMA_NAMES)}, optional={"schema": _junk}), _junk)}),
    _junk,
)  # fmt: skip
# A request of one protocol (its system message, and its response format or none) whose text is hostile
_protocol = st.builds(
    lambda kind, named, user: {"model": "m", "messages": [{"role": "system", "content": load_rubric(kind).text},
                                                          {"role": "user", "content": user}],
                               **({"response_format": {"type": "json_schema", "json_schema": {"name": named}}}
                                  if named else {})},
    st.sampled_from([name for name in RUBRIC_NAMES if load_rubric(name).text]),
    st.one_of(st.none(), st.sampled_from(_SCHEMA_NAMES)),
    st.one_of(st.one_of(_captionqa_text, st.lists(_block, max_size=4).map("\n\n".join)),
              st.builds(lambda url, text: [{"type": "image_url", "image_url": {"url": url}},
                                           {"type": "text", "text": text}], _image_url, _text)),
)  # fmt: skip
_wild = st.fixed_dictionaries(
    {"messages": st.one_of(_shaped, st.lists(_message, max_size=4), _junk)},
    optional={
        "model": st.one_of(st.text(max_size=5), _junk),
        "response_format": _format,
        "stream": st.one_of(st.booleans(), _junk),
        "max_tokens": _junk,
        "temperature": _junk,
    },
)


@pytest.fixture(scope="module")
def scene_image(dataset) -> str:
    image = sorted((dataset / "images").rglob("*.png"))[0]
    return "data:image/png;base64," + base64.b64encode(image.read_bytes()).decode()


_body = st.one_of(_protocol, _wild)


# Found by the property below: a coverage follow-up whose last user message lists no numbers (was a 500).
_FOLLOWUP_WITHOUT_LIST = json.dumps({
    "model": "m",
    "messages": [{"role": "system", "content": load_rubric("training").text},
                 {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "SCENE_IMAGE"}},
                                              {"type": "text", "text": "<reference>\n\n</reference>"}]}],
    "response_format": {"type": "json_schema", "json_schema": {"name": "balcaprl_coverage_missing"}},
})  # fmt: skip


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.one_of(_body.map(lambda b: json.dumps(b)), st.binary(max_size=64)))
@example(body=_FOLLOWUP_WITHOUT_LIST)
def test_no_malformed_request_of_any_protocol_is_a_500(served, scene_image, body):
    if isinstance(body, str):
        body = body.replace('"SCENE_IMAGE"', json.dumps(scene_image)).encode("utf-8", "surrogatepass")
    status, answer = post(served[0], body)
    assert status < 500, (status, answer, body[:2000])
