"""The official scorers' rules, each on a fixture in the benchmark's own format, with the expected
values computed by hand from the official definitions (the hand computation is in the comments):
files read as published, DCScore's invalid captions and its text-keyed arithmetic with the official
prompts, CaptionQA's empty answers, token budget, rounding, shuffling and multi-image captioning,
CapArena's free-text judgments, and the official image handling."""

from __future__ import annotations

import ast
import io
import json
import random
import re
from collections import Counter

import pytest
from evaluate_testkit import CAPTIONQA_ROWS, ProtocolJudge, judge_config, png, write_caparena
from official_fakes import FAKE_SYSTEM, fake_caparena, fake_captionqa_repo, fake_decapbench, fake_lmms_eval
from PIL import Image

from balcaprl.errors import ConfigError, InputError
from balcaprl.evaluate.caparena import CapArenaSection, read_official_judgment, run_caparena
from balcaprl.evaluate.captioning import caption_items, collect_items
from balcaprl.evaluate.captionqa import CaptionQASection, prepare_questions, run_captionqa, score_answer
from balcaprl.evaluate.dcscore import (
    DCScoreSection,
    fact_list_json,
    parse_fenced_json,
    run_dcscore,
    score_trial,
)
from balcaprl.evaluate.formats import read_caparena, read_caption_sets, read_captionqa, read_decapbench
from balcaprl.evaluate.official import (
    load_caparena_prompts,
    load_captionqa_multi_image_line,
    load_captionqa_task,
    load_decapbench_prompts,
)
from balcaprl.judge import JudgeCaller
from balcaprl.judge.protocol import JudgeFailure

# ----------------------------------------------------------------------------------------- DeCapBench file

# As published: facts and captions unstripped, and one blank fact " " (as at the end of
# aar_test_04840.jpg in human_annotated_oracle_facts.jsonl).
ORACLE = ["There is a red door. ", "The door is on the left.", " "]
DECAP_ROWS = [
    {"image_name": "aar_test_00001.jpg", "oracle_caption": "A red door.\nIt is on the left. ", "oracle_facts": ORACLE},
    {"image_name": "aar_test_00002.jpg", "oracle_caption": "A cat.", "oracle_facts": ["A cat. ", 7]},
    {"image_name": "aar_test_00003.jpg", "oracle_caption": "Old text.", "oracle_facts": ["Old."]},
    {"image_name": "aar_test_00004.jpg", "oracle_caption": "Empty.", "oracle_facts": []},
    {"image_name": "aar_test_00003.jpg", "oracle_caption": "New text.", "oracle_facts": ["New.", "Newer."]},
]  # fmt: skip


def write_decap(tmp_path, size=(1500, 40)):
    lines = [json.dumps(r) for r in DECAP_ROWS]
    lines.insert(3, '{"image_name": "aar_test_00005.jpg", "oracle_caption": ')  # a line cut short
    path = tmp_path / "human_annotated_oracle_facts.jsonl"
    path.write_text("\n".join(lines) + "\n")
    images = tmp_path / "images"
    images.mkdir(exist_ok=True)
    for row in DECAP_ROWS:
        buffer = io.BytesIO()
        Image.new("RGB", size, (200, 30, 30)).save(buffer, "PNG")
        (images / row["image_name"]).write_bytes(buffer.getvalue())
    return path, images


def test_decapbench_is_read_as_published_and_bad_rows_are_refused_one_by_one(tmp_path):
    path, _ = write_decap(tmp_path)
    items = read_decapbench(path)
    # before: the whole file refused ("'oracle_facts' must be a non-empty list of strings")
    assert [i.key for i in items] == ["aar_test_00001.jpg", "aar_test_00003.jpg"]
    first = items[0]
    assert first.oracle_facts == tuple(ORACLE) and len(first.oracle_facts) == 3  # the blank fact counts
    assert first.oracle_caption == "A red door.\nIt is on the left. "  # not stripped
    assert items[1].oracle_facts == ("New.", "Newer.")  # an image listed twice: the last row counts
    assert [str(r) for r in items.refused] == [  # lines that are not JSON, then rows that cannot be used
        f"{path}:4: not JSON (Expecting value)",
        f"{path}:2: aar_test_00002.jpg: oracle fact 1 is not a string",
        f"{path}:5: aar_test_00004.jpg: 'oracle_facts' must be a non-empty list",
        f"{path}:3: aar_test_00003.jpg: superseded by {path}:6 (the official scorer keeps the last)",
    ]


# ----------------------------------------------------------------------------------------- DCScore, official


def _between(text: str, before: str, after: str) -> str:
    """What the (placeholder) official template put between two of its lines: a slot's value as it is."""
    return re.search(re.escape(before) + "\n(.*?)\n" + re.escape(after), text, re.S).group(1)


def _fenced(text: str, before: str, after: str) -> list[dict]:
    """A JSON fact list from a request, read as the official layout."""
    return ast.literal_eval(_between(text, before, after).removeprefix("```json").removesuffix("```"))


class OfficialDCScoreJudge:
    """Answers the official (placeholder) DCScore prompts in free text, as GPT-4o answers the real ones.
    ``facts[caption]``: the extraction (None: an unusable answer); ``matches[fact]``: matched oracle id;
    ``verified[fact]``: 1 or 0. The first extraction of a caption listed in ``garbled`` is unusable."""

    def __init__(self, facts, matches, verified, garbled=()):
        self.facts, self.matches, self.verified, self.garbled = facts, matches, verified, set(garbled)
        self.calls: Counter = Counter()
        self.seen: list = []

    def __call__(self, call):
        self.seen.append(call)
        assert call.system == FAKE_SYSTEM and call.schema_name is None  # free text, as the script asks
        if call.text.startswith("PLACEHOLDER-EXTRACT"):
            self.calls["extract"] += 1
            caption = _between(call.text, "%% PLACEHOLDER caption:", "%% PLACEHOLDER list:")
            if caption in self.garbled:
                self.garbled.discard(caption)
                return "Sorry, here are the facts: fact one, fact two."
            items = [{"fact": f, "identifier": i, "relevance": r} for f, i, r in self.facts[caption]]
            return f"```json\n{items!r}\n```"  # a Python literal, as the official parser reads it first
        if call.text.startswith("PLACEHOLDER-MATCH"):
            self.calls["match"] += 1
            predicted = _fenced(call.text, "%% PLACEHOLDER ours:", "%% PLACEHOLDER theirs:")
            oracle = _fenced(call.text, "%% PLACEHOLDER theirs:", "%% PLACEHOLDER result:")
            assert oracle == [{"id": i, "fact": f} for i, f in enumerate(ORACLE)]  # 0-based, unstripped
            assert all("relevance" not in p for p in predicted)  # sent without relevance, as the script does
            answer = [{**p, "matched_oracle_id": self.matches.get(p["fact"])} for p in predicted]
            return "Matching:\n```json\n" + json.dumps(answer) + "\n```"  # null: the JSON fallback
        if call.text.startswith("PLACEHOLDER-VERIFY"):
            self.calls["verify"] += 1
            facts = _fenced(call.text + "<end>", "%% PLACEHOLDER facts:", "<end>")
            return (
                "```json\n"
                + json.dumps([{**f, "verification": self.verified[f["fact"]]} for f in facts])
                + "\n```"
            )
        raise AssertionError(f"unexpected request: {call.text[:80]}")


# Caption 1: x "A red door" (relevant), y "The door looks old" (not relevant, an inference),
# z "A black cat sits on the step" (relevant). x and y both match oracle fact 0, z matches none; the
# verifier confirms all three, in every sample. Oracle facts: n = 3 (the blank one counts).
#   all:      P = 3/3 = 1;  x and y share oracle 0 (k = 2): 1/2 + 1/2; z unmatched and verified: 1 and
#             joins the denominator -> R = 2 / (3 + 1) = 0.5;  F1 = 2 x 1 x 0.5 / 1.5 = 2/3
#   relevant: {x, z}: P = 1;  x still earns 1/2 (k counted over all facts) + z 1 -> R = 1.5 / 4 = 0.375;
#             F1 = 2 x 0.375 / 1.375 = 6/11
#   every one of the 9 trials is the same -> DCScore(caption 1) = (2/3 + 6/11) / 2 = 20/33 = 0.60606
#   (if the blank fact were dropped, n = 2: R = 2/3, F1 = 0.8; R_rel = 0.5, F1_rel = 2/3 -> 0.7333)
# Caption 2: only an inference (no relevant fact) -> the official formula divides by zero: invalid.
# Caption 3: blank -> asked, as the official script asks it; no fact in 5 tries -> invalid.
CAPTIONS = {
    "aar_test_00001.jpg": "A red door, which looks old; a black cat sits on the step.",
    "aar_test_00003.jpg": "It feels like a quiet morning.",
}
FACTS = {
    CAPTIONS["aar_test_00001.jpg"]: [
        ("A red door", "door_0", 1),
        ("The door looks old", "door_0", 0),
        ("A black cat sits on the step", "cat_0", 1),
    ],
    CAPTIONS["aar_test_00003.jpg"]: [("The morning feels quiet", "", 0)],
}
MATCHES = {"A red door": 0, "The door looks old": 0, "A black cat sits on the step": None}
VERIFIED = {"A red door": 1, "The door looks old": 1, "A black cat sits on the step": 1}
DC1 = (2 / 3 + 6 / 11) / 2


def test_dcscore_with_official_prompts_by_hand(tmp_path, eval_server):
    annotations, images = write_decap(tmp_path)
    items = read_decapbench(annotations)
    prompts = load_decapbench_prompts(fake_decapbench(tmp_path / "DeCapBench"))
    handler = OfficialDCScoreJudge(FACTS, MATCHES, VERIFIED, garbled=[CAPTIONS["aar_test_00001.jpg"]])
    server = eval_server(handler)
    captions_file = tmp_path / "captions.jsonl"  # DeCapBench's caption format
    captions_file.write_text(
        "".join(json.dumps({"image_path": k, "caption": c}) + "\n" for k, c in CAPTIONS.items())
    )
    captions = read_caption_sets([captions_file])["decapbench"]
    captions.captions["blank.jpg"] = "   "
    handler.facts["   "] = []
    items.append(type(items[0])("blank.jpg", "ref", ("a fact",)))
    cfg = judge_config(server.base_url, cache_path=tmp_path / "cache.sqlite")
    result = run_dcscore(
        JudgeCaller(cfg), items, captions, tmp_path / "out", DCScoreSection(images=images), prompts=prompts
    )

    assert result.score == pytest.approx(100 * DC1, rel=1e-6)  # 60.61: only the valid caption counts
    assert result.metrics["recall"] == pytest.approx(50.0) and result.metrics["f1_relevant"] == pytest.approx(
        600 / 11, rel=1e-6
    )
    assert result.metrics["invalid"] == {
        "aar_test_00003.jpg": "no relevant fact",
        "blank.jpg": "no fact",
    }
    assert result.n_scored == 1 and result.metrics["n_invalid"] == 2 and result.complete
    # extraction: caption 1 twice (the first answer unusable: tried again), caption 2 and the blank
    # caption five times (no (relevant) fact in any try); 3 + 3 samples for caption 1's second try
    assert handler.calls == {"extract": 2 + 5 + 5, "match": 3, "verify": 3}
    assert result.settings["prompts"]["kind"] == "official" and result.settings["images_sent"] == "official"
    # this server answers one choice whatever n asks: the other samples went one by one, and it says so
    assert result.settings["samples_sent"] == "each" and result.settings["sample_requests"] == "one"
    rows = {r["key"]: r for r in map(json.loads, (tmp_path / "out" / "items.jsonl").read_text().splitlines())}
    assert (
        rows["aar_test_00001.jpg"]["n_oracle_facts"] == 3
        and rows["aar_test_00001.jpg"]["extraction_attempts"] == 2
    )
    assert len(rows["aar_test_00001.jpg"]["trials"]) == 9
    # the verification image: full size (the judge config would cut it to 1024), JPEG, detail high
    verify = next(c for c in handler.seen if c.text.startswith("PLACEHOLDER-VERIFY"))
    image = Image.open(io.BytesIO(verify.images[0]))
    assert image.format == "JPEG" and image.size == (1500, 40)
    assert verify.messages[1]["content"][0]["image_url"]["detail"] == "high"
    assert verify.temperature == 0.3 and verify.max_tokens == 2000
    assert "%% PLACEHOLDER reference:\nA red door.\nIt is on the left. \n%% PLACEHOLDER facts:" in verify.text
    assert not next(c for c in handler.seen if c.text.startswith("PLACEHOLDER-MATCH")).images  # text only

    # A re-run is free (every sample, the unusable one included, is cached) and scores the same.
    handler.calls.clear()
    again = run_dcscore(
        JudgeCaller(cfg), items, captions, tmp_path / "out2", DCScoreSection(images=images), prompts=prompts
    )
    assert handler.calls == {} and again.score == result.score

    # our stricter rule: invalid captions score 0 and stay in the mean: (20/33 + 0 + 0) / 3 = 20.20
    strict = run_dcscore(JudgeCaller(cfg), items, captions, tmp_path / "out3",
                         DCScoreSection(images=images, degenerate_captions="zero"), prompts=prompts)  # fmt: skip
    assert strict.score == pytest.approx(100 * DC1 / 3, rel=1e-6) and strict.n_scored == 3


def test_eight_captions_two_invalid_by_hand():
    """The issue's shape: 8 captions, 2 of them degenerate. Official: the mean of the 6 valid ones;
    before (0 kept in the mean): the sum over 8."""
    # six valid captions, one trial each: verified & matched facts against n oracle facts
    valid = [
        score_trial([True], [0], [True], 4),  # P 1, R 1/4, F1 0.4 (both)           -> 0.4
        score_trial([True, True], [0, None], [True, True], 4),  # P 1, R 2/5, F1 4/7 -> 4/7
        score_trial([True, False], [0, 1], [True, False], 2),  # P 1/2, R 1/2, F1 1/2; rel P 1, R 1/2, F1 2/3
        score_trial([True], [None], [False], 3),  # nothing verified: all 0 (valid: 0/1 is defined) -> 0
        score_trial([True, True], [0, 0], [True, True], 2),  # P 1, R (1/2 + 1/2)/2 = 1/2, F1 2/3 -> 2/3
        score_trial([True], [None], [True], 1),  # P 1, R 1/2, F1 2/3 -> 2/3
    ]
    per_caption = [(t.f1 + t.f1_relevant) / 2 for t in valid]
    assert per_caption == pytest.approx([0.4, 4 / 7, (0.5 + 2 / 3) / 2, 0.0, 2 / 3, 2 / 3], abs=1e-7)
    official = 100 * sum(per_caption) / 6
    before = 100 * sum(per_caption) / 8
    assert official == pytest.approx(100 * (0.4 + 4 / 7 + 7 / 12 + 0 + 4 / 3) / 6, abs=1e-5)  # 48.15
    assert before == pytest.approx(official * 6 / 8)  # 36.11


def test_official_trial_arithmetic_keys():
    # The official mapping compares ids as given: 0 and "0" are two oracle facts (k = 1 each).
    t = score_trial([True, False, True], [0, "0", None], [True, True, True], 3)
    # all: P 1; R (1 + 1 + 1) / (3 + 1) = 0.75; relevant {0, 2}: R (1 + 1) / 4 = 0.5
    assert (t.precision, t.recall, t.recall_relevant) == (1.0, 0.75, 0.5)
    # the official list layout and parser
    assert fact_list_json([{"id": 0, "fact": " "}]) == '```json[\n  {"id": 0, "fact": " "},\n]\n```'
    assert parse_fenced_json("x ```json\n[{'fact': 'a', 'relevance': 1}]\n``` y") == [
        {"fact": "a", "relevance": 1}
    ]
    assert parse_fenced_json('```json\n[{"fact": "a", "matched_oracle_id": null}]```') == [
        {"fact": "a", "matched_oracle_id": None}
    ]
    assert parse_fenced_json('[{"fact":\n "a"}]') == [{"fact": "a"}]  # no fence, a newline inside
    with pytest.raises(ValueError):
        parse_fenced_json("no list here")
    # an extraction item the later prompts could not carry as JSON (a Python set) is an unusable answer
    from balcaprl.evaluate.dcscore import _objects

    with pytest.raises(ValueError, match="not plain JSON data"):
        _objects(
            parse_fenced_json("```json\n[{'fact': 'a', 'relevance': 1, 'ids': {1, 2}}]\n```"), ("fact",), "x"
        )


# ----------------------------------------------------------------------------------------- CaptionQA

# Three 3-choice questions on one image (not yes/no: the cannot-answer option is added).
QA_ROWS = [
    {"id": "nat_010", "domain": "natural", "questions": [
        {"question": f"Which colour is thing {i}?", "choices": ["Red", "Green", "Blue"], "answer": "Red",
         "category": ["Attribute"]} for i in range(3)]},
    {"id": "nat_011", "domain": "natural", "questions": [
        {"question": "What shape?", "choices": ["Round", "Square"], "answer": "Round", "category": ["Shape"]}]},
]  # fmt: skip


def _qa_file(tmp_path, rows):
    path = tmp_path / "captionqa.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_captionqa_empty_answers_and_rounding_by_hand(tmp_path, eval_server):
    entries = read_captionqa(_qa_file(tmp_path, QA_ROWS))
    answers = {
        ("CAP", "Which colour is thing 0?"): "Cannot answer from the caption",  # 1/3 + 0.05 = 0.383333...
        ("CAP", "Which colour is thing 1?"): "Red",  # 1
        ("CAP", "Which colour is thing 2?"): "Cannot answer from the caption",  # 0.383333...
        ("CAP2", "What shape?"): "raw:",  # an empty answer
    }
    server = eval_server(ProtocolJudge(answers=answers))
    captions = read_caption_sets([_json(tmp_path / "c.json", {"nat_010": "CAP", "nat_011": "CAP2"})])[None]

    def run(**options):
        caller = JudgeCaller(judge_config(server.base_url))
        return run_captionqa(caller, entries, captions, tmp_path / "out", CaptionQASection(**options))

    # qa.py: each score rounded to 4 decimals: 0.3833 + 1 + 0.3833 + 0 (the empty answer, counted)
    official = run()
    assert official.score == pytest.approx(100 * (0.3833 + 1 + 0.3833 + 0) / 4, abs=1e-9)  # 44.165
    assert official.metrics["empty_answers"] == 1 and official.n_scored == 4 and not official.failures
    # lmms-eval: unrounded, the mean rounded: (0.383333 + 1 + 0.383333 + 0) / 4 = 0.441666 -> 0.4417
    lmms = run(rounding="mean")
    assert lmms.score == pytest.approx(44.17, abs=1e-9)
    # before (our old rule, now an option): the empty answer left out as a failure -> the mean of 3
    strict = run(empty_answer="failure")
    assert strict.failures == {"invalid_json": 1} and strict.n_scored == 3
    assert strict.score == pytest.approx(100 * (0.3833 + 1 + 0.3833) / 3, abs=1e-9)  # 58.89


def test_captionqa_shuffle_over_captioned_questions_by_hand(tmp_path, eval_server):
    entries = read_captionqa(
        _qa_file(tmp_path, CAPTIONQA_ROWS)
    )  # nat_001 (2 usable), nat_002 (2), doc_001 (1)
    only_nat_002 = {"nat_002"}
    captioned = prepare_questions(entries, 0, only=lambda i: i in only_nat_002)
    everything = prepare_questions(entries, 0)

    def draws(sizes):  # the official definition: one random.Random(0), one shuffle per question in order
        rng, out = random.Random(0), []
        for n in sizes:
            perm = list(range(n))
            rng.shuffle(perm)
            out.append(tuple(perm))
        return out

    # qa.py: only nat_002's questions draw (sizes 3 and 5, cannot-answer added); lmms-eval: all five
    assert [q.permutation for q in captioned] == draws([3, 5])
    assert [q.permutation for q in everything] == draws([4, 2, 3, 5, 3])
    assert [q.permutation for q in everything][2:4] != [q.permutation for q in captioned]

    # the same answer letter scores differently under the two rules (a judge that always says "A")
    server = eval_server(lambda call: "A")
    captions = read_caption_sets([_json(tmp_path / "c.json", {"nat_002": "a car by a tree"})])[None]
    # random.Random(0) draws (3) -> [0, 2, 1] then (5) -> [4, 1, 3, 2, 0]; over all five questions the
    # nat_002 questions get the 3rd and 4th draws, [0, 1, 2] and [0, 4, 1, 2, 3]. "A" is the option shown
    # first: captioned -> "By a tree" (right: 1) and "Cannot answer" (1/4 + 0.05 = 0.3): 100 x 1.3 / 2 = 65;
    # all -> "By a tree" (1) and "Ford" (wrong: 0): 100 x 1 / 2 = 50.
    assert draws([3, 5]) == [(0, 2, 1), (4, 1, 3, 2, 0)] and draws([4, 2, 3, 5, 3])[2:4] == [
        (0, 1, 2),
        (0, 4, 1, 2, 3),
    ]
    for rule, first, score in (("captioned", ["By a tree", "Cannot answer from the caption"], 65.0),
                               ("all", ["By a tree", "Ford"], 50.0)):  # fmt: skip
        settings = CaptionQASection(shuffle_over=rule)
        result = run_captionqa(
            JudgeCaller(judge_config(server.base_url)), entries, captions, tmp_path / rule, settings
        )
        rows = [json.loads(line) for line in (tmp_path / rule / "items.jsonl").read_text().splitlines()]
        assert [r["options_shown"][0] for r in rows] == first
        assert result.score == pytest.approx(score)


def test_captionqa_with_lmms_eval_task(tmp_path, eval_server):
    task = load_captionqa_task(str(fake_lmms_eval(tmp_path / "lmms-eval")))
    entries = read_captionqa(_qa_file(tmp_path, QA_ROWS[1:]))  # "What shape?": Round / Square

    seen = []

    def handler(call):
        seen.append(call)
        assert call.system == "PLACEHOLDER-QA system message"
        shown = re.findall(r"\(([A-Z])\) (.*)", call.text)
        return "The answer is (" + next(letter for letter, text in shown if text == "Round") + ")"

    server = eval_server(handler)
    captions = read_caption_sets([_json(tmp_path / "c.json", {"nat_011": "A round <b>thing</b>."})])[None]
    result = run_captionqa(
        JudgeCaller(judge_config(server.base_url)), entries, captions, tmp_path / "out", prompts=task
    )
    assert result.score == 100.0 and result.settings["prompts"]["kind"] == "official"
    text = seen[0].text  # their layout, the caption as it is, their cannot-answer option
    assert text.startswith("PLACEHOLDER-QA caption:\nA round <b>thing</b>.\nPLACEHOLDER question")
    assert "PLACEHOLDER none of these" in text and seen[0].max_tokens == 4


def test_captionqa_multi_image_entries_are_captioned_from_all_images(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "q.parquet"  # the hub's row format: `images` is a list of {bytes, path}
    rows = [
        {"id": "emb_001", "questions": [], "images": [{"bytes": png((1, 1, 1)), "path": None},
                                                      {"bytes": png((2, 2, 2)), "path": None}]},
        {"id": "nat_001", "questions": [], "images": [{"bytes": png((3, 3, 3)), "path": None}]},
    ]  # fmt: skip
    pq.write_table(pa.Table.from_pylist(rows), path)
    assert [len(e.images) for e in read_captionqa(path)] == [2, 1]

    class Recorder:
        name, model_id = "recorder", "m"

        def __init__(self):
            self.got = []

        def generate(self, images, prompts, settings):
            self.got += [
                (len(i) if isinstance(i, list) else 1, p) for i, p in zip(images, prompts, strict=True)
            ]
            return ["c"] * len(prompts)

    expected = {
        # the authors' caption.py: all images and one line saying how many, the line read from a checkout
        # (here a placeholder one; before: the first image only)
        "captionqa": [(2, "PLACEHOLDER 2 views follow. Describe this image in detail."),
                      (1, "Describe this image in detail.")],
        "lmms-eval": [(2, "Describe this image in detail."), (1, "Describe this image in detail.")],
        "first": [(1, "Describe this image in detail."), (1, "Describe this image in detail.")],
    }  # fmt: skip
    line, source = load_captionqa_multi_image_line(fake_captionqa_repo(tmp_path / "CaptionQA"))
    assert line == "PLACEHOLDER {n} views follow. " and source.file.endswith("caption.py")
    for mode, got in expected.items():
        recorder = Recorder()
        items = collect_items(
            None, benchmark="captionqa", annotations=path, multi_image=mode, multi_image_line=line
        )
        caption_items(items, recorder, tmp_path / mode / "caps.jsonl", benchmark="captionqa")
        assert recorder.got == got, mode
    with pytest.raises(InputError, match="--official-captionqa-repo"):
        collect_items(None, benchmark="captionqa", annotations=path, multi_image="captionqa")
    with pytest.raises(ConfigError, match="found 0"):  # not CaptionQA's script
        load_captionqa_multi_image_line(fake_captionqa_repo(tmp_path / "other", "x = 1\n"))


def test_captionqa_refused_rows(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text('{"id": "a", "questions": []}\n{"questions": []}\n[1]\n{"id": "b", "questions": "x"}\n')
    entries = read_captionqa(path)
    assert [e.id for e in entries] == ["a"]
    assert [r.reason for r in entries.refused] == [
        "no 'id'",
        "expected a JSON object",
        "b: 'questions' must be a list",
    ]


# ----------------------------------------------------------------------------------------- CapArena


@pytest.mark.parametrize(
    ("answer", "judgment"),
    [
        ("Reason: sharper.\nJudgment: Caption 1 is better.", "Caption 1 is better"),
        ("Reason: close.\n\nJudgment: Tie", "Tie"),
        ("Reason: x\nJudgment: Caption 2 is better\nextra line", "Caption 2 is better"),
        ("Reason: x\nJudgment: **Caption 2 is better**", "unrecognised"),  # the scorer accepts 6 forms only
        ("Reason: x\nJudgment: <Caption 1 is better>", "unrecognised"),
    ],
)
def test_official_judgments_are_read_as_the_script_reads_them(answer, judgment):
    assert read_official_judgment(answer) == judgment


@pytest.mark.parametrize(
    "answer", ["Judgment: Tie", "Reason: fine", "Caption 1 is better", "Reason:\nJudgment: "]
)
def test_answers_without_reason_and_judgment_are_sampled_again(answer):
    with pytest.raises(ValueError):
        read_official_judgment(answer)


def test_caparena_with_official_prompts_by_hand(tmp_path, eval_server):
    annotations, images, data = write_caparena(tmp_path, n_per_baseline=1)  # test_00000..2, one per baseline
    big = Image.new("RGB", (1800, 60), (9, 9, 9))
    buffer = io.BytesIO()
    big.save(buffer, "JPEG", quality=95)
    (images / "test_00000.jpg").write_bytes(buffer.getvalue())
    prompts = load_caparena_prompts(fake_caparena(tmp_path / "CapArena"))
    ours = {"test_00000.jpg": "ours zero", "test_00001.jpg": "ours one", "test_00002.jpg": "ours two"}
    turns: Counter = Counter()
    seen = []

    def handler(call):
        seen.append(call)
        assert call.system.startswith("PLACEHOLDER-ARENA") and call.schema_name is None
        first = _between(call.text, "PLACEHOLDER first:", "second:")
        second = _between(call.text, "second:", "reference:")
        mine = next(k for k, v in ours.items() if v in (first, second))
        turns[mine] += 1
        if mine == "test_00000.jpg":  # a win for ours
            return f"Reason: better.\nJudgment: Caption {1 if first == ours[mine] else 2} is better."
        if mine == "test_00001.jpg":  # first an answer without a Reason (sampled again), then a loss
            if turns[mine] == 1:
                return "Judgment: Tie"
            return f"Reason: worse.\nJudgment: Caption {2 if first == ours[mine] else 1} is better"
        return "Reason: hmm.\nJudgment: **Tie**"  # not an accepted form: counts neither way

    server = eval_server(handler)
    captions = read_caption_sets([_json(tmp_path / "c.json", ours)])[None]
    result = run_caparena(JudgeCaller(judge_config(server.base_url)), read_caparena(annotations), captions,
                          tmp_path / "out", CapArenaSection(images=images), prompts=prompts)  # fmt: skip
    per = result.metrics["per_baseline"]
    # GPT-4o: a win -> (1 - 0) / 2 = 0.5; CogVLM: a loss -> -0.5; MiniCPM: unrecognised -> 0
    assert [per[b]["score"] for b in ("GPT-4o-0806", "CogVLM2-llama3-chat-19B", "MiniCPM-V2.6-8B")] == [
        0.5,
        -0.5,
        0.0,
    ]
    assert per["MiniCPM-V2.6-8B"]["unrecognised"] == 1 and result.metrics["unrecognised_judgments"] == 1
    assert result.score == pytest.approx(0.0) and not result.failures and turns["test_00001.jpg"] == 2
    assert result.metrics["length_words"] == pytest.approx(2.0)  # judged or not, as the scorer counts
    # the image as the official script sends it: its own bytes (no resize, no re-encoding), detail high
    call = next(c for c in seen if "ours zero" in c.text)
    assert call.images[0] == (images / "test_00000.jpg").read_bytes()
    # labelled PNG, as the official script labels every image (this one is a JPEG file)
    assert call.messages[1]["content"][0]["image_url"]["url"].startswith("data:image/png;base64,")
    assert call.messages[1]["content"][0]["image_url"]["detail"] == "high"
    assert call.temperature == 0.1 and call.body["top_p"] == 0.9 and call.max_tokens == 1500
    assert result.settings["images_sent"] == "official" and result.settings["prompts"]["kind"] == "official"
    # with our prompts the judge config's size applies and no detail is sent (unless asked for)
    paraphrase = run_caparena(JudgeCaller(judge_config(server.base_url)), [], captions, tmp_path / "p",
                              CapArenaSection(images=images))  # fmt: skip
    assert (
        paraphrase.settings["images_sent"] == "judge"
        and paraphrase.settings["prompts"]["kind"] == "paraphrase"
    )


def test_an_http_error_is_one_of_the_five_tries_as_in_the_official_script(tmp_path, eval_server):
    # The judge answers an HTTP error, then four answers without a verdict, then a win. The official
    # script spends a try on the error (call_llm answers ""), so its five tries end without a verdict:
    # the battle is skipped, 0 for every baseline -> 0.0. Retried in the client instead (ours), the
    # error is no try, the fifth sample is the win: (0.5 + 0 + 0) / 3 = 0.1667.
    annotations, images, _ = write_caparena(tmp_path, n_per_baseline=1)
    prompts = load_caparena_prompts(fake_caparena(tmp_path / "CapArena"))
    ours = {"test_00000.jpg": "ours zero"}
    calls: Counter = Counter()

    def handler(call):
        calls["n"] += 1
        if calls["n"] == 1:
            return JudgeFailure("server_error", "scripted")
        if calls["n"] <= 5:
            return "Judgment pending."  # no Reason/Judgment: another try
        first = _between(call.text, "PLACEHOLDER first:", "second:")
        return f"Reason: better.\nJudgment: Caption {1 if first == ours['test_00000.jpg'] else 2} is better."

    server = eval_server(handler)
    captions = read_caption_sets([_json(tmp_path / "c.json", ours)])[None]

    def run(rule, max_retries):
        options = {} if rule == "try" else {"http_errors": rule}
        calls.clear()
        caller = JudgeCaller(judge_config(server.base_url, max_retries=max_retries))
        return run_caparena(caller, read_caparena(annotations), captions, tmp_path / rule,
                            CapArenaSection(images=images, **options), prompts=prompts)  # fmt: skip

    official = run("try", 3)  # the default  # the judge config's retries do not apply: the error is one try
    assert official.score == 0.0 and official.failures == {"schema_violation": 1} and calls["n"] == 5
    ours_rule = run("retry", 3)
    assert ours_rule.score == pytest.approx(0.5 / 3) and not ours_rule.failures and calls["n"] == 6


def test_caparena_refused_entries(tmp_path):
    path = tmp_path / "arena.json"
    path.write_text(json.dumps({
        "a.jpg": {"ref_model": "M", "captions": {"M": "m", "human": "h"}},
        "b.jpg": {"ref_model": "X", "captions": {"M": "m", "human": "h"}},
        "c.jpg": {"ref_model": "M", "captions": {"M": "m"}},
        "d.jpg": "not an entry",
    }))  # fmt: skip
    items = read_caparena(path)
    assert [i.image for i in items] == ["a.jpg"]
    assert [r.reason for r in items.refused] == [
        "'ref_model' must name one of its captions", "no 'human' reference caption",
        "expected {'ref_model': ..., 'captions': {...}}",
    ]  # fmt: skip


def _json(path, value):
    path.write_text(json.dumps(value))
    return path


# ----------------------------------------------------------------------------------------- keyed by text

CANNOT = "Cannot answer from the caption"


def test_cannot_answer_is_read_by_its_text_as_qa_py_does():
    # A 3-choice question (not yes/no) whose own third choice is the cannot-answer text: the option is
    # added again, so two of the four options have that text.
    entry = read_captionqa_rows([{"id": "a", "questions": [
        {"question": "Which colour?", "choices": ["Red", "Green", CANNOT], "answer": "Red"}]}])  # fmt: skip
    (q,) = prepare_questions(entry)
    assert q.options == ("Red", "Green", CANNOT, CANNOT)
    letter = {original: "ABCD"[shown] for shown, original in enumerate(q.permutation)}
    # qa.py: either cannot-answer text scores 1/3 + 0.05 (3 original choices); lmms-eval: only the added one
    assert score_answer(q, letter[2]) == (pytest.approx(1 / 3 + 0.05), "cannot_answer")
    assert score_answer(q, letter[3]) == (pytest.approx(1 / 3 + 0.05), "cannot_answer")
    assert score_answer(q, letter[2], by_text=False) == (0.0, "wrong")
    assert score_answer(q, letter[3], by_text=False) == (pytest.approx(1 / 3 + 0.05), "cannot_answer")
    assert score_answer(q, letter[0]) == score_answer(q, letter[0], by_text=False) == (1.0, "correct")


def test_captionqa_cannot_answer_by_text_over_http(tmp_path, eval_server):
    # A yes/no question gets no added option, but one of its own choices is the cannot-answer text.
    rows = [{"id": "a", "questions": [
        {"question": "Is it red?", "choices": ["Yes", "No", CANNOT], "answer": "Yes", "category": ["c"]}]}]  # fmt: skip
    captions = read_caption_sets([_json(tmp_path / "c.json", {"a": "A thing."})])[None]

    def handler(call):  # always the cannot-answer choice
        return next(line[0] for line in call.text.split("\n") if line.endswith(". " + CANNOT))

    server = eval_server(handler)

    def score(**options):
        caller = JudgeCaller(judge_config(server.base_url))
        out = tmp_path / "-".join(f"{k}{v}" for k, v in options.items())
        return run_captionqa(caller, read_captionqa(_qa_file(tmp_path, rows)), captions, out,
                             CaptionQASection(**options)).score  # fmt: skip

    assert score() == pytest.approx(38.33)  # qa.py: round(1/3 + 0.05, 4) = 0.3833
    assert score(cannot_answer="position") == 0.0  # lmms-eval: no option was added, so a wrong answer


# qa.py and lmms-eval's task both skip a question with fewer than two choices of its own, before the
# cannot-answer option is added: it is never asked and draws no shuffle. Here the one-choice question
# comes first; the two-choice question after it is the first to draw from random.Random(0).
ONE_CHOICE_ROWS = [{"id": "a", "questions": [
    {"question": "Which animal?", "choices": ["Cat"], "answer": "Cat", "category": ["c"]},
    {"question": "Is it a cat?", "choices": ["Yes"], "answer": "Yes", "category": ["c"]},
    {"question": "Which colour?", "choices": ["Red", "Blue"], "answer": "Red", "category": ["c"]}]}]  # fmt: skip


def test_a_one_choice_question_is_skipped_as_both_official_scorers_skip_it(tmp_path, eval_server):
    entries = read_captionqa_rows(ONE_CHOICE_ROWS)
    first = list(range(3))  # the one draw: "Which colour?" with the cannot-answer option, 3 options
    random.Random(0).shuffle(first)
    (q,) = prepare_questions(entries)
    assert (q.index, q.options, q.permutation) == (2, ("Red", "Blue", CANNOT), tuple(first))

    # Over HTTP: only "Which colour?" is asked; the judge answers the letter of "Red" -> 100.
    def handler(call):
        assert "Which animal?" not in call.text
        return next(line[0] for line in call.text.split("\n") if line.endswith(". Red"))

    server = eval_server(handler)
    captions = read_caption_sets([_json(tmp_path / "c.json", {"a": "A red cat."})])[None]
    for rule in ("captioned", "all"):
        result = run_captionqa(JudgeCaller(judge_config(server.base_url)), read_captionqa(
            _qa_file(tmp_path, ONE_CHOICE_ROWS)), captions, tmp_path / rule, CaptionQASection(shuffle_over=rule))  # fmt: skip
        assert result.score == 100.0 and result.n_items == 1 and result.metrics["n_asked"] == 1
        rows = [json.loads(line) for line in (tmp_path / rule / "items.jsonl").read_text().splitlines()]
        assert [r["options_shown"] for r in rows] == [[q.options[i] for i in first]]


def read_captionqa_rows(rows):
    from balcaprl.evaluate.formats import CaptionQAEntry, Question

    return [
        CaptionQAEntry(r["id"], tuple(Question(q["question"], tuple(q["choices"]), q["answer"], "")
                                      for q in r["questions"]))
        for r in rows
    ]  # fmt: skip


# Our prompts, facts keyed by text as the official scorer keys them. Oracle: o0, o1. Extracted:
#   1 "A dog" (relevant) -> o0;   2 "A dog" (not relevant) -> none;   3 "A ball" (relevant) -> o1;
# all verified. By text (official): "A dog" takes the later match (none) and is relevant (one copy is):
#   matches [none, none, o1]: earned 1 + 1 + 1, denominator 2 + 2 unmatched -> R = 3/4, P = 1;
#   relevant: all three facts -> the same. F1 = 2 x 0.75 / 1.75 = 6/7 = 0.857; DCScore 6/7.
# By position (before): matches [o0, none, o1]: R = 3/3 = 1, relevant {1, 3}: R = 2/2 -> DCScore 1.0.
def test_dcscore_with_our_prompts_keys_facts_by_text(tmp_path, eval_server):
    images = tmp_path / "images"
    images.mkdir()
    (images / "img.png").write_bytes(png((1, 2, 3)))
    annotations = tmp_path / "oracle.jsonl"
    annotations.write_text(
        json.dumps({"image_name": "img.png", "oracle_caption": "r", "oracle_facts": ["o0", "o1"]})
    )
    facts = [("A dog", "dog", True), ("A dog", "dog", False), ("A ball", "ball", True)]

    def handler(call):
        if call.kind == "dcscore_extract":
            return {"facts": [{"fact": f, "identifier": i, "relevance": r} for f, i, r in facts]}
        if call.kind == "dcscore_match":
            return {
                "matches": [
                    {"id": 1, "oracle_id": 1},
                    {"id": 2, "oracle_id": None},
                    {"id": 3, "oracle_id": 2},
                ]
            }
        return {"verdicts": [{"id": i, "correct": True} for i in (1, 2, 3)]}

    server = eval_server(handler)
    captions = read_caption_sets([_json(tmp_path / "c.json", {"img.png": "A dog and a ball."})])[None]
    result = run_dcscore(JudgeCaller(judge_config(server.base_url)), read_decapbench(annotations), captions,
                         tmp_path / "out", DCScoreSection(images=images, n_match=1, n_verify=1))  # fmt: skip
    f1 = 2 * 0.75 / (1.75 + 1e-8)
    assert result.metrics["recall"] == pytest.approx(75.0) and result.metrics[
        "recall_relevant"
    ] == pytest.approx(75.0)
    assert result.score == pytest.approx(100 * f1)  # 85.71 (by position it was 100.0)
    # the same answers through the official arithmetic by position would differ:
    by_position = score_trial([True, False, True], [0, None, 1], [True, True, True], 2)
    assert (by_position.recall, by_position.recall_relevant) == (1.0, 1.0)


# ----------------------------------------------------------------------------------------- DCScore's tries


# The official script tries a whole caption again (a new extraction, matching and verification) when
# any answer is unusable, up to 5 tries. Oracle: ORACLE (3 facts). Try 1 extracts "A red door" only;
# its first verification answer is unreadable. Try 2 extracts "A red door" (-> oracle 0) and "A black
# cat sits on the step" (unmatched); all verified.
#   official (try 2): P = 1; R = (1 + 1) / (3 + 1) = 0.5; F1 = 2 x 0.5 / 1.5 = 2/3 (relevant: the same)
#   -> DCScore 66.67.  Redrawing only the bad sample (before) keeps try 1's facts: R = 1/3, F1 = 0.5 -> 50.
def test_dcscore_retries_the_whole_caption_as_the_official_script(tmp_path, eval_server):
    annotations, images = write_decap(tmp_path)
    prompts = load_decapbench_prompts(fake_decapbench(tmp_path / "DeCapBench"))
    tries = [
        [("A red door", "door_0", 1)],
        [("A red door", "door_0", 1), ("A black cat sits on the step", "cat_0", 1)],
    ]
    judge = OfficialDCScoreJudge({}, MATCHES, VERIFIED)
    verify_calls = Counter()

    def handler(call):
        if call.text.startswith("PLACEHOLDER-EXTRACT"):
            judge.facts[_between(call.text, "%% PLACEHOLDER caption:", "%% PLACEHOLDER list:")] = tries[
                judge.calls["extract"]
            ]
        if call.text.startswith("PLACEHOLDER-VERIFY"):
            verify_calls["n"] += 1
            if verify_calls["n"] == 1:
                return "I cannot tell."
        return judge(call)

    server = eval_server(handler)
    captions = read_caption_sets([_json(tmp_path / "c.json", {"aar_test_00001.jpg": "A red door; a cat."})])[
        None
    ]
    result = run_dcscore(JudgeCaller(judge_config(server.base_url)), read_decapbench(annotations), captions,
                         tmp_path / "out", DCScoreSection(images=images), prompts=prompts)  # fmt: skip
    assert result.score == pytest.approx(200 / 3, rel=1e-6) and judge.calls["extract"] == 2
    assert judge.calls["match"] == 3 + 3 and verify_calls["n"] == 3 + 3  # every sample of both tries


def test_the_official_parser_alone_reads_an_answer():
    listed = [{"fact": "A", "matched_oracle_id": None}]
    fenced = "```json\n" + json.dumps(listed) + "\n```"
    assert parse_fenced_json(fenced) == listed  # the JSON read of the rest (its third try)
    assert parse_fenced_json("```json\n[{'fact': 'A', 'verification': 1}]\n```\nDone.") == [
        {"fact": "A", "verification": 1}
    ]  # the block's body as a Python literal (its first try)
    # a JSON block followed by text: the body is never read as JSON officially, and the rest with its
    # trailing words is neither a literal nor JSON -> unreadable (the caption is tried again)
    with pytest.raises(ValueError):
        parse_fenced_json(fenced + "\nDone.")


def test_dcscore_sends_the_stored_pixels_as_the_official_script(tmp_path, eval_server):
    # A JPEG stored 60 x 20 with EXIF orientation 6 (shown turned a quarter, 20 x 60): the official
    # script never reads EXIF (Image.open(...).convert("RGB")), so the judge gets the 60 x 20 pixels.
    annotations, images = write_decap(tmp_path)
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.new("RGB", (60, 20), (10, 200, 10)).save(images / "aar_test_00001.jpg", "JPEG", exif=exif)
    prompts = load_decapbench_prompts(fake_decapbench(tmp_path / "DeCapBench"))
    handler = OfficialDCScoreJudge(FACTS, MATCHES, VERIFIED)
    server = eval_server(handler)
    captions = read_caption_sets(
        [_json(tmp_path / "c.json", {"aar_test_00001.jpg": CAPTIONS["aar_test_00001.jpg"]})]
    )[None]
    run_dcscore(JudgeCaller(judge_config(server.base_url)), read_decapbench(annotations), captions,
                tmp_path / "out", DCScoreSection(images=images), prompts=prompts)  # fmt: skip
    verify = next(c for c in handler.seen if c.text.startswith("PLACEHOLDER-VERIFY"))
    assert Image.open(io.BytesIO(verify.images[0])).size == (60, 20)
