"""The README's evaluate flow, run as written: its eval config, its baseline, caption's defaults.

Offline and without a GPU: the judge is `judge serve --oracle` over a synthetic dataset whose
held-out split is written as DeCapBench's files, and the captioning model is a stand-in that writes
what a rambling untrained model writes: words of 3 letters and a space (4 characters a token, the ratio
caption's default is sized by), never ending a sentence, until ``--max-new-tokens`` stops it. Every
``balcaprl`` line of the block runs as printed; only the two model names point at local folders.
"""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from balcaprl.cli import app
from guide_steps import REPO, block_after, guide_steps, oracle_server, run_steps

RAMBLE = ["fig", "hum", "zap"]  # 3-letter words, none of the world's: "xxx " is 4 characters a token


class RamblingCaptioner:
    """A captioning model's stand-in: ``max_new_tokens`` tokens of a sentence that never ends."""

    name = "transformers"

    def __init__(self, model, **_):
        self.model_id = str(model)

    def generate(self, images, prompts, settings):
        words = [RAMBLE[i % len(RAMBLE)] for i in range(settings.max_new_tokens)]
        return [" ".join(words)] * len(images)


def readme_steps():
    return guide_steps(block_after((REPO / "README.md").read_text(encoding="utf-8"), "## Evaluate, and see"))


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    """decapbench/ (the oracle's DeCapBench files and images), judge.yaml, runs/q3b/final; the oracle
    judge serving; yields nothing but the working directory."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "60")
    runner = CliRunner()
    built = runner.invoke(app, ["synthetic", "build", "--out", "world", "--n-train", "2", "--n-eval", "6"])
    assert built.exit_code == 0, built.output
    (tmp_path / "runs" / "q3b" / "final").mkdir(parents=True)
    monkeypatch.setattr("balcaprl.evaluate.captioning.TransformersCaptioner", RamblingCaptioner)
    monkeypatch.setattr("balcaprl.model_paths.hub_unreachable", lambda: None)  # the stand-in loads nothing
    with oracle_server(
        "balcaprl judge serve --oracle world --benchmarks bench --port 8765 &", "8765"
    ) as port:
        (tmp_path / "decapbench").mkdir()
        shutil.copy(tmp_path / "bench" / "IIW_400_data.jsonl", tmp_path / "decapbench")
        (tmp_path / "decapbench" / "images").symlink_to(tmp_path / "world")
        (tmp_path / "judge.yaml").write_text(
            f"base_url: http://127.0.0.1:{port}/v1\nmodel: balcaprl-oracle\napi_key_env: null\ncache_path: null\n"
        )
        yield tmp_path


@pytest.mark.filterwarnings("ignore::ResourceWarning")
def test_the_readme_evaluate_flow_runs_as_written(workspace):
    steps = readme_steps()
    assert (steps[0][0], steps[0][1].split("\n", 1)[0] + "\n") == ("file", "eval.yaml\n")  # the config, shown
    run_steps(steps)
    for run in ("eval-base", "eval-q3b"):
        record = json.loads((workspace / "runs" / run / "eval.json").read_text())
        assert record["results"]["bcapscore"]["n_scored"] == 6, record["results"]["bcapscore"]
    report = (workspace / "runs" / "report" / "report.md").read_text()
    assert "eval-base" in report and "eval-q3b" in report
    assert (workspace / "report.html").is_file()


@pytest.mark.filterwarnings("ignore::ResourceWarning")
def test_captions_past_the_claim_bound_fail_with_their_cause_not_a_retry(workspace):
    """512 tokens (the old default): one claim of 2,047 characters, every verdict an oversized answer;
    the hint names the cause and the flag, never --resume."""
    runner = CliRunner()
    args = [
        "--model",
        "runs/q3b/final",
        "--images",
        "world",
        "--out",
        "long.jsonl",
        "--max-new-tokens",
        "512",
    ]
    assert runner.invoke(app, ["caption", *args]).exit_code == 0
    result = runner.invoke(
        app, ["score", "--images", "world", "--captions", "long.jsonl", "--references", "bench/references.json",
              "--judge", "judge.yaml", "--out", "scored", "--no-progress"],
    )  # fmt: skip
    text = " ".join(result.output.split())
    assert result.exit_code == 1, text
    assert "oversized_answer" in text and "smaller --max-new-tokens" in text
    assert "--resume" not in text.split("incomplete:", 1)[1]


def test_the_default_caption_length_is_sized_by_the_judges_bound_on_a_claim():
    from balcaprl.evaluate.captioning import (
        CHARS_PER_TOKEN,
        DEFAULT_MAX_NEW_TOKENS,
        MAX_CLAIM_CHARS,
        GenerationSettings,
    )
    from balcaprl.judge.schemas import MAX_ASSERTION_CHARS

    assert MAX_CLAIM_CHARS == MAX_ASSERTION_CHARS  # the copy that keeps `caption` light is the bound
    assert (
        GenerationSettings().max_new_tokens
        == DEFAULT_MAX_NEW_TOKENS
        == MAX_ASSERTION_CHARS // CHARS_PER_TOKEN
    )
