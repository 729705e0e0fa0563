"""Fixtures for the inspect tests: a synthetic dataset, a real `balcaprl score` folder judged by the
oracle over HTTP (with hostile captions and a failed row), and the browser switch."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent))  # inspect_testkit, whatever pytest's import mode

from inspect_testkit import HOSTILE  # noqa: E402

from balcaprl.cli import app  # noqa: E402


@pytest.fixture(scope="session")
def dataset(tmp_path_factory) -> Path:
    from balcaprl.synthetic.build import build_dataset

    return build_dataset(
        tmp_path_factory.mktemp("inspect-data") / "ds", n_train=8, n_eval=2, seed=4, image_size=96
    )


@pytest.fixture(scope="session")
def scored(dataset, tmp_path_factory) -> dict:
    """`balcaprl score` run on 8 images x (good, hallucination, meta) + 2 hostile captions + 1 bad image."""
    from balcaprl.synthetic.oracle import OracleJudge
    from balcaprl.testing.caption_fixture import synthetic_captions
    from balcaprl.testing.judge_server import JudgeServer

    tmp = tmp_path_factory.mktemp("inspect-scored")
    rows = synthetic_captions(dataset, ("good", "hallucination", "meta"))
    first = rows[0]
    rows += [dict(first, caption=text, kind="hostile") for text in HOSTILE]
    rows.append(dict(first, image="images/missing.png", kind="bad_image"))
    captions = tmp / "captions.jsonl"
    captions.write_text(
        "".join(json.dumps({"image": r["image"], "caption": r["caption"]}) + "\n" for r in rows)
    )
    references = tmp / "references.json"
    references.write_text(json.dumps({r["image"]: r["reference"] for r in rows}))
    with JudgeServer(OracleJudge.from_dataset(dataset)) as server:
        judge = tmp / "judge.yaml"
        judge.write_text(
            f"base_url: {server.base_url}\nmodel: oracle\napi_key_env: null\ncache_path: null\nmax_retries: 0\n"
        )
        args = ["score", "--images", str(dataset), "--captions", str(captions), "--references", str(references),
                "--judge", str(judge), "--out", str(tmp / "scores")]  # fmt: skip
        result = CliRunner().invoke(app, args, env={"COLUMNS": "150"})
    # the missing image is a bad_input row, so the run is incomplete (exit 1) but its files are written
    assert result.exit_code == 1, result.output
    assert "only 26 of 27 captions scored" in " ".join(result.output.split())
    return {"folder": tmp / "scores", "rows": rows, "dataset": dataset}


# A toy `balcaprl demo` (about 30 s on 2 cores): dataset, SFT, 3 RL steps through the HTTP oracle judge.
@pytest.fixture(scope="session")
def demo_run(tmp_path_factory) -> Path:
    from balcaprl.testing.toy_demo import write_toy_demo_config

    tmp = tmp_path_factory.mktemp("inspect-demo")
    config = write_toy_demo_config(tmp / "toy.yaml")
    result = CliRunner().invoke(app, ["demo", "--config", str(config), "--out", str(tmp / "run")])
    assert result.exit_code == 0, result.output + repr(result.exception)
    return tmp / "run"
