"""With the official prompts, each protocol's requests are the official code's requests: each is sent
to a capture server (a real HTTP server on 127.0.0.1) and its body compared with the body the fake
official checkout builds when its own request code runs (official_fakes.run_fake): the same JSON value,
compared as canonical bytes (sorted keys, no spaces), so every text, message shape, field name and
number (1 is not 1.0) must be equal; then as the bytes on the wire, against the bytes the official
client makes of the official body: DeCapBench's through the installed openai client itself (its
request captured in memory), CapArena's and lmms-eval's as ``requests.post(json=...)`` serialises
them (``json.dumps`` with its defaults, UTF-8), in the key order of the script's own dict.

The texts carry what the guard would change (surrounding spaces, a control character, ``<`` and
``&``), so a cleaned, stripped or escaped text fails the comparison."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from evaluate_testkit import judge_config, png
from official_fakes import (
    FAKE_CAPARENA,
    FAKE_DECAPBENCH,
    FAKE_LMMS_UTILS,
    OfficialRecorder,
    fake_caparena,
    fake_decapbench,
    fake_lmms_eval,
    run_fake,
)

from balcaprl.evaluate.caparena import CapArenaSection, positions, run_caparena
from balcaprl.evaluate.captionqa import CaptionQASection, run_captionqa
from balcaprl.evaluate.dcscore import DCScoreSection, run_dcscore
from balcaprl.evaluate.formats import read_caparena, read_caption_sets, read_captionqa, read_decapbench
from balcaprl.evaluate.official import (
    OFFICIAL_TEXT_CHANGE,
    departures,
    load_caparena_prompts,
    load_captionqa_task,
    load_decapbench_prompts,
)
from balcaprl.judge import JudgeCaller

# What a guard would change: surrounding spaces and newlines, a control character, markup, an ampersand.
CAPTION = "  A red <b>door</b> & an\x07 old cat.\n"
REFERENCE = " A red door & a cat.\n"


def canonical(body: Any) -> bytes:
    return json.dumps(body, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def requests_bytes(body: dict[str, Any]) -> bytes:
    """What ``requests.post(url, json=body)`` sends: ``json.dumps(body, allow_nan=False)``, UTF-8."""
    return json.dumps(body, allow_nan=False).encode("utf-8")


class OpenAIWire:
    """The installed openai client on an in-memory transport: ``chat.completions.create`` builds and
    sends its request as it would to the API; ``raw`` keeps the bytes, the reply is ``answer``."""

    def __init__(self, answer: str = "A"):
        import httpx
        import openai

        self.raw: list[bytes] = []

        def reply(request: httpx.Request) -> httpx.Response:
            self.raw.append(request.read())
            choice = {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": answer},
            }
            return httpx.Response(200, json={"id": "x", "object": "chat.completion", "created": 0,
                                             "model": "m", "choices": [choice]})  # fmt: skip

        http = httpx.Client(transport=httpx.MockTransport(reply))
        self.client = openai.OpenAI(api_key="unused", base_url="http://wire.invalid/v1", http_client=http)
        self.chat = self.client.chat


class CaptureServer:
    """A chat-completions endpoint that keeps every request body's bytes; ``answer(body)`` gives the
    reply's text."""

    def __init__(self, answer: Callable[[dict[str, Any]], str]):
        self.raw: list[bytes] = []
        capture = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                raw = self.rfile.read(int(self.headers["Content-Length"]))
                capture.raw.append(raw)
                body = json.loads(raw)
                text = answer(body)  # one text for as many choices as n asks, or a list: the choices
                texts = text if isinstance(text, list) else [text] * body.get("n", 1)
                reply = {
                    "choices": [{"index": i, "finish_reason": "stop", "message": {"role": "assistant", "content": t}}
                                for i, t in enumerate(texts)],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1},
                }  # fmt: skip
                data = json.dumps(reply).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def bodies(self) -> list[dict[str, Any]]:
        return [json.loads(raw) for raw in self.raw]


@pytest.fixture
def capture() -> Iterator[Callable[..., CaptureServer]]:
    started: list[CaptureServer] = []

    def start(answer: Callable[[dict[str, Any]], str]) -> CaptureServer:
        server = CaptureServer(answer)
        server.thread.start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.server.shutdown()
        server.server.server_close()


def _user_text(body: dict[str, Any]) -> str:
    content = body["messages"][1]["content"]
    return content if isinstance(content, str) else content[-1]["text"]


def _one(bodies: list[dict[str, Any]], prefix: str) -> dict[str, Any]:
    """The body of a step (its samples' bodies are all the same: they differ only in the cache)."""
    found = [b for b in bodies if _user_text(b).startswith(prefix)]
    assert found and all(canonical(b) == canonical(found[0]) for b in found), prefix
    return found[0]


# ----------------------------------------------------------------------------------------- DCScore

ORACLE = ["There is a red door. ", " A cat."]
FACTS = [{"fact": "A red <b>door</b> & more", "identifier": "door", "relevance": 1},
         {"fact": "The cat is old", "relevance": 0}]  # fmt: skip


def _dcscore_answer(body: dict[str, Any]) -> str:
    text = _user_text(body)
    if text.startswith("PLACEHOLDER-EXTRACT"):
        return f"```json\n{FACTS!r}\n```"
    facts = [f["fact"] for f in FACTS]
    if text.startswith("PLACEHOLDER-MATCH"):
        return "```json\n" + json.dumps([{"fact": f, "matched_oracle_id": 0} for f in facts]) + "\n```"
    return "```json\n" + json.dumps([{"fact": f, "verification": 1} for f in facts]) + "\n```"


def _dcscore_setup(tmp_path):
    images = tmp_path / "images"
    images.mkdir()
    (images / "img.png").write_bytes(png((200, 30, 40), size=40))  # the official code re-encodes it as JPEG
    annotations = tmp_path / "oracle.jsonl"
    row = {"image_name": "img.png", "oracle_caption": REFERENCE, "oracle_facts": ORACLE}
    annotations.write_text(json.dumps(row) + "\n")
    captions_file = tmp_path / "captions.jsonl"
    rows = [{"image_path": "img.png", "caption": CAPTION}, {"image_path": "unused.png", "caption": "x"}]
    captions_file.write_text("".join(json.dumps(row) + "\n" for row in rows))
    captions = read_caption_sets([captions_file])["decapbench"]
    return read_decapbench(annotations), captions, images


def test_dcscore_requests_are_the_official_scripts(tmp_path, capture):
    items, captions, images = _dcscore_setup(tmp_path)
    assert captions.lookup("img.png") == CAPTION  # read as written
    server = capture(_dcscore_answer)
    prompts = load_decapbench_prompts(fake_decapbench(tmp_path / "DeCapBench"))
    config = judge_config(server.base_url, model="gpt-4o-2024-05-13")
    result = run_dcscore(JudgeCaller(config), items, captions, tmp_path / "out", DCScoreSection(images=images),
                         prompts=prompts)  # fmt: skip
    assert result.n_scored == 1 and not result.failures
    assert "change" not in result.settings["prompts"] and result.settings["guard"] is False

    # what the official script sends, step by step as its main() calls it: one extraction (n=1), then
    # the 3 matching and the 3 verification samples, each step in one request (n=3)
    official = run_fake(FAKE_DECAPBENCH)
    sent = OfficialRecorder()
    listed = official["format_json_input"]
    shown = [{k: v for k, v in f.items() if k != "relevance"} for f in FACTS]
    official["run_gpt_text"](
        sent, prompt=official["extract_prompt"].format(caption=CAPTION), temperature=1, n=1
    )
    matching = official["match_prompt"].format(
        predicted_atomic_facts=listed(shown),
        oracle_atomic_facts=listed([{"id": i, "fact": f} for i, f in enumerate(ORACLE)]),
    )
    official["run_gpt_text"](sent, prompt=matching, temperature=1, n=3)
    verifying = official["verify_prompt"].format(reference_caption=REFERENCE, atomic_facts=listed(shown))
    official["run_gpt_multimodal"](sent, prompt=verifying, image_path=str(images / "img.png"), temperature=0.3,
                                   detail="high", n=3)  # fmt: skip

    ours = server.bodies()
    for step, theirs in zip(("PLACEHOLDER-EXTRACT", "PLACEHOLDER-MATCH", "PLACEHOLDER-VERIFY"), sent.bodies,
                            strict=True):  # fmt: skip
        assert canonical(_one(ours, step)) == canonical(theirs), step
    assert all("max_tokens" in b and "max_completion_tokens" not in b for b in ours)

    # byte for byte: the same calls through the installed openai client (the official one)
    wire = OpenAIWire()
    official["run_gpt_text"](
        wire, prompt=official["extract_prompt"].format(caption=CAPTION), temperature=1, n=1
    )
    official["run_gpt_text"](wire, prompt=matching, temperature=1, n=3)
    official["run_gpt_multimodal"](wire, prompt=verifying, image_path=str(images / "img.png"), temperature=0.3,
                                   detail="high", n=3)  # fmt: skip
    steps = ("PLACEHOLDER-EXTRACT", "PLACEHOLDER-MATCH", "PLACEHOLDER-VERIFY")
    for step, theirs in zip(steps, wire.raw, strict=True):
        mine = [raw for raw in server.raw if _user_text(json.loads(raw)).startswith(step)]
        assert mine and all(raw == theirs for raw in mine), step
    assert len(server.raw) == 3  # 3 of 3 bodies equal as bytes
    assert result.settings["samples_sent"] == "one"


def test_the_guard_is_an_option_recorded_and_not_comparable(tmp_path, capture):
    items, captions, images = _dcscore_setup(tmp_path)
    server = capture(_dcscore_answer)
    prompts = load_decapbench_prompts(fake_decapbench(tmp_path / "DeCapBench"))
    settings = DCScoreSection(images=images, guard=True)
    result = run_dcscore(JudgeCaller(judge_config(server.base_url)), items, captions, tmp_path / "out", settings,
                         prompts=prompts)  # fmt: skip
    extract = _user_text(_one(server.bodies(), "PLACEHOLDER-EXTRACT"))
    # cleaned, stripped and escaped in a data block
    assert (
        "%% PLACEHOLDER caption:\n<caption>\nA red &lt;b&gt;door&lt;/b&gt; &amp; an old cat.\n</caption>\n"
        in extract
    )
    assert result.settings["guard"] is True and result.settings["prompts"]["change"] == OFFICIAL_TEXT_CHANGE
    assert departures(result.settings, {"guard": (False,)}) == ["guard=True (official: False)"]


# ----------------------------------------------------------------------------------------- CapArena


def test_caparena_requests_are_the_official_scripts(tmp_path, capture):
    images = tmp_path / "images"
    images.mkdir()
    (images / "img.png").write_bytes(png((10, 120, 30)))  # the official script labels every image PNG
    baseline, human = " The baseline's <i>caption</i>\x01 \n", "  A human & reference.\n"
    annotations = tmp_path / "caparena_auto_600.json"
    annotations.write_text(json.dumps(
        {"img.png": {"ref_model": "GPT-4o-0806", "captions": {"GPT-4o-0806": baseline, "human": human}}}
    ))  # fmt: skip
    captions_file = tmp_path / "ours.json"
    captions_file.write_text(json.dumps({"img.png": CAPTION}))
    captions = read_caption_sets([captions_file])[None]
    server = capture(lambda body: "Reason: close.\nJudgment: Tie")
    prompts = load_caparena_prompts(fake_caparena(tmp_path / "CapArena"))
    config = judge_config(server.base_url, model="gpt-4o-2024-08-06")
    result = run_caparena(JudgeCaller(config), read_caparena(annotations), captions, tmp_path / "out",
                          CapArenaSection(images=images), prompts=prompts)  # fmt: skip
    assert result.metrics["per_baseline"]["GPT-4o-0806"]["ties"] == 1

    # the official script's pair file, with the positions of our draw (theirs is unseeded)
    first, second = (CAPTION, baseline) if positions("img.png") else (baseline, CAPTION)
    pairs = tmp_path / "pairs.json"
    pairs.write_text(json.dumps([{"img": "img.png", "caption1": first, "caption2": second, "ref": human}]))
    sent = OfficialRecorder("Reason: close.\nJudgment: Tie")
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(sys.modules, "requests", sent)
        run_fake(FAKE_CAPARENA)["mllm_judge_pairs"](str(pairs), str(images))
    (ours,) = server.bodies()
    assert canonical(ours) == canonical(sent.bodies[0])
    assert server.raw == [requests_bytes(sent.bodies[0])]  # byte for byte, as requests sends it
    assert ours["messages"][0]["content"] == [{"type": "text", "text": prompts.system}]  # a list of one part


# ----------------------------------------------------------------------------------------- CaptionQA

QUESTIONS = [
    {"id": "nat_1", "questions": [
        {"question": " What shape <is> it?", "choices": ["Round ", "Square"], "answer": "Round", "category": ["Shape"]},
        {"question": "Is it red?", "choices": ["Yes", "No"], "answer": "Yes", "category": ["Colour"]}]},
]  # fmt: skip


@pytest.mark.parametrize(
    "rules",
    [{}, {"cannot_answer": "position", "shuffle_over": "all", "rounding": "mean"}],
    ids=["qa.py", "lmms-eval"],
)
def test_captionqa_requests_are_the_official_tasks(tmp_path, capture, rules):
    questions = tmp_path / "captionqa.jsonl"
    questions.write_text("".join(json.dumps(r) + "\n" for r in QUESTIONS))
    captions_file = tmp_path / "ours.json"
    captions_file.write_text(json.dumps({"nat_1": CAPTION}))
    captions = read_caption_sets([captions_file])[None]
    server = capture(lambda body: "(A)")
    task = load_captionqa_task(str(fake_lmms_eval(tmp_path / "lmms-eval")))
    config = judge_config(server.base_url, model="PLACEHOLDER/judge")
    result = run_captionqa(JudgeCaller(config), read_captionqa(questions), captions, tmp_path / "out",
                           CaptionQASection(**rules), prompts=task)  # fmt: skip
    assert result.n_scored == 2
    rows = [json.loads(line) for line in (tmp_path / "out" / "items.jsonl").read_text().splitlines()]

    sent = OfficialRecorder("(A)")
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(sys.modules, "requests", sent)
        official = run_fake(FAKE_LMMS_UTILS)
        for row in sorted(rows, key=lambda r: r["question_index"]):
            official["call_llm_judge"](
                official["build_caption_qa_prompt"](CAPTION, row["question"], row["options_shown"])
            )
    ours = sorted(server.bodies(), key=lambda b: "Is it red" in _user_text(b))
    assert [canonical(b) for b in ours] == [canonical(b) for b in sent.bodies]
    raw = sorted(server.raw, key=lambda r: "Is it red" in _user_text(json.loads(r)))
    assert raw == [requests_bytes(b) for b in sent.bodies]  # byte for byte, as requests sends them
    assert all(b["max_tokens"] == 4 and "max_completion_tokens" not in b for b in ours)


def test_captionqa_with_our_prompts_sends_max_tokens_too(tmp_path, capture):
    questions = tmp_path / "captionqa.jsonl"
    questions.write_text(json.dumps(QUESTIONS[0]) + "\n")
    captions_file = tmp_path / "ours.json"
    captions_file.write_text(json.dumps({"nat_1": CAPTION}))
    server = capture(lambda body: "A")
    run_captionqa(JudgeCaller(judge_config(server.base_url)), read_captionqa(questions),
                  read_caption_sets([captions_file])[None], tmp_path / "out")  # fmt: skip
    assert {b["max_tokens"] for b in server.bodies()} == {4}
    assert all("max_completion_tokens" not in b for b in server.bodies())


def test_a_text_that_is_no_valid_unicode_is_sent_escaped(tmp_path, capture):
    # A lone surrogate (a caption file may hold "\ud83d" alone) cannot be encoded as UTF-8: the body
    # then goes with every non-ASCII character escaped, as ``requests`` sends it (the official code).
    questions = tmp_path / "captionqa.jsonl"
    questions.write_text(json.dumps(QUESTIONS[0]) + "\n")
    captions_file = tmp_path / "ours.json"
    captions_file.write_text('{"nat_1": "A cat \\ud83d and a caf\\u00e9."}')
    captions = read_caption_sets([captions_file])[None]
    server = capture(lambda body: "(A)")
    task = load_captionqa_task(str(fake_lmms_eval(tmp_path / "lmms-eval")))
    result = run_captionqa(JudgeCaller(judge_config(server.base_url)), read_captionqa(questions), captions,
                           tmp_path / "out", prompts=task)  # fmt: skip
    assert result.n_scored == 2 and not result.failures
    assert all(b"A cat \\ud83d and a caf\\u00e9." in raw for raw in server.raw)


def test_dcscore_rows_keep_a_caption_that_is_no_valid_unicode(tmp_path, capture):
    items, _, images = _dcscore_setup(tmp_path)
    caption = "A red door \ud83d."
    captions_file = tmp_path / "odd.json"
    captions_file.write_text(json.dumps({"img.png": caption}))  # written with the surrogate escaped
    server = capture(_dcscore_answer)
    prompts = load_decapbench_prompts(fake_decapbench(tmp_path / "DeCapBench"))
    result = run_dcscore(JudgeCaller(judge_config(server.base_url)), items, read_caption_sets([captions_file])[None],
                         tmp_path / "out", DCScoreSection(images=images), prompts=prompts)  # fmt: skip
    assert result.n_scored == 1
    (row,) = [json.loads(line) for line in (tmp_path / "out" / "items.jsonl").read_text().splitlines()]
    assert row["caption"] == caption


def test_with_the_guard_a_text_that_is_no_valid_unicode_is_refused_as_ours_are(tmp_path, capture):
    # The guard cleans every text as our prompts do, which would put U+FFFD where the surrogate was:
    # as with our prompts (tests/evaluate/test_evaluate_invalid_unicode.py) the row is a bad_input,
    # never sent; without the guard (above) it goes JSON-escaped, as the official code sends it.
    questions = tmp_path / "captionqa.jsonl"
    questions.write_text(json.dumps(QUESTIONS[0]) + "\n")
    captions_file = tmp_path / "ours.json"
    captions_file.write_text('{"nat_1": "A cat \\ud83d and a caf\\u00e9."}')
    server = capture(lambda body: "(A)")
    task = load_captionqa_task(str(fake_lmms_eval(tmp_path / "lmms-eval")))
    result = run_captionqa(JudgeCaller(judge_config(server.base_url)), read_captionqa(questions),
                           read_caption_sets([captions_file])[None], tmp_path / "out", CaptionQASection(guard=True),
                           prompts=task)  # fmt: skip
    assert result.failures == {"bad_input": 2} and result.n_scored == 0 and server.raw == []
    rows = [json.loads(line) for line in (tmp_path / "out" / "items.jsonl").read_text().splitlines()]
    assert {r["detail"] for r in rows} == {
        "the caption of image 'nat_1' is not valid Unicode: a lone surrogate U+D83D at character 7"
    }


# ----------------------------------------------------------------------------------------- the rules record


def test_every_result_names_its_rules_and_flags_each_deviation(tmp_path):
    from balcaprl.evaluate.caparena import OFFICIAL_OPTIONS as ARENA
    from balcaprl.evaluate.captionqa import OFFICIAL_OPTIONS as CQA
    from balcaprl.evaluate.official import REMAINING_DIFFERENCES, scoring_rules
    from balcaprl.evaluate.report import build_report

    official = {"kind": "official"}
    arena = {**CapArenaSection().options(), "images_sent": "official", "prompts": official}
    assert scoring_rules("caparena", arena, ARENA) == {
        "rules": "official", "deviations": [], "remaining_differences": list(REMAINING_DIFFERENCES["caparena"])
    }  # fmt: skip
    retried = {**arena, "http_errors": "retry", "prompts": {"kind": "paraphrase"}}
    assert scoring_rules("caparena", retried, ARENA)["deviations"] == [
        "prompts: paraphrase (not the official ones)", "option http_errors='retry' (official: 'try')"
    ]  # fmt: skip
    lmms = {**CaptionQASection(shuffle_over="all", cannot_answer="position", rounding="mean").options(),
            "prompts": official}  # fmt: skip
    assert scoring_rules("captionqa", lmms, CQA)["variant"] == "lmms-eval"
    assert scoring_rules("captionqa", {**lmms, "rounding": "question"}, CQA)["variant"].startswith("mixed")

    # report and inspect read them back from eval.json
    run = tmp_path / "run"
    run.mkdir()
    entry = {"score": 1.0, "complete": True, "comparable_with_paper": False, "not_comparable": ["x"]}
    record = {"label": "run", "headline": {"caparena": 1.0}, "results": {
        "caparena": {**entry, "rules": scoring_rules("caparena", retried, ARENA)},
        "dcscore": {**entry}}}  # fmt: skip
    (run / "eval.json").write_text(json.dumps(record))
    markdown = build_report([run], tmp_path / "report").markdown
    assert (
        "Scoring rules, run: caparena: official, with deviations; deviations: prompts: paraphrase (not the "
        "official ones); option http_errors='retry' (official: 'try') | dcscore: not recorded" in markdown
    )


def test_several_samples_in_one_request(tmp_path, capture):
    import asyncio

    server = capture(lambda body: [" one ", None, "three"])  # the second choice has no text
    caller = JudgeCaller(judge_config(server.base_url, cache_path=tmp_path / "cache.sqlite"))
    messages = [{"role": "user", "content": "x"}]

    async def ask():
        return await caller.call_texts(
            messages, 3, kind="k", temperature=1, max_tokens=5, token_field="max_tokens"
        )

    first = asyncio.run(ask())
    assert first.value == ["one", "", "three"] and not first.cached
    assert json.loads(server.raw[0])["n"] == 3 and json.loads(server.raw[0])["max_tokens"] == 5
    again = asyncio.run(ask())  # from the cache: no second request
    assert again.value == first.value and again.cached and len(server.raw) == 1
    asyncio.run(caller.aclose())
