"""CapArena-Auto: per-baseline (wins - losses) / 2 and its mean by hand, word counts, seeded positions,
and the protocol over the loopback server on a fixture in caparena_auto_600.json's format."""

from __future__ import annotations

import json

import pytest
from evaluate_testkit import CAPARENA_BASELINES, ProtocolJudge, judge_config, write_caparena

from balcaprl.evaluate.caparena import (
    Battle,
    CapArenaSection,
    arena_scores,
    caption_words,
    positions,
    run_caparena,
)
from balcaprl.evaluate.formats import read_caparena, read_caption_sets
from balcaprl.judge import JudgeCaller

GPT, COG, CPM = CAPARENA_BASELINES


def test_arena_arithmetic_by_hand():
    battles = [
        Battle("a", GPT, True, "Caption 1 is better"),  # model first and preferred: win
        Battle("b", GPT, False, "Caption 2 is better"),  # model second and preferred: win
        Battle("c", GPT, False, "Caption 1 is better"),  # loss
        Battle("d", COG, True, "Tie"),
        Battle("e", COG, True, "Caption 2 is better"),  # loss
        Battle("f", CPM, True, None),  # failed: neither win, loss nor tie
    ]
    scores = arena_scores(battles)
    per = scores["per_baseline"]
    assert per[GPT] == {"wins": 2, "losses": 1, "ties": 0, "failed": 0, "unrecognised": 0, "battles": 3,
                        "score": 0.5, "normalised": pytest.approx(100 / 3)}  # fmt: skip
    assert per[COG]["score"] == -0.5 and per[COG]["normalised"] == -50.0
    assert per[CPM]["score"] == 0.0 and per[CPM]["normalised"] is None and per[CPM]["failed"] == 1
    assert scores["score"] == pytest.approx((0.5 - 0.5 + 0.0) / 3)  # always over the three baselines
    assert scores["normalised"] == pytest.approx((100 / 3 - 50) / 2)  # over baselines with a judged battle
    # 200 battles per baseline, all won: the official maximum of 100
    assert arena_scores([Battle(str(i), b, True, "Caption 1 is better") for b in CAPARENA_BASELINES
                         for i in range(200)])["score"] == 100.0  # fmt: skip


def test_words_and_positions():
    assert caption_words("a red door") == 3
    assert caption_words("two  spaces") == 3  # split(' '), as the official script counts
    first = [positions(f"test_{i:05d}.jpg", 0) for i in range(6)]
    assert first == [positions(f"test_{i:05d}.jpg", 0) for i in range(6)]  # reproducible
    assert first == [False, True, True, True, False, True] and first != [
        positions(f"test_{i:05d}.jpg", 1) for i in range(6)
    ]


def test_protocol_over_http(tmp_path, eval_server):
    annotations, images, data = write_caparena(tmp_path)  # test_00000..5: 2 per baseline
    ours = {
        "test_00000.jpg": "two  spaces",  # 3 words as counted
        "test_00001.jpg": "w w w",
        "test_00002.jpg": "w w w w",
        "test_00003.jpg": "w w w w w",
        "test_00004.jpg": "FAULTY w w w w w",
        "test_00005.jpg": "w w w w w w w",
    }
    baseline = {name: entry["captions"][entry["ref_model"]] for name, entry in data.items()}
    preferred = [ours["test_00000.jpg"], ours["test_00001.jpg"], ours["test_00002.jpg"],  # wins
                 ours["test_00003.jpg"], baseline["test_00003.jpg"],  # tie
                 baseline["test_00005.jpg"]]  # loss  # fmt: skip
    handler = ProtocolJudge(preferred=preferred)
    server = eval_server(handler, rules={"FAULTY": ["server_error"]})
    captions_file = tmp_path / "model.caparena.json"
    captions_file.write_text(json.dumps(ours))
    captions = read_caption_sets(["caparena=" + str(captions_file)])["caparena"]
    result = run_caparena(
        JudgeCaller(judge_config(server.base_url), image_root=images), read_caparena(annotations), captions,
        tmp_path / "out", CapArenaSection(images=images),
    )  # fmt: skip
    per = result.metrics["per_baseline"]
    assert (per[GPT]["wins"], per[GPT]["score"]) == (2, 1.0)
    assert (per[COG]["wins"], per[COG]["ties"], per[COG]["score"]) == (1, 1, 0.5)
    assert (per[CPM]["losses"], per[CPM]["failed"], per[CPM]["score"]) == (1, 1, -0.5)
    assert result.score == pytest.approx((1.0 + 0.5 - 0.5) / 3)
    assert result.metrics["normalised"] == pytest.approx((100 + 50 - 100) / 3)
    assert result.metrics["length_words"] == pytest.approx((3 + 3 + 4 + 5 + 6 + 7) / 6)
    assert result.failures == {"server_error": 1} and result.n_scored == 5

    call = handler.seen[0]  # the image, both captions in the drawn order, and the human reference
    assert len(call.images) == 1 and "human reference for test_0000" in call.text
    assert (
        call.temperature == 0.1
        and call.body["top_p"] == 0.9
        and call.schema_name == "balcaprl_caparena_compare"
    )
    rows = {
        r["image"]: r for r in map(json.loads, (tmp_path / "out" / "items.jsonl").read_text().splitlines())
    }
    assert [rows[f"test_{i:05d}.jpg"]["model_position"] for i in range(6)] == [2, 1, 1, 1, 2, 1]
    for c in handler.seen:
        first = c.text.split("<caption_1>\n", 1)[1].split("\n</caption_1>", 1)[0]
        image = next(name for name in ours if name[:-4] in c.text or baseline[name] in c.text)
        expected_first = ours[image].strip() if rows[image]["model_position"] == 1 else baseline[image]
        assert first == expected_first


def test_own_baseline_is_skipped(tmp_path, eval_server):
    annotations, images, _ = write_caparena(tmp_path, n_per_baseline=1)
    server = eval_server(ProtocolJudge())
    captions = read_caption_sets([_json(tmp_path / "c.json", {f"test_{i:05d}.jpg": "x" for i in range(3)})])[
        None
    ]
    result = run_caparena(
        JudgeCaller(judge_config(server.base_url)), read_caparena(annotations), captions,
        tmp_path / "out", CapArenaSection(images=images), label=GPT,
    )  # fmt: skip
    assert result.metrics["skipped_own_baseline"] == ["test_00000.jpg"] and result.n_items == 2
    assert result.metrics["per_baseline"][GPT]["battles"] == 0


def _json(path, value):
    path.write_text(json.dumps(value))
    return path
