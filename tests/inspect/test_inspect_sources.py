"""`balcaprl inspect` reading real folders: a `balcaprl score` folder judged over HTTP, a training run
written by the trainer's own log writer, an evaluation folder; and clear errors for the rest."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

import pytest
import torch
from inspect_testkit import HOSTILE
from typer.testing import CliRunner

from balcaprl.cli import app
from balcaprl.errors import InputError
from balcaprl.inspect import load_inspection
from balcaprl.inspect.cards import verdict_fields
from balcaprl.rewards import BCAPSCORE_REWARDS, score_rollout
from balcaprl.synthetic.oracle import OracleJudge


def test_score_writes_verdicts_line_by_line(scored):
    folder, rows = scored["folder"], scored["rows"]
    verdicts = [json.loads(line) for line in (folder / "verdicts.jsonl").read_text().split("\n")[:-1]]
    scores = [json.loads(line) for line in (folder / "scores.jsonl").read_text().split("\n")[:-1]]
    assert [v["image"] for v in verdicts] == [s["image"] for s in scores] == [r["image"] for r in rows]
    assert [v["caption"] for v in verdicts] == [r["caption"] for r in rows]
    oracle = OracleJudge.from_dataset(scored["dataset"])
    for verdict, score, row in zip(verdicts, scores, rows, strict=True):
        if row["kind"] == "bad_image":
            assert verdict["verdict"] is None and score["failure"] == "bad_input"
            continue
        # the recorded verdict is the oracle's (evaluation rubric) and gives the row's scores
        scene = oracle.lookup(scored["dataset"] / row["image"])
        expected = oracle.verdict(scene, row["caption"], row["reference"], "evaluation")
        assert verdict["verdict"] == expected.model_dump(mode="json")
        again = score_rollout(verdict["verdict"], BCAPSCORE_REWARDS)
        assert (again.precision, again.recall) == pytest.approx((score["precision"], score["recall"]))
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["image_root"] == str(scored["dataset"].resolve())


def test_a_scores_folder_becomes_cards_with_marked_assertions(scored):
    found = load_inspection(scored["folder"])
    rows = scored["rows"]
    assert found.kind == "scores" and len(found.cards) == len(rows)
    kinds = [r["kind"] for r in rows]
    verdicts = [
        json.loads(line)["verdict"]
        for line in (scored["folder"] / "verdicts.jsonl").read_text().split("\n")[:-1]
    ]
    for card, kind, verdict in zip(found.cards, kinds, verdicts, strict=True):
        if kind == "bad_image":
            assert card["failure"] == "bad_input" and "ca" not in card
            assert card["precision"] is None and "cannot be read" in card["detail"]
            continue
        assert card["verdict_from"] == "judge" and card["ca"] == verdict_fields(verdict)["ca"]
    statuses = {kind: {s for card, k in zip(found.cards, kinds, strict=True) if k == kind for _, s in card["ca"]}
                for kind in ("good", "hallucination", "meta")}  # fmt: skip
    assert statuses["good"] == {"verified"}
    assert "hallucinated" in statuses["hallucination"] and "meta" not in statuses["hallucination"]
    assert "meta" in statuses["meta"] and "hallucinated" not in statuses["meta"]
    assert [c["caption"] for c in found.cards if c["caption"] in HOSTILE] == list(HOSTILE)
    # every image is a file of the dataset, found through the image root summary.json records
    assert len(found.images) == 9  # 8 images and the missing one
    sources = found.images.sources(scored["folder"] / "page.html", "embed")
    assert sum(s is not None for s in sources) == 8 and all(
        s is None or s.startswith("data:image/png") for s in sources
    )


def test_image_paths_may_not_leave_the_image_root(scored, tmp_path):
    folder = tmp_path / "scores"
    shutil.copytree(scored["folder"], folder)
    secret = tmp_path / "secret.png"
    shutil.copy(scored["dataset"] / scored["rows"][0]["image"], secret)
    for name in ("scores.jsonl", "verdicts.jsonl"):
        lines = (folder / name).read_text().split("\n")[:-1]
        first = json.loads(lines[0])
        first["image"] = os.path.relpath(secret, scored["dataset"].resolve())  # a real file, outside the root
        (folder / name).write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    found = load_inspection(folder)
    for mode in ("embed", "link"):
        sources = found.images.sources(tmp_path / "page.html", mode)
        assert sources[found.cards[0]["image"]] is None
        assert sources[found.cards[1]["image"]] is not None  # its neighbour, inside the root, is shown


def test_a_training_run_shows_the_chosen_step_with_oracle_verdicts(dataset, tmp_path):
    from balcaprl.data.format import read_split_rows
    from balcaprl.train.metrics import RolloutLog, append_jsonl

    run = tmp_path / "run"
    run.mkdir()
    (run / "recipe.yaml").write_text(f"data:\n  path: {dataset}\n  reference: reference\n")
    oracle = OracleJudge.from_dataset(dataset)
    from balcaprl.rewards import RewardConfig, failed_rollout
    from balcaprl.testing.caption_fixture import synthetic_captions

    captions = synthetic_captions(dataset, ("good", "hallucination", "meta", "too_short"), limit=2)
    rows = {r["id"]: r for r in read_split_rows(dataset, "train")}
    log = RolloutLog(run / "rollouts.jsonl", every=1)
    for step in (1, 2):
        records = []
        for c in captions:
            scene = oracle.lookup(rows[c["id"]]["image_path"])
            verdict = oracle.verdict(scene, c["caption"], c["reference"], "training")
            n_caption = len(c["caption"].split())
            records.append(
                score_rollout(verdict, RewardConfig(), n_caption, 40, id=c["id"], caption=c["caption"])
            )
        records[1] = failed_rollout("timeout", "no answer in 60 s", RewardConfig(), records[1].caption_tokens, 40,
                                    id=records[1].id, caption=records[1].caption)  # fmt: skip
        records[2] = dataclasses.replace(
            records[2], precision=0.123456
        )  # a logged reward the oracle cannot give back
        advantages = torch.arange(len(records), dtype=torch.float32) - 3
        groups = torch.tensor([0] * 4 + [1] * 4)
        log.write(step, records, advantages, groups)
        append_jsonl(run / "metrics.jsonl", {"step": step, "kind": "step", "rewards/precision/mean": 0.5,
                                              "length/caption_tokens_mean": 30.0})  # fmt: skip

    found = load_inspection(run)
    assert found.kind == "training" and found.sources == ["rollouts: run"]
    assert [c["step"] for c in found.cards] == [2] * 8  # the last logged step by default
    assert [c["group"] for c in found.cards] == [0] * 4 + [1] * 4
    assert [c["advantage"] for c in found.cards] == [float(a) for a in range(-3, 5)]
    (run_view,) = found.runs
    assert run_view.steps_logged == [1, 2] and run_view.steps_shown == [2]
    assert run_view.curves_png.startswith(b"\x89PNG")
    failed, mismatched = found.cards[1], found.cards[2]
    assert (
        failed["failure"] == "timeout"
        and failed["detail"] == "no answer in 60 s"
        and failed.get("ca") is None
    )
    assert mismatched.get("ca") is None and "does not give the logged rewards" in mismatched["note"]
    good = found.cards[0]
    assert good["verdict_from"] == "oracle" and {s for _, s in good["ca"]} == {"verified"}
    assert good["ratio_unit"] == "tokens" and good["masked"] in (True, False)
    assert any("re-derived 6 rollout verdicts" in n and "1 did not match" in n for n in found.notes)

    # a batch's second update logs no rewards: the header names the last judged step and its figures
    append_jsonl(run / "metrics.jsonl", {"step": 3, "kind": "step", "loss": 0.1})
    from balcaprl.inspect.page import _run_facts

    (later,) = load_inspection(run).runs
    assert "last judged step (2): precision 0.500, caption tokens 30.0" in _run_facts(later)

    both = load_inspection(run, steps=[1, 2])
    assert sorted({c["step"] for c in both.cards}) == [1, 2]
    with pytest.raises(InputError, match=r"no rollouts of step\(s\) \[7\].*logged steps 1, 2"):
        load_inspection(run, steps=[7])


def test_an_evaluation_folder_shows_its_bcapscore_results(scored, tmp_path):
    folder = tmp_path / "eval"
    shutil.copytree(scored["folder"], folder / "bcapscore")
    (folder / "eval.json").write_text(
        json.dumps({"label": "my-model", "results": {"bcapscore": {}, "dcscore": {}}})
    )
    found = load_inspection(folder)
    assert found.kind == "evaluation" and found.title == "my-model"
    assert len(found.cards) == len(scored["rows"])
    assert any("dcscore" in note for note in found.notes)
    # the rules each protocol was scored under (not recorded by an earlier balcaprl)
    assert "scoring rules, dcscore: not recorded (evaluated by an earlier balcaprl)" in found.notes


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p / "nothing-here", "does not exist"),
        (lambda p: p, "is none of: a scores folder"),
        (lambda p: (p / "x.txt").write_text("x") and p / "x.txt", "expected a folder, or one of"),
    ],
)
def test_unreadable_paths_are_clear_errors(tmp_path, make, message):
    with pytest.raises(InputError, match=message):
        load_inspection(make(tmp_path))


def test_the_command_writes_a_page_and_reports_user_errors_in_one_line(scored, tmp_path):
    out = tmp_path / "report.html"
    result = CliRunner().invoke(
        app, ["inspect", str(scored["folder"]), "--out", str(out)], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 0, result.output
    assert out.is_file() and f"{len(scored['rows'])} captions" in result.output
    bad = CliRunner().invoke(app, ["inspect", str(tmp_path / "missing")])
    assert bad.exit_code == 2 and "does not exist" in " ".join(bad.output.split())
    mode = CliRunner().invoke(app, ["inspect", str(scored["folder"]), "--image-mode", "inline"])
    assert mode.exit_code == 2 and "--image-mode inline: choose from" in " ".join(mode.output.split())


@pytest.mark.slow
def test_a_demo_run_shows_rollouts_and_held_out_captions_with_the_verdicts_the_trainer_saw(demo_run):
    found = load_inspection(demo_run)
    assert found.kind == "demo"
    assert found.sources == ["rollouts: full", "held-out: full", "held-out: SFT"]
    per_source = [[c for c in found.cards if c["source"] == i] for i in range(3)]
    rollouts, after, before = per_source
    assert len(rollouts) == 2 * 4 and {c["step"] for c in rollouts} == {3}  # the last step's batch
    assert sorted({c["group"] for c in rollouts}) == [0, 1]
    assert len(after) == len(before) == 6
    # every judged caption got the oracle's verdict back, and it gives exactly the logged rewards
    # (a re-derived verdict that did not would carry a note and no assertions)
    for card in found.cards:
        if card["failure"] is None:
            assert card["verdict_from"] == "oracle" and card["note"] == "", card
    assert all(c["image"] is not None for c in found.cards)
    (run,) = found.runs
    # the demo takes 2 updates per batch of rollouts: steps 1 and 3 generated (and logged) a batch
    assert run.steps_logged == [1, 3] and run.curves_png.startswith(b"\x89PNG")
