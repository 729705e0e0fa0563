"""`balcaprl synthetic build` output, and the OracleJudge finding scenes from the images it is sent."""

from __future__ import annotations

import asyncio
import io
import json

import pytest
from PIL import Image

from balcaprl.data.format import COLUMNS, load_split, read_card, read_split_rows
from balcaprl.judge import Judge, JudgeFailure, Judgement, JudgeRequest
from balcaprl.rewards import parse_verdict, score_verdict
from balcaprl.synthetic.lexicon import PROMPT, words_of
from balcaprl.synthetic.oracle import SCENES_FILE, OracleJudge
from balcaprl.synthetic.render import render_scene
from balcaprl.synthetic.scenes import Scene, generate_scenes


def test_build_writes_the_pinned_format(tiny_dataset):
    card = read_card(tiny_dataset)
    assert card["counts"] == {"train": 16, "eval": 4}
    assert card["tokenizer"] == "balcaprl-synthetic-wordlevel-v1"
    assert card["synthetic"]["scenes_file"] == SCENES_FILE
    rows = read_split_rows(tiny_dataset, "train")
    assert set(COLUMNS) <= set(rows[0])
    for row in rows:
        assert row["prompt"] == PROMPT and row["source"] == "synthetic"
        assert row["reference_tokens"] == len(words_of(row["reference"]))
        assert Image.open(row["image_path"]).size == (224, 224)
    assert len(load_split(tiny_dataset, "eval")) == 4  # loads through `datasets` like real data
    lines = (tiny_dataset / SCENES_FILE).read_text().splitlines()
    assert len(lines) == 20 and {json.loads(line)["split"] for line in lines} == {"train", "eval"}


def test_build_is_deterministic(tiny_dataset, tmp_path):
    from balcaprl.synthetic.build import build_dataset

    again = build_dataset(tmp_path / "again", n_train=16, n_eval=4, seed=3)
    for split in ("train", "eval"):
        assert [r["reference"] for r in read_split_rows(again, split)] == [
            r["reference"] for r in read_split_rows(tiny_dataset, split)
        ]
        assert [r["image_sha256"] for r in read_split_rows(again, split)] == [
            r["image_sha256"] for r in read_split_rows(tiny_dataset, split)
        ]


def test_every_image_hashes_to_its_scene(tiny_dataset):
    oracle = OracleJudge.from_dataset(tiny_dataset)
    scenes = {
        json.loads(line)["id"]: Scene.from_dict(json.loads(line)["scene"])
        for line in (tiny_dataset / SCENES_FILE).read_text().splitlines()
    }
    for split in ("train", "eval"):
        for row in read_split_rows(tiny_dataset, split):
            original = (tiny_dataset / row["image"]).read_bytes()
            image = Image.open(io.BytesIO(original))
            reencoded = io.BytesIO()
            image.save(reencoded, format="PNG", compress_level=9)  # other bytes, same pixels
            assert reencoded.getvalue() != original
            for form in (row["image_path"], original, reencoded.getvalue(), image):
                assert oracle.lookup(form) == scenes[row["id"]]


def test_lossy_copies_fall_back_to_the_thumbnail(tiny_dataset):
    oracle = OracleJudge.from_dataset(tiny_dataset)
    row = read_split_rows(tiny_dataset, "eval")[0]
    image = Image.open(row["image_path"]).convert("RGB")
    jpeg = io.BytesIO()
    image.save(jpeg, format="JPEG", quality=80)
    assert oracle.lookup(jpeg.getvalue()).id == row["id"]
    assert oracle.lookup(image.resize((112, 112))).id == row["id"]
    with pytest.raises(LookupError, match="is no copy"):
        oracle.lookup(render_scene(generate_scenes(1, seed=999)[0]))
    with pytest.raises(LookupError, match="not a decodable"):
        oracle.lookup(b"not an image")


def test_oracle_is_a_judge(tiny_dataset):
    oracle = OracleJudge.from_dataset(tiny_dataset)
    assert isinstance(oracle, Judge)
    rows = read_split_rows(tiny_dataset, "eval")
    requests = [
        JudgeRequest(image=r["image_path"], caption=r["reference"], reference=r["reference"]) for r in rows
    ]
    requests.append(
        JudgeRequest(image=b"\x89PNG broken", caption="a red circle.", reference=rows[0]["reference"])
    )
    requests.append(JudgeRequest(image=rows[0]["image_path"], caption="x", reference="y", rubric="strict"))  # type: ignore[arg-type]
    outcomes = asyncio.run(oracle.judge_batch(requests))
    assert len(outcomes) == len(requests)
    for outcome in outcomes[: len(rows)]:
        assert isinstance(outcome, Judgement)
        assert score_verdict(outcome.verdict).as_tuple() == (1.0, 1.0, 1.0)
        parse_verdict(json.loads(outcome.verdict.model_dump_json()))  # JSON round trip passes the schema
    assert isinstance(outcomes[-2], JudgeFailure) and outcomes[-2].reason == "bad_input"
    assert isinstance(outcomes[-1], JudgeFailure) and "rubric" in outcomes[-1].detail


def test_missing_scenes_file_is_a_clear_error(tiny_dataset, tmp_path):
    (tmp_path / "dataset.json").write_text((tiny_dataset / "dataset.json").read_text())
    with pytest.raises(FileNotFoundError, match="not a synthetic dataset"):
        OracleJudge.from_dataset(tmp_path)


def test_the_synthetic_evaluation_refuses_a_caption_that_is_no_valid_unicode(tiny_dataset):
    """A lone surrogate in a caption is that row's bad_input, named, never judged as cleaned; the
    other rows are scored as before."""
    from balcaprl.data.format import read_split_rows
    from balcaprl.judge.protocol import JudgeFailure
    from balcaprl.synthetic.evaluation import score_captions
    from balcaprl.synthetic.oracle import OracleJudge

    rows = read_split_rows(tiny_dataset, "eval")[:2]
    oracle = OracleJudge.from_dataset(tiny_dataset)
    clean = score_captions(oracle, rows, [rows[0]["reference"], rows[1]["reference"]])
    mixed = score_captions(oracle, rows, ["A red \ud800 circle.", rows[1]["reference"]])
    refused = mixed.outcomes[0]
    assert isinstance(refused, JudgeFailure) and refused.reason == "bad_input"
    assert f"row {rows[0]['id']!r}" in refused.detail and "lone surrogate U+D800" in refused.detail
    assert mixed.outcomes[1] == clean.outcomes[1] and mixed.failures == 1
