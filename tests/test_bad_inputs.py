"""A hostile user's tour: bad inputs across the commands, through the real entry point.

Each row: how to make the mistake, the exit status it must give (2: a user error, one line, no
traceback; 1: the work ran but produced too little) and what the message must say. Messages are
compared with whitespace normalised, so the terminal width never matters.
"""

from __future__ import annotations

import io
import json
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from PIL import Image
from typer.testing import CliRunner

from balcaprl.cli import app

RECIPE_3B = Path(__file__).resolve().parents[1] / "configs" / "qwen2_5_vl_3b.yaml"


def png(colour=(200, 30, 30)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (32, 32), colour).save(buffer, "PNG")
    return buffer.getvalue()


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def ws(tmp_path_factory) -> Path:
    """Inputs shared by the rows (never changed by them): images, captions, a judge that refuses
    connections, a tiny synthetic dataset and a corrupt copy of it."""
    from balcaprl.synthetic.build import build_dataset

    root = tmp_path_factory.mktemp("hostile")
    (root / "images").mkdir()
    for name in ("a.png", "b.png"):
        (root / "images" / name).write_bytes(png((ord(name[0]), 0, 0)))
    (root / "captions.jsonl").write_text(
        "".join(json.dumps({"image": n, "caption": "A red door."}) + "\n" for n in ("a.png", "b.png"))
    )
    (root / "references.json").write_text(json.dumps({"a.png": "A red door.", "b.png": "A red door."}))
    (root / "latin1.jsonl").write_bytes(b'{"image": "a.png", "caption": "caf\xe9"}\n')
    (root / "empty.jsonl").write_text("\n")
    (root / "not-json.jsonl").write_text("image a.png: a red door\n")
    refusing = {"base_url": f"http://127.0.0.1:{closed_port()}/v1", "model": "m", "api_key_env": None,
                "cache_path": None, "max_retries": 0, "timeout_s": 5}  # fmt: skip
    (root / "refusing-judge.yaml").write_text(yaml.safe_dump(refusing))
    bomb = "".join(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]\n" for i in range(1, 7))
    (root / "bomb-judge.yaml").write_text(f"model: m\nl0: &l0 [x]\n{bomb}")  # 10**6 values once expanded
    (root / "duplicate-judge.yaml").write_text(yaml.safe_dump(refusing) + "model: another\n")
    (root / "duplicate-accelerate.yaml").write_text(
        "distributed_type: MULTI_GPU\nnum_processes: 2\nnum_processes: 8\n"
    )
    build_dataset(root / "dataset", n_train=2, n_eval=1, seed=0)
    build_dataset(root / "corrupt", n_train=2, n_eval=1, seed=0)
    (root / "corrupt" / "train.parquet").write_bytes(b"PAR1 this is not parquet")
    (root / "not-a-dataset").mkdir()
    (root / "not-a-dataset" / "notes.txt").write_text("hello")
    (root / "empty.json").write_text("[]")
    (root / "plain.txt").write_text("just a file")
    return root


def read_only_place(tmp: Path) -> Path:
    """A folder nobody may write in: a chmod-ed one, or (root writes anywhere) one in sysfs."""
    if os.geteuid() != 0:
        locked = tmp / "locked"
        locked.mkdir(mode=0o555, exist_ok=True)
        return locked / "out"
    if not Path("/sys/kernel").is_dir():
        pytest.skip("no read-only place to write into")
    return Path("/sys/kernel/balcaprl-out")


def holding(tmp: Path, *names: str) -> Path:
    out = tmp / "held"
    out.mkdir(exist_ok=True)
    for name in names:
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text("an earlier result\n")
    return out


def busy_port(tmp: Path) -> int:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    BUSY.append(sock)  # closed at the end of the test
    return sock.getsockname()[1]


BUSY: list[socket.socket] = []


def score(ws: Path, tmp: Path, *, captions="captions.jsonl", references="references.json", out=None,
          judge="refusing-judge.yaml", extra=()) -> list[str]:  # fmt: skip
    return ["score", "--images", str(ws / "images"), "--captions", str(ws / captions), "--references",
            str(ws / references), "--judge", str(ws / judge), "--out", str(out or tmp / "out"),
            "--no-progress", *extra]  # fmt: skip


def tiny_policy(tmp: Path) -> Path:
    """A saved (untrained) tiny policy, for the rows whose mistake comes after the policy loads."""
    from balcaprl.synthetic.policy import create_policy

    return create_policy(tmp / "policy")


def run_with_run_folder(ws: Path, tmp: Path) -> list[str]:
    (tmp / "run" / "checkpoint-3").mkdir(parents=True)
    (tmp / "run" / "checkpoint-3" / "trainer_state.json").write_text('{"global_step": 3}')
    return ["train", str(RECIPE_3B), f"data.path={ws / 'dataset'}", f"run.output_dir={tmp / 'run'}", NO_CACHE]


@dataclass(frozen=True)
class Case:
    id: str
    args: Callable[[Path, Path], list[str]]  # (workspace, this row's tmp folder) -> command line
    code: int
    says: str  # expected in the output; {ws} and {tmp} are filled in
    env: tuple[tuple[str, str], ...] = ()  # more environment variables
    in_tmp: bool = False  # run in this row's tmp folder (relative paths, as a user types them)


# The paper's recipe names its judge's key variable: a placeholder lets the run get as far as the
# mistake under test (no call is made); no cache file is opened.
JUDGE_KEY = (("OPENAI_API_KEY", "sk-placeholder-never-sent"),)
NO_CACHE = "judge.cache_path=null"
# A mistyped local model path must fail before any hub call; offline, so that a regression fails
# (with the hub's error) instead of hanging on retries.
OFFLINE = (("HF_HUB_OFFLINE", "1"),)


def mistyped(tmp: Path) -> str:
    """``runs/nope``: a model path whose first folder exists in the working directory (the row's
    tmp folder), so it can only be a local path, never a hub id ``org/name``."""
    (tmp / "runs").mkdir(exist_ok=True)
    return "runs/nope"


CASES = [
    # ----------------------------------------------------------------------------------- score
    Case("score: --images is not a folder",
         lambda ws, t: score(ws, t)[:1] + ["--images", str(ws / "plain.txt")] + score(ws, t)[3:],
         2, "error: --images {ws}/plain.txt is not a folder"),
    Case("score: the caption file does not exist", lambda ws, t: score(ws, t, captions="absent.jsonl"),
         2, "error: {ws}/absent.jsonl: no such file"),
    Case("score: captions that are not UTF-8", lambda ws, t: score(ws, t, captions="latin1.jsonl"),
         2, "error: {ws}/latin1.jsonl: not UTF-8 at byte 34 (line 1: bytes e9 22 7d 0a); re-save the file as UTF-8"),
    Case("score: references that are not UTF-8", lambda ws, t: score(ws, t, references="latin1.jsonl"),
         2, "error: {ws}/latin1.jsonl: not UTF-8 at byte 34"),
    Case("score: captions that are not JSON", lambda ws, t: score(ws, t, captions="not-json.jsonl"),
         2, "error: {ws}/not-json.jsonl:1: not JSON (Expecting value)"),
    Case("score: --out is a file", lambda ws, t: score(ws, t, out=ws / "plain.txt"),
         2, "error: --out {ws}/plain.txt is a file; give a folder (new or empty) for the results"),
    Case("score: --out is read-only", lambda ws, t: score(ws, t, out=read_only_place(t)),
         2, "cannot write there"),
    Case("score: --out holds results", lambda ws, t: score(ws, t, out=holding(t, "scores.jsonl")),
         2, "error: --out {tmp}/held already holds results (scores.jsonl); pass --resume to continue them, "
            "--overwrite to replace them, or choose another place"),
    Case("score: --resume and --overwrite", lambda ws, t: score(ws, t, extra=("--resume", "--overwrite")),
         2, "error: give --resume or --overwrite, not both"),
    Case("score: the judge config does not exist", lambda ws, t: score(ws, t, judge="absent.yaml"),
         2, "error: judge config not found: {ws}/absent.yaml"),
    Case("score: a judge config that is a YAML alias bomb", lambda ws, t: score(ws, t, judge="bomb-judge.yaml"),
         2, "error: judge config {ws}/bomb-judge.yaml is not valid YAML: its aliases expand to more than "
            "100,000 values"),
    Case("score: a judge config with a key given twice", lambda ws, t: score(ws, t, judge="duplicate-judge.yaml"),
         2, "error: judge config {ws}/duplicate-judge.yaml is not valid YAML: duplicate key 'model' at line 7 "
            "(first at line 5); give each key once"),
    Case("score: --captions /dev/zero (one endless line)", lambda ws, t: score(ws, t, captions="/dev/zero"),
         2, "error: /dev/zero: line 1 is longer than 64 MiB (the limit for one line of a text input)"),
    Case("score: --min-scored above 1", lambda ws, t: score(ws, t, extra=("--min-scored", "2")),
         2, "Invalid value for '--min-scored'"),
    Case("score: an empty caption file", lambda ws, t: score(ws, t, captions="empty.jsonl"),
         1, "incomplete: no captions in the input: nothing scored"),
    Case("score: a judge that refuses connections", lambda ws, t: score(ws, t),
         1, "incomplete: none of the 2 captions scored; run the same command with --resume to retry only the failed ones"),
    # ----------------------------------------------------------------------------------- judge serve
    Case("judge serve: --oracle on a folder that is not a dataset",
         lambda ws, t: ["judge", "serve", "--oracle", str(ws / "not-a-dataset")],
         2, "error: --oracle: {ws}/not-a-dataset/dataset.json not found"),
    Case("judge serve: a busy port", lambda ws, t: ["judge", "serve", "--port", str(busy_port(t))],
         2, "cannot listen there (Address already in use); choose another --port, or --port 0 for a free one"),
    Case("judge serve: fault rules given as a string",
         lambda ws, t: ["judge", "serve", "--faults", '{"rules": {"x": "rate_limit"}}'],
         2, "error: --faults: fault script: rules['x'] must be a list of faults (one per matching request), "
            "got the string 'rate_limit'"),
    Case("judge serve: a fault file that is not JSON",
         lambda ws, t: ["judge", "serve", "--faults", str(ws / "plain.txt")],
         2, "error: --faults {ws}/plain.txt: not JSON (Expecting value at line 1)"),
    # ----------------------------------------------------------------------------------- train
    Case("train: data.path does not exist",
         lambda ws, t: ["train", str(RECIPE_3B), f"data.path={t / 'nowhere'}", f"run.output_dir={t / 'run'}", NO_CACHE],
         2, "error: data.path: {tmp}/nowhere/dataset.json not found: {tmp}/nowhere is not a finished balcaprl dataset",
         JUDGE_KEY),
    Case("train: model.path is a mistyped local path",
         lambda ws, t: ["train", str(RECIPE_3B), f"model.path={mistyped(t)}", f"data.path={ws / 'dataset'}",
                        "run.output_dir=run", NO_CACHE],
         2, "error: model.path runs/nope: no such folder; give a checkpoint folder or a hub id", JUDGE_KEY + OFFLINE,
         in_tmp=True),
    Case("train: run.output_dir holds a run", run_with_run_folder,
         2, "error: run.output_dir {tmp}/run already holds a run (checkpoint-3); pass --resume to continue it, "
            "--overwrite to replace it", JUDGE_KEY),
    Case("train --plan: an accelerate config with a key given twice",
         lambda ws, t: ["train", str(RECIPE_3B), "--plan", "--launcher", str(ws / "duplicate-accelerate.yaml")],
         2, "error: --launcher {ws}/duplicate-accelerate.yaml: cannot read it as an accelerate config (duplicate key "
            "'num_processes' at line 3 (first at line 2); give each key once)"),
    Case("train: --resume and --overwrite",
         lambda ws, t: ["train", str(RECIPE_3B), f"data.path={ws / 'dataset'}", "--resume", "--overwrite"],
         2, "error: give --resume (or --resume-from) or --overwrite, not both"),
    # ----------------------------------------------------------------------------------- synthetic build
    Case("synthetic build: into a read-only place",
         lambda ws, t: ["synthetic", "build", "--out", str(read_only_place(t)), "--n-train", "1", "--n-eval", "1"],
         2, "cannot write there"),
    Case("synthetic build: onto a file",
         lambda ws, t: ["synthetic", "build", "--out", str(ws / "plain.txt"), "--n-train", "1", "--n-eval", "1"],
         2, "error: --out {ws}/plain.txt is a file; give a folder"),
    Case("synthetic build: into an existing dataset",
         lambda ws, t: ["synthetic", "build", "--out", str(ws / "dataset"), "--n-train", "1", "--n-eval", "1"],
         2, "error: --out {ws}/dataset already holds results (dataset.json, train.parquet, eval.parquet, "
            "scenes.jsonl and 1 more); pass --resume"),
    Case("synthetic build: --resume onto another build",
         lambda ws, t: ["synthetic", "build", "--out", str(ws / "dataset"), "--n-train", "5", "--n-eval", "1", "--resume"],
         2, "holds a synthetic dataset built with other settings (counts); --resume only finishes the same build"),
    Case("synthetic build: --policy is a mistyped local path",
         lambda ws, t: ["synthetic", "build", "--out", "o", "--n-train", "1", "--n-eval", "1", "--policy", mistyped(t)],
         2, "error: --policy runs/nope: no such folder; give a checkpoint folder or a hub id", OFFLINE, in_tmp=True),
    Case("synthetic build: --min-objects above --max-objects",
         lambda ws, t: ["synthetic", "build", "--out", str(t / "o"), "--min-objects", "5", "--max-objects", "3"],
         2, "error: need 1 <= min_objects <= max_objects <= 9 (one shape per 3x3 cell), got 5..3"),
    Case("synthetic show: an unknown --split",
         lambda ws, t: ["synthetic", "show", "--data", str(ws / "dataset"), "--split", "test"],
         2, "error: --split test: unknown split; choose train or eval"),
    Case("synthetic caption: --policy does not exist",
         lambda ws, t: ["synthetic", "caption", "--policy", str(t / "runs" / "nope"), "--data", str(ws / "dataset")],
         2, "error: {tmp}/runs/nope has no config.json: not a saved policy (create one with `balcaprl synthetic sft`)"),
    Case("synthetic caption: an unknown --split",
         lambda ws, t: ["synthetic", "caption", "--policy", str(tiny_policy(t)), "--data", str(ws / "dataset"),
                        "--split", "test"],
         2, "error: --split test: unknown split; choose train or eval"),
    # ----------------------------------------------------------------------------------- data
    Case("data info: a corrupt parquet file", lambda ws, t: ["data", "info", str(ws / "corrupt")],
         2, "error: {ws}/corrupt/train.parquet: not a readable parquet file"),
    Case("data info: not a dataset", lambda ws, t: ["data", "info", str(ws / "not-a-dataset")],
         2, "is not a finished balcaprl dataset (build one with `balcaprl synthetic build`"),
    Case("data info: --png in a read-only place",
         lambda ws, t: ["data", "info", str(ws / "dataset"), "--png", str(read_only_place(t) / "h.png")],
         2, "cannot write the histogram there"),
    Case("data prepare: a JSON with no entries",
         lambda ws, t: ["data", "prepare", "sharegpt4v", "--json", str(ws / "empty.json"), "--image-root",
                        str(ws / "images"), "--out", str(t / "ds"), "--no-progress", "--workers", "0"],
         1, "incomplete: {ws}/empty.json holds no entries: nothing to prepare"),
    Case("data prepare: --out holds a dataset",
         lambda ws, t: ["data", "prepare", "sharegpt4v", "--json", str(ws / "empty.json"), "--image-root",
                        str(ws / "images"), "--out", str(holding(t, "dataset.json")), "--no-progress"],
         2, "error: --out {tmp}/held already holds results (dataset.json); pass --resume"),
    Case("data prepare: --image-root does not exist",
         lambda ws, t: ["data", "prepare", "sharegpt4v", "--json", str(ws / "empty.json"), "--image-root",
                        str(t / "nowhere"), "--out", str(t / "ds")],
         2, "error: --image-root {tmp}/nowhere is not a folder"),
    Case("data recaption: not a dataset",
         lambda ws, t: ["data", "recaption", "--data", str(ws / "not-a-dataset"), "--model", "m",
                        "--judge-config", str(ws / "refusing-judge.yaml")],
         2, "is not a finished balcaprl dataset"),
    Case("verl export: not a dataset", lambda ws, t: ["verl", "export", "--data", str(ws / "not-a-dataset")],
         2, "error: {ws}/not-a-dataset/dataset.json not found"),
    Case("verl export: --tokenizer is a mistyped local path",
         lambda ws, t: ["verl", "export", "--data", str(ws / "dataset"), "--tokenizer", mistyped(t), "--out", "v"],
         2, "error: --tokenizer runs/nope: no such folder; give a checkpoint folder or a hub id", OFFLINE,
         in_tmp=True),
    Case("data info: --tokenizer is a mistyped local path",
         lambda ws, t: ["data", "info", str(ws / "dataset"), "--tokenizer", mistyped(t), "--png", "h.png"],
         2, "error: --tokenizer runs/nope: no such folder; give a checkpoint folder or a hub id", OFFLINE,
         in_tmp=True),
    # ----------------------------------------------------------------------------------- caption, evaluate
    Case("caption: --model is a path that does not exist",
         lambda ws, t: ["caption", "--model", str(t / "no-model"), "--images", str(ws / "images"), "--out",
                        str(t / "c.jsonl"), "--no-progress"],
         2, "error: --model {tmp}/no-model: no such folder; give a checkpoint folder or a hub id"),
    Case("caption: an unknown --split of a dataset",
         lambda ws, t: ["caption", "--model", "m", "--images", str(ws / "dataset"), "--split", "test", "--out",
                        str(t / "c.jsonl"), "--no-progress"],
         2, "error: --split test: unknown split; choose train or eval"),
    Case("caption: --model is a mistyped local path, not a hub id",
         lambda ws, t: ["caption", "--model", mistyped(t), "--images", str(ws / "images"), "--out", "caps/y.jsonl",
                        "--no-progress"],
         2, "error: --model runs/nope: no such folder; give a checkpoint folder or a hub id", OFFLINE, in_tmp=True),
    Case("caption: --out holds captions",
         lambda ws, t: ["caption", "--model", "m", "--images", str(ws / "images"), "--out",
                        str(holding(t, "c.jsonl") / "c.jsonl"), "--no-progress"],
         2, "error: --out {tmp}/held/c.jsonl already has results (c.jsonl); pass --resume"),
    Case("caption: a benchmark image folder that does not exist",
         lambda ws, t: ["caption", "--model", "m", "--benchmark", "caparena", "--images", str(t / "none"),
                        "--out", str(t / "c.jsonl")],
         2, "error: --images {tmp}/none is not a folder"),
    Case("evaluate: a caption file that is a folder",
         lambda ws, t: ["evaluate", "--captions", str(ws / "images"), "--out", str(t / "e"), "--suite", "caparena"],
         2, "error: --captions {ws}/images is a folder; give a file"),
    Case("evaluate: captions that are not UTF-8",
         lambda ws, t: ["evaluate", "--captions", f"caparena={ws / 'latin1.jsonl'}", "--out", str(t / "e")],
         2, "error: --captions {ws}/latin1.jsonl: not UTF-8 at byte 34"),
    Case("evaluate: --captions /dev/zero (one endless line)",
         lambda ws, t: ["evaluate", "--captions", "/dev/zero", "--out", str(t / "e"), "--suite", "caparena"],
         2, "/dev/zero: line 1 is longer than 64 MiB"),
    Case("evaluate: an empty caption file",
         lambda ws, t: ["evaluate", "--captions", str(ws / "empty.jsonl"), "--out", str(t / "e"), "--suite", "caparena"],
         1, "incomplete: --captions {ws}/empty.jsonl holds no captions: nothing scored"),
    Case("evaluate: --out is a file",
         lambda ws, t: ["evaluate", "--captions", str(ws / "captions.jsonl"), "--out", str(ws / "plain.txt"),
                        "--suite", "caparena"],
         2, "error: --out {ws}/plain.txt is a file"),
    Case("evaluate-general: an unknown benchmark",
         lambda ws, t: ["evaluate-general", "--model", "m", "--out", str(t / "e"), "--benchmarks", "mnist"],
         2, "error: --benchmarks: unknown general benchmark 'mnist'; choose from BLINK"),
    Case("evaluate-general: a results file that is not JSON",
         lambda ws, t: ["evaluate-general", "--import-only", str(ws / "plain.txt"), "--out", str(t / "e")],
         2, "error: {ws}/plain.txt: not JSON (Expecting value at line 1); not an lmms-eval results file"),
    Case("figure advantage-collapse: --out under a file",
         lambda ws, t: ["figure", "advantage-collapse", "--out", str(ws / "plain.txt" / "x"), "--grid", "2"],
         2, "error: --out {ws}/plain.txt/x: cannot write there (Not a directory); choose a writable folder"),
    Case("figure advantage-collapse: --out is a file",
         lambda ws, t: ["figure", "advantage-collapse", "--out", str(ws / "plain.txt"), "--grid", "2"],
         2, "error: --out {ws}/plain.txt is a file; give a folder (new or empty) for the results"),
    Case("demo: an unknown variant", lambda ws, t: ["demo", "--variants", "full,bogus"],
         2, "error: unknown variant 'bogus'; choose from full, grpo"),
]  # fmt: skip


def squash(text: str) -> str:
    return " ".join(text.split())


def test_the_table_is_long_enough():
    assert len(CASES) >= 25 and len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(case: Case, ws: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    if case.in_tmp:
        monkeypatch.chdir(tmp_path)
    try:
        result = CliRunner().invoke(app, case.args(ws, tmp_path), env={"COLUMNS": "100", **dict(case.env)})
    finally:
        while BUSY:
            BUSY.pop().close()
    output = squash(result.output)
    assert result.exit_code == case.code, result.output
    assert squash(case.says.format(ws=ws, tmp=tmp_path)) in output
    assert "Traceback" not in output
    if case.code == 2 and output.startswith("error:"):
        assert output.count("error:") == 1  # one line, said once


def test_a_lone_surrogate_is_a_row_level_bad_input(ws: Path, tmp_path: Path):
    """A JSON escape can put a lone surrogate into valid UTF-8: that caption's row is refused, the
    others are judged, and every file is written."""
    from balcaprl.testing.judge_server import JudgeServer
    from balcaprl.testing.scripted_judge import ScriptedJudge

    captions = tmp_path / "surrogate.jsonl"
    captions.write_text(
        '{"image": "a.png", "caption": "A red \\ud800 door."}\n{"image": "b.png", "caption": "A red door."}\n'
    )
    with JudgeServer(ScriptedJudge()) as server:
        judge = tmp_path / "judge.yaml"
        judge.write_text(yaml.safe_dump({"base_url": server.base_url, "model": "m", "api_key_env": None,
                                         "cache_path": None}))  # fmt: skip
        args = score(ws, tmp_path, captions=str(captions), judge=str(judge))
        result = CliRunner().invoke(app, args, env={"COLUMNS": "60"})
    assert result.exit_code == 1, result.output  # one of two scored: --min-scored 1 says incomplete
    assert "Traceback" not in result.output and "incomplete: only 1 of 2 captions scored" in squash(
        result.output
    )
    rows = [json.loads(line) for line in (tmp_path / "out" / "scores.jsonl").read_text().splitlines()]
    assert rows[0]["failure"] == "bad_input" and rows[0]["detail"] == (
        "the caption of this row is not valid Unicode: a lone surrogate U+D800 at character 7"
    )
    assert rows[1]["failure"] is None and server.counters.total >= 1


def test_a_password_in_base_url_is_refused_and_never_written(ws: Path, tmp_path: Path):
    """Secrets come only from environment variables: a judge URL with a password stops the command
    before anything is written (the run's recipe.yaml would have copied it), and no output echoes it."""
    secret_url = "https://user:s3cr3t-pa55@judge.example/v1"
    judge = tmp_path / "judge.yaml"
    judge.write_text(yaml.safe_dump({"base_url": secret_url, "model": "m", "cache_path": None}))
    runs = {
        "score": score(ws, tmp_path, judge=str(judge)),
        "train": [
            "train",
            str(RECIPE_3B),
            f"data.path={ws / 'dataset'}",
            f"run.output_dir={tmp_path / 'run'}",
            NO_CACHE,
            f"judge.base_url={secret_url}",
        ],  # fmt: skip
    }
    for name, args in runs.items():
        result = CliRunner().invoke(app, args, env={"COLUMNS": "100", **dict(JUDGE_KEY)})
        assert result.exit_code == 2, (name, result.output)
        assert "base_url: holds a password (user:***@host)" in squash(result.output), result.output
        assert "s3cr3t" not in result.output, result.output
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p != judge and b"s3cr3t" in p.read_bytes()]
    assert written == [] and not (tmp_path / "run" / "recipe.yaml").exists()
