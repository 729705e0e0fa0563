"""`balcaprl data recaption` against a loopback OpenAI-compatible server with a scripted captioner."""

import json
import shlex
import shutil
from collections import Counter
from pathlib import Path

import pytest
import yaml
from data_testkit import ScriptedCaptioner
from typer.testing import CliRunner

from balcaprl.cli import app
from balcaprl.data.format import load_split, read_card, read_split_rows
from balcaprl.data.recaption import recaption_dataset
from balcaprl.data.sharegpt4v import PrepareOptions, prepare_sharegpt4v
from balcaprl.judge import JudgeConfig, JudgeConfigError
from balcaprl.judge.rubrics import load_rubric


def rows_of(root):
    return [r for split in ("train", "eval") for r in read_split_rows(root, split)]


def judge_config(base_url, **overrides):
    values = dict(
        base_url=base_url,
        model="judge-model",
        api_key_env=None,
        cache_path=None,
        timeout_s=5.0,
        max_retries=1,
        concurrency=4,
        price_per_million_tokens={"prompt": 1.0, "completion": 4.0},
    )
    values.update(overrides)
    return JudgeConfig(**values)


@pytest.fixture(scope="module")
def prepared_template(fixture_template, tiny_tokenizer_dir, tmp_path_factory):
    from balcaprl.data.format import TokenCounter

    out = tmp_path_factory.mktemp("recaption") / "ds"
    prepare_sharegpt4v(
        fixture_template.json_path,
        fixture_template.image_root,
        out,
        options=PrepareOptions(eval_size=3, workers=0),
        token_counter=TokenCounter.load(str(tiny_tokenizer_dir)),
    )
    return out


@pytest.fixture
def dataset(prepared_template, tmp_path):
    """A private copy of a prepared ShareGPT4V-layout dataset (33 rows, tokenizer in the card)."""
    out = tmp_path / "ds"
    shutil.copytree(prepared_template, out)
    return out


def test_recaption_replaces_references_and_keeps_originals(dataset, recaption_server):
    before = {r["id"]: r for r in rows_of(dataset)}
    model = ScriptedCaptioner()
    report = recaption_dataset(dataset, judge_config(recaption_server(model)), model="gpt-5-mini")

    assert report.rows == report.requested == report.recaptioned == len(before) == 33
    assert not report.failed and report.calls == 33 and report.from_progress == 0
    after = {r["id"]: r for r in rows_of(dataset)}
    assert set(after) == set(before)
    for sample_id, row in after.items():
        old = before[sample_id]
        assert row["reference_original"] == old["reference_original"] == old["reference"]
        assert row["reference"] == ScriptedCaptioner.caption_for(row["image_sha256"], old["prompt"])
        assert row["prompt"] == old["prompt"] and row["image"] == old["image"]
        assert row["reference_tokens"] != old["reference_tokens"]  # recounted for the new text
    # The original prompt was sent as the instruction, with the recaption rubric, to the --model.
    assert sorted(instruction for _, instruction in model.calls) == sorted(
        r["prompt"] for r in before.values()
    )
    assert {body["model"] for body in model.bodies} == {"gpt-5-mini"}

    card = read_card(dataset)
    recaption = card["recaption"]
    assert recaption["model"] == "gpt-5-mini" and recaption["rubric"] == "recaption"
    assert recaption["rubric_version"] == load_rubric("recaption").version == report.rubric_version
    assert recaption["recaptioned"] == 33 and recaption["failed"] == 0
    assert recaption["prompt_tokens"] == 33 * 100 and recaption["completion_tokens"] == 33 * 20
    assert recaption["estimated_cost_usd"] == pytest.approx((3300 * 1.0 + 660 * 4.0) / 1e6)
    assert report.cost_usd == pytest.approx(recaption["estimated_cost_usd"])
    # Everything else in the card survives the rewrite.
    assert card["tokenizer"] and card["rejections"]["truncated_image"] == 2 and card["source"]["json"]
    assert len(load_split(dataset, "train")) == card["counts"]["train"]
    assert not (dataset / ".recaption" / "card.json").exists()


def test_failures_keep_the_original_and_are_reported_then_retried(dataset, recaption_server):
    rows = rows_of(dataset)
    digests = [r["image_sha256"] for r in rows]
    faults = {
        digests[0]: ["server_error", "server_error"],  # the SDK's one retry fails too
        digests[1]: ["refusal"],
        digests[2]: ["length"],
        digests[3]: ["empty"],
        digests[4]: ["bad_request"],
        digests[5]: ["content_filter"],
        digests[6]: ["rate_limit"],  # the SDK retries it and the second attempt succeeds
        digests[7]: ["server_error"],  # likewise
    }
    model = ScriptedCaptioner(faults)
    base_url = recaption_server(model)
    report = recaption_dataset(dataset, judge_config(base_url))

    expected = {"server_error": 1, "refused": 2, "truncated_output": 1, "invalid_json": 1, "bad_input": 1}
    assert dict(report.failed) == expected
    assert report.recaptioned == 33 - 6
    after = {r["id"]: r for r in rows_of(dataset)}
    failed_ids = {rows[i]["id"] for i in range(6)}
    for sample_id, row in after.items():
        assert row["reference"].strip()  # never an empty reference
        if sample_id in failed_ids:
            assert row["reference"] == row["reference_original"]
        else:
            assert row["reference"].startswith("A re-captioned image")
    listed = [json.loads(line) for line in (dataset / "recaption_failures.jsonl").read_text().splitlines()]
    assert {item["id"] for item in listed} == failed_ids and all(item["detail"] for item in listed)
    card = read_card(dataset)["recaption"]
    assert card["failed"] == 6 and card["failures"] == expected

    # A second run asks again only for the failures (their fault lists are used up now).
    calls_before = Counter(d for d, _ in model.calls)
    report = recaption_dataset(dataset, judge_config(base_url))
    assert report.recaptioned == 33 and not report.failed
    assert report.from_progress == 27 and report.calls == 6
    new_calls = Counter(d for d, _ in model.calls) - calls_before
    assert set(new_calls) == set(digests[:6])
    assert (dataset / "recaption_failures.jsonl").read_text() == ""


def test_progress_lines_in_a_log(dataset, recaption_server, capsys):
    rows = rows_of(dataset)
    model = ScriptedCaptioner({rows[0]["image_sha256"]: ["refusal"], rows[1]["image_sha256"]: ["refusal"]})
    capsys.readouterr()
    recaption_dataset(dataset, judge_config(recaption_server(model)), model="gpt-5-mini", progress=True)
    lines = capsys.readouterr().err.splitlines()  # captured: not a terminal, so plain lines
    assert lines[0] == "re-captioning with gpt-5-mini: started, 33 rows"
    assert lines[-1].startswith("re-captioning with gpt-5-mini: done, 33/33 rows in ")
    assert lines[-1].endswith("; 2 failed (kept the original)")


class Interrupt(BaseException):
    """Stands in for Ctrl-C."""


def test_interrupted_run_resumes_without_paying_twice(dataset, recaption_server):
    model = ScriptedCaptioner()
    base_url = recaption_server(model)
    seen = []

    def stop_after_five(sample_id, outcome):
        seen.append(sample_id)
        if len(seen) == 5:
            raise Interrupt

    before = rows_of(dataset)
    with pytest.raises(Interrupt):
        recaption_dataset(dataset, judge_config(base_url, concurrency=1), on_result=stop_after_five)
    assert rows_of(dataset) == before  # nothing rewritten until the end
    assert len(model.calls) == 5

    report = recaption_dataset(dataset, judge_config(base_url, concurrency=4))
    assert report.recaptioned == 33 and report.from_progress == 5 and report.calls == 28
    assert Counter(d for d, _ in model.calls) == Counter(r["image_sha256"] for r in before)  # each once
    assert read_card(dataset)["recaption"]["prompt_tokens"] == 33 * 100  # earlier runs' tokens counted


def test_judge_cache_serves_a_second_dataset(dataset, prepared_template, recaption_server, tmp_path):
    model = ScriptedCaptioner()
    config = judge_config(recaption_server(model), cache_path=tmp_path / "cache.sqlite")
    recaption_dataset(dataset, config)
    assert len(model.calls) == 33
    other = tmp_path / "other"
    shutil.copytree(prepared_template, other)  # same images and prompts, no progress file
    report = recaption_dataset(other, config)
    assert len(model.calls) == 33 and report.from_cache == 33 and report.calls == 0
    assert [r["reference"] for r in rows_of(other)] == [r["reference"] for r in rows_of(dataset)]


def test_limit_for_trial_runs(dataset, recaption_server):
    model = ScriptedCaptioner()
    report = recaption_dataset(dataset, judge_config(recaption_server(model)), limit=4)
    assert report.requested == 4 and report.recaptioned == 4 and len(model.calls) == 4
    rows = rows_of(dataset)
    assert [r["reference"] != r["reference_original"] for r in rows] == [True] * 4 + [False] * 29
    assert read_card(dataset)["recaption"]["not_requested"] == 29


def test_a_broken_setup_stops_early(dataset, recaption_server):
    model = ScriptedCaptioner(always="bad_request")
    before = rows_of(dataset)
    with pytest.raises(JudgeConfigError, match="all failed.*temperature: null"):
        recaption_dataset(dataset, judge_config(recaption_server(model), concurrency=1))
    assert len(model.calls) == 16 and rows_of(dataset) == before

    model = ScriptedCaptioner(always="unauthorized")
    with pytest.raises(JudgeConfigError, match="HTTP 401"):
        recaption_dataset(dataset, judge_config(recaption_server(model)))


def test_interrupted_rewrite_is_recovered(dataset, recaption_server):
    model = ScriptedCaptioner()
    base_url = recaption_server(model)
    recaption_dataset(dataset, judge_config(base_url), limit=2)
    # A crash between the old card's removal and the new card: the stash lets a re-run finish.
    (dataset / ".recaption").mkdir(exist_ok=True)
    shutil.copyfile(dataset / "dataset.json", dataset / ".recaption" / "card.json")
    (dataset / "dataset.json").unlink()
    report = recaption_dataset(dataset, judge_config(base_url))
    assert report.recaptioned == 33 and report.calls == 31
    assert read_card(dataset)["counts"]["train"] == 30


def test_cli_recaption_then_info(dataset, recaption_server, tmp_path):
    model = ScriptedCaptioner(faults={rows_of(dataset)[0]["image_sha256"]: ["refusal"]})
    config = tmp_path / "judge.yaml"
    config.write_text(yaml.safe_dump({**judge_config(recaption_server(model)).model_dump(mode="json")}))
    result = CliRunner(env={"COLUMNS": "120"}).invoke(
        app,
        [
            "data",
            "recaption",
            "--data",
            str(dataset),
            "--model",
            "gpt-5-mini",
            "--judge-config",
            str(config),
            "--limit",
            "10",
            "--no-progress",
        ],
    )
    assert result.exit_code == 1, result.output  # one row failed: written, and the status says so
    text = " ".join(result.output.split())
    assert "incomplete: only 9 of 10 rows re-captioned (90.0%; --min-recaptioned 1 asks for 100%)" in text
    assert "9 of 33 references re-captioned by gpt-5-mini" in text
    assert "failed (kept the original reference): 1 (refused 1)" in text
    assert "tokens 1000 in / 200 out" in text and "$0.0018" in text

    result = CliRunner(env={"COLUMNS": "120"}).invoke(app, ["data", "info", str(dataset), "--json"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.stdout)
    assert info["recaptioned"] == 9 and info["recaption"]["model"] == "gpt-5-mini"

    bad = tmp_path / "bad.yaml"
    bad.write_text("base_url: http://127.0.0.1:9/v1\nmodell: typo\n")
    result = CliRunner(env={"COLUMNS": "120"}).invoke(
        app, ["data", "recaption", "--data", str(dataset), "--model", "m", "--judge-config", str(bad)]
    )
    assert result.exit_code == 2 and "modell: unknown key" in result.output


def test_cli_continues_a_trial_then_refuses_a_finished_recaptioning_unless_resume_or_overwrite(
    dataset, recaption_server, tmp_path
):
    model = ScriptedCaptioner()
    config = tmp_path / "judge.yaml"
    config.write_text(yaml.safe_dump({**judge_config(recaption_server(model)).model_dump(mode="json")}))
    command = ["data", "recaption", "--data", str(dataset), "--model", "gpt-5-mini", "--judge-config", str(config),
               "--no-progress"]  # fmt: skip
    runner = CliRunner(env={"COLUMNS": "120"})
    first = runner.invoke(app, [*command, "--limit", "5"])
    assert first.exit_code == 0, first.output
    assert len(model.calls) == 5
    full = runner.invoke(app, command)  # after a trial: --resume implied
    assert full.exit_code == 0, full.output
    assert f"continuing the trial run (--limit 5) in {dataset}" in " ".join(full.output.split())
    assert len(model.calls) == 33  # the 5 finished rows are not asked again
    refused = runner.invoke(app, command)  # a full run's results: refused
    assert refused.exit_code == 2 and "already holds results (.recaption/progress.jsonl" in refused.output
    assert "pass --resume to continue them" in refused.output
    resumed = runner.invoke(app, [*command, "--resume"])
    assert resumed.exit_code == 0, resumed.output
    assert len(model.calls) == 33  # nothing left to ask
    redone = runner.invoke(app, [*command, "--overwrite"])
    assert redone.exit_code == 0, redone.output
    assert len(model.calls) == 66  # every row asked again
    assert read_card(dataset)["recaption"]["recaptioned"] == 33


def test_the_guides_recaption_flow_works_as_written(dataset, recaption_server, tmp_path):
    """docs/data.md's two `data recaption` commands (the trial, then the full run), run as written
    but for the dataset folder and the judge config, which point at the test's."""
    guide = (Path(__file__).resolve().parents[2] / "docs" / "data.md").read_text(encoding="utf-8")
    commands = [
        shlex.split(line) for line in guide.splitlines() if line.startswith("balcaprl data recaption ")
    ]
    assert len(commands) == 2 and "--limit" in commands[0] and "--limit" not in commands[1]
    model = ScriptedCaptioner()
    config = tmp_path / "judge.yaml"
    config.write_text(yaml.safe_dump({**judge_config(recaption_server(model)).model_dump(mode="json")}))
    mine = {"--data": str(dataset), "--judge": str(config)}
    for command in commands:
        args = [mine.get(previous, arg) for previous, arg in zip(["", *command], command, strict=False)]
        result = CliRunner(env={"COLUMNS": "120"}).invoke(app, [*args[1:], "--no-progress"])
        assert result.exit_code == 0, (args, result.output)
    trial = int(commands[0][commands[0].index("--limit") + 1])
    assert len(model.calls) == 33 > trial  # every row once: the trial's rows were not asked again
    assert read_card(dataset)["recaption"]["recaptioned"] == 33


def test_a_run_without_the_api_key_leaves_nothing_that_refuses_its_retry(dataset, recaption_server, tmp_path,
                                                                        monkeypatch):  # fmt: skip
    """Run before `export KEY=...`: exit 2 and no progress file; after the export, the same command
    (no --resume) runs."""
    model = ScriptedCaptioner()
    config = tmp_path / "judge.yaml"
    values = judge_config(recaption_server(model), api_key_env="BALCAPRL_TEST_RECAPTION_KEY")
    config.write_text(yaml.safe_dump(values.model_dump(mode="json")))
    command = ["data", "recaption", "--data", str(dataset), "--model", "m", "--judge-config", str(config),
               "--limit", "3", "--no-progress"]  # fmt: skip
    monkeypatch.delenv("BALCAPRL_TEST_RECAPTION_KEY", raising=False)
    runner = CliRunner(env={"COLUMNS": "60"})
    first = runner.invoke(app, command)
    assert first.exit_code == 2 and "BALCAPRL_TEST_RECAPTION_KEY is not set" in first.output
    assert not (dataset / ".recaption" / "progress.jsonl").exists()
    monkeypatch.setenv("BALCAPRL_TEST_RECAPTION_KEY", "k")
    retry = runner.invoke(app, command)
    assert retry.exit_code == 0, retry.output
    assert len(model.calls) == 3


def test_an_unreachable_endpoint_shows_its_cause_and_the_retry_is_not_refused(dataset, tmp_path):
    """A name that does not resolve: the cause on the terminal, and the same command may run again
    (no caption was paid for, so nothing is protected)."""
    config = tmp_path / "judge.yaml"
    values = judge_config("http://balcaprl-no-such-host.invalid/v1", max_retries=0)
    config.write_text(yaml.safe_dump(values.model_dump(mode="json")))
    command = ["data", "recaption", "--data", str(dataset), "--model", "m", "--judge-config", str(config),
               "--limit", "2", "--no-progress"]  # fmt: skip
    runner = CliRunner(env={"COLUMNS": "60"})
    for _ in range(2):
        result = runner.invoke(app, command)
        assert result.exit_code == 1, result.output
        text = " ".join(result.output.split())
        assert "failed (kept the original reference): 2 (server_error 2)" in text
        assert "server_error, e.g.: " in text and "balcaprl-no-such-host.invalid" in text
        assert "already holds results" not in text
