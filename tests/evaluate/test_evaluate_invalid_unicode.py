"""A text that is no valid Unicode (a lone surrogate, which a JSON escape can put into valid UTF-8) is a
row-level ``bad_input`` in every protocol, as in ``balcaprl score``: the row names what and where, no
judge call is made for it, and the other rows are scored. Cleaning it (U+FFFD for the surrogate) would
have the judge score a text nobody wrote. Real HTTP against the loopback judge server. (The official
prompts without the guard send such a text JSON-escaped, as the official code does:
tests/evaluate/test_official_requests.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from evaluate_testkit import (
    CAPTIONQA_ROWS,
    DECAP_ORACLE,
    ProtocolJudge,
    judge_config,
    write_caparena,
    write_decapbench,
)

from balcaprl.evaluate.bcapscore import run_bcapscore
from balcaprl.evaluate.caparena import CapArenaSection, run_caparena
from balcaprl.evaluate.captionqa import run_captionqa
from balcaprl.evaluate.dcscore import DCScoreSection, run_dcscore
from balcaprl.evaluate.formats import read_caparena, read_caption_sets, read_captionqa, read_decapbench
from balcaprl.judge import JudgeCaller, build_judge

BAD = "\ud800"  # a lone surrogate: json.dumps writes it as the escape "\ud800"


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def sent_texts(handler: ProtocolJudge) -> str:
    return "\n".join(call.text for call in handler.seen)


def captions_of(tmp_path: Path, captions: dict[str, str]):
    path = tmp_path / "captions.json"
    path.write_text(json.dumps(captions))  # the surrogate written as its JSON escape, in valid UTF-8
    return read_caption_sets([path])[None]


# ----------------------------------------------------------------------------------------- DCScore

FACTS = [("There is a red door", "door_0", True)]


@pytest.mark.parametrize(
    "where, detail",
    [
        ("caption", "the caption of image 'iiw_002.jpg' is not valid Unicode: a lone surrogate U+D800 at character 8"),
        ("oracle_caption", "the reference of image 'iiw_002.jpg' is not valid Unicode: a lone surrogate U+D800 at character 8"),
        ("oracle_facts", "the oracle fact 2 of image 'iiw_002.jpg' is not valid Unicode: a lone surrogate U+D800 at character 9"),
    ],
)  # fmt: skip
def test_dcscore_refuses_the_row_and_scores_the_others(tmp_path, eval_server, where, detail):
    annotations, images = write_decapbench(tmp_path)
    captions = {"iiw_001.jpg": "A red door.", "iiw_002.jpg": "A blue car."}
    if where == "caption":
        captions["iiw_002.jpg"] = f"A blue {BAD}car."
    else:
        entry = dict(DECAP_ORACLE["iiw_002.jpg"])
        entry["oracle_caption"] = f"A blue {BAD}car is parked by a tree."
        entry["oracle_facts"] = ["There is a blue car.", f"The car {BAD}is parked by a tree."]
        if where == "oracle_caption":
            entry["oracle_facts"] = DECAP_ORACLE["iiw_002.jpg"]["oracle_facts"]
        else:
            entry["oracle_caption"] = DECAP_ORACLE["iiw_002.jpg"]["oracle_caption"]
        lines = annotations.read_text().splitlines()
        lines[1] = json.dumps({"image_name": "iiw_002.jpg", **entry})
        annotations.write_text("\n".join(lines) + "\n")
    handler = ProtocolJudge(facts={"A red door.": FACTS, "A blue car.": FACTS})
    server = eval_server(handler)
    result = run_dcscore(
        JudgeCaller(judge_config(server.base_url), image_root=images), read_decapbench(annotations),
        captions_of(tmp_path, captions), tmp_path / "out", DCScoreSection(images=images, n_match=1, n_verify=1),
    )  # fmt: skip
    assert result.failures == {"bad_input": 1} and result.n_scored == 1 and not result.complete
    first, second = rows(tmp_path / "out" / "items.jsonl")
    assert first["failure"] is None and first["valid"] and first["n_facts"] == 1
    assert second["failure"] == "bad_input" and second["detail"] == detail
    assert second["extraction_attempts"] == 0  # refused before the first call
    # only the first image's three calls were made: nothing of the refused row, cleaned or not
    assert handler.calls == {"dcscore_extract": 1, "dcscore_match": 1, "dcscore_verify": 1}
    assert "blue" not in sent_texts(handler) and "\ufffd" not in sent_texts(handler)


# ----------------------------------------------------------------------------------------- CaptionQA


def write_questions(tmp_path: Path, question: str | None = None, choice: str | None = None) -> Path:
    """CAPTIONQA_ROWS as JSONL (parquet cannot hold a lone surrogate); nat_002's first question, or
    a choice of its second, replaced."""
    data = json.loads(json.dumps(CAPTIONQA_ROWS))
    if question is not None:
        data[1]["questions"][0]["question"] = question
    if choice is not None:
        data[1]["questions"][1]["choices"][0] = choice
    path = tmp_path / "captionqa.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in data))
    return path


ANSWERS = {
    ("CAP1", "What colour is the door?"): "Red",
    ("CAP1", "Is there a cat?"): "Yes",
    ("CAP2", "Where is the car parked?"): "By a tree",
    ("CAP2", "What brand is the car?"): "Kia",
}


def test_captionqa_refuses_every_question_of_a_caption_and_answers_the_others(tmp_path, eval_server):
    handler = ProtocolJudge(answers=ANSWERS)
    server = eval_server(handler)
    captions = captions_of(tmp_path, {"nat_001": "CAP1", "nat_002": f"CAP2 {BAD}"})
    result = run_captionqa(JudgeCaller(judge_config(server.base_url)), read_captionqa(write_questions(tmp_path)),
                           captions, tmp_path / "out")  # fmt: skip
    assert result.failures == {"bad_input": 2} and result.n_scored == 2 and result.score == 100.0
    items = rows(tmp_path / "out" / "items.jsonl")
    assert [r["failure"] for r in items] == [None, None, "bad_input", "bad_input"]
    assert {r["detail"] for r in items[2:]} == {
        "the caption of image 'nat_002' is not valid Unicode: a lone surrogate U+D800 at character 6"
    }
    assert handler.calls == {"captionqa_answer": 2} and "CAP2" not in sent_texts(handler)


def test_captionqa_refuses_a_question_or_an_option_alone(tmp_path, eval_server):
    handler = ProtocolJudge(answers=ANSWERS)
    server = eval_server(handler)
    captions = captions_of(tmp_path, {"nat_001": "CAP1", "nat_002": "CAP2"})
    entries = read_captionqa(write_questions(tmp_path, question=f"Where is the car{BAD} parked?"))
    result = run_captionqa(JudgeCaller(judge_config(server.base_url)), entries, captions, tmp_path / "q")
    assert result.failures == {"bad_input": 1} and result.n_scored == 3
    refused = [r for r in rows(tmp_path / "q" / "items.jsonl") if r["failure"]]
    assert [(r["id"], r["question_index"]) for r in refused] == [("nat_002", 0)]
    assert refused[0]["detail"] == (
        "the question of image 'nat_002' is not valid Unicode: a lone surrogate U+D800 at character 17"
    )
    assert handler.calls == {"captionqa_answer": 3} and "Where is the car" not in sent_texts(handler)

    handler.calls.clear()
    handler.seen.clear()
    entries = read_captionqa(write_questions(tmp_path, choice=f"Fo{BAD}rd"))
    result = run_captionqa(JudgeCaller(judge_config(server.base_url)), entries, captions, tmp_path / "o")
    (refused,) = [r for r in rows(tmp_path / "o" / "items.jsonl") if r["failure"]]
    letter = "ABCDE"[refused["options_shown"].index(f"Fo{BAD}rd")]  # where the shuffle put it
    assert (refused["id"], refused["question_index"], refused["failure"]) == ("nat_002", 1, "bad_input")
    assert refused["detail"] == (
        f"the option {letter} of image 'nat_002' is not valid Unicode: a lone surrogate U+D800 at character 3"
    )
    assert handler.calls == {"captionqa_answer": 3} and "What brand" not in sent_texts(handler)


# ----------------------------------------------------------------------------------------- CapArena


@pytest.mark.parametrize("where", ["caption", "baseline caption", "human reference"])
def test_caparena_refuses_the_battle_and_judges_the_others(tmp_path, eval_server, where):
    annotations, images, data = write_caparena(tmp_path, n_per_baseline=1)
    names = list(data)
    bad = names[1]
    captions = {name: f"our caption of {name}" for name in names}
    entry = data[bad]
    if where == "caption":
        captions[bad] = f"our caption {BAD}of {bad}"
    elif where == "baseline caption":
        entry["captions"][entry["ref_model"]] = f"baseline {BAD}caption"
    else:
        entry["captions"]["human"] = f"human {BAD}reference"
    annotations.write_text(json.dumps(data))
    handler = ProtocolJudge()
    server = eval_server(handler)
    result = run_caparena(JudgeCaller(judge_config(server.base_url)), read_caparena(annotations),
                          captions_of(tmp_path, captions), tmp_path / "out", CapArenaSection(images=images))  # fmt: skip
    at = {"caption": 13, "baseline caption": 10, "human reference": 7}[where]
    assert result.failures == {"bad_input": 1} and result.n_scored == len(names) - 1
    (refused,) = [r for r in rows(tmp_path / "out" / "items.jsonl") if r["failure"]]
    assert refused["image"] == bad and refused["judgment"] is None
    assert (
        refused["detail"]
        == f"the {where} of image {bad!r} is not valid Unicode: a lone surrogate U+D800 at character {at}"
    )
    assert handler.calls == {"caparena_compare": len(names) - 1} and bad not in sent_texts(handler)


# ----------------------------------------------------------------------------------------- b-CapScore


@pytest.mark.parametrize("where", ["caption", "reference"])
def test_bcapscore_refuses_the_row_as_score_does(tmp_path, eval_server, where):
    annotations, images = write_decapbench(tmp_path)
    captions = {"iiw_001.jpg": "A red door on the left.", "iiw_002.jpg": "A blue car by a tree."}
    if where == "caption":
        captions["iiw_002.jpg"] = f"A blue {BAD}car by a tree."
    else:
        lines = annotations.read_text().splitlines()
        row = json.loads(lines[1])
        row["oracle_caption"] = f"A blue {BAD}car is parked by a tree."
        lines[1] = json.dumps(row)
        annotations.write_text("\n".join(lines) + "\n")
    server = eval_server()
    judge = build_judge(judge_config(server.base_url), image_root=images)
    result = run_bcapscore(
        judge, read_decapbench(annotations), captions_of(tmp_path, captions), tmp_path / "out"
    )
    assert result.failures == {"bad_input": 1} and result.n_scored == 1
    scored = rows(tmp_path / "out" / "scores.jsonl")
    assert [r["failure"] for r in scored] == [None, "bad_input"]
    assert scored[1]["detail"] == (
        f"the {where} of this row is not valid Unicode: a lone surrogate U+D800 at character 8"
    )
    assert not any("blue" in text for text in server.counters.by_text)  # never sent, cleaned or not


# ----------------------------------------------------------------------------------------- the command


def test_evaluate_refuses_the_row_in_every_protocol_and_scores_the_rest(tmp_path, eval_server):
    from evaluate_testkit import write_judge_yaml
    from typer.testing import CliRunner

    from balcaprl.cli import app
    from balcaprl.data.format import read_split_rows
    from balcaprl.synthetic.build import build_dataset
    from balcaprl.synthetic.oracle import OracleJudge
    from balcaprl.testing.oracle_protocols import OracleProtocols, write_synthetic_benchmarks

    dataset = build_dataset(tmp_path / "ds", n_train=1, n_eval=3, seed=7)
    bench = write_synthetic_benchmarks(dataset, tmp_path)
    oracle = OracleJudge.from_dataset(dataset)
    handler = OracleProtocols.from_dataset(oracle, dataset)
    server = eval_server(handler, judge=oracle)
    captions = {r["image"]: r["reference"] for r in read_split_rows(dataset, "eval")}
    bad = sorted(captions)[1]
    captions[bad] = captions[bad].replace(" ", f" {BAD}", 1)
    args = ["evaluate", "--captions", str(captions_of(tmp_path, captions).sources[0]), "--out", str(tmp_path / "out"),
            "--judge", str(write_judge_yaml(tmp_path / "judge.yaml", server.base_url)), "--no-progress",
            "--decapbench", bench["decapbench"], "--decapbench-images", dataset, "--captionqa", bench["captionqa"],
            "--caparena", bench["caparena"], "--caparena-images", dataset]  # fmt: skip
    result = CliRunner(env={"COLUMNS": "60"}).invoke(app, [str(a) for a in args])
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output  # incomplete, no crash
    assert "fix the bad inputs" in " ".join(result.output.split()), result.output
    detail = f"not valid Unicode: a lone surrogate U+D800 at character {captions[bad].index(BAD) + 1}"
    for protocol, file, key in [("bcapscore", "scores.jsonl", "image"), ("dcscore", "items.jsonl", "key"),
                                ("captionqa", "items.jsonl", "id"), ("caparena", "items.jsonl", "image")]:  # fmt: skip
        items = rows(tmp_path / "out" / protocol / file)
        refused = [r for r in items if r["failure"] == "bad_input"]
        assert {r[key] for r in refused} == {bad} and all(r["detail"].endswith(detail) for r in refused), (
            protocol
        )
        assert any(r["failure"] is None for r in items), protocol  # the others are scored
    assert not any("\ufffd" in text for text in server.counters.by_text)  # never sent cleaned
