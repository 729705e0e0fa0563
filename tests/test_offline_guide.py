"""docs/offline.md, run as written: every command against `judge serve --oracle`, offline.

The guide's shell block is read from the file and run by ``guide_steps.run_steps``: here-documents
are written, the `judge serve ... &` line starts the server in a process of its own (on a free port,
which then replaces the guide's 8765), and each other `balcaprl ...` line runs in this process from a
scratch folder and must exit 0.
"""

from __future__ import annotations

import json

import pytest

from guide_steps import REPO, block_after, guide_steps, run_steps

GUIDE = REPO / "docs" / "offline.md"


def steps():
    return guide_steps(block_after(GUIDE.read_text(encoding="utf-8"), "The walk:\n"))


def test_the_guide_lists_every_protocol_and_command():
    commands = " ".join(line for kind, line in steps() if kind != "file")
    for command in ("judge serve --oracle", "caption", "score", "evaluate", "report", "inspect", "judge audit",
                    "data recaption", "train"):  # fmt: skip
        assert f"balcaprl {command}" in commands, command


@pytest.mark.filterwarnings("ignore::ResourceWarning")
def test_the_offline_guide_runs_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "120")
    run_steps(steps())

    offline = tmp_path / "offline"
    score = json.loads((offline / "score" / "summary.json").read_text())
    assert score["n_scored"] == score["n_captions"] == 8  # the caption file's keys matched the references
    for name in ("eval-policy", "eval-references"):
        record = json.loads((offline / name / "eval.json").read_text())
        assert all(
            record["results"][p]["complete"] for p in ("bcapscore", "dcscore", "captionqa", "caparena")
        )
    references = json.loads((offline / "eval-references" / "eval.json").read_text())["headline"]
    assert references["captionqa"] == 100.0 and references["dcscore"] > 90  # what the rules give the truth
    card = json.loads((offline / "data" / "dataset.json").read_text())
    assert card["recaption"]["recaptioned"] == 16 and card["recaption"]["limit"] is None  # trial, then all
    assert (offline / "run" / "final" / "README.md").is_file()
