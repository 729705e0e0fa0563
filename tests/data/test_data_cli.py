"""The data commands through typer: `prepare sharegpt4v` and `data info` (recaption has its own file)."""

import json
import re

from typer.testing import CliRunner

from balcaprl.cli import app
from balcaprl.data.format import read_card, read_split_rows


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "120"})


def test_commands_are_registered():
    result = invoke("--help")
    assert result.exit_code == 0
    assert "data" in result.output
    data_help = invoke("data", "--help").output
    for name in ("prepare", "recaption", "info"):
        assert name in data_help
    assert "sharegpt4v" in invoke("data", "prepare", "--help").output


def test_prepare_then_info(fixture_template, tiny_tokenizer_dir, tmp_path):
    out = tmp_path / "ds"
    result = invoke(
        "data",
        "prepare",
        "sharegpt4v",
        "--json",
        fixture_template.json_path,
        "--image-root",
        fixture_template.image_root,
        "--out",
        out,
        "--tokenizer",
        tiny_tokenizer_dir,
        "--eval-size",
        "3",
        "--seed",
        "5",
        "--workers",
        "2",
        "--no-progress",
    )
    assert result.exit_code == 0, result.output
    assert (
        f"{len(fixture_template.good)} of {len(fixture_template.good) + len(fixture_template.bad)} entries kept"
        in " ".join(result.output.split())
    )
    assert "truncated_image" in result.output and "rejections.jsonl" in result.output
    card = read_card(out)
    assert card["tokenizer"] == str(tiny_tokenizer_dir) and card["split"]["seed"] == 5
    assert all(r["reference_tokens"] > 0 for r in read_split_rows(out, "train"))

    result = invoke("data", "info", out)
    assert result.exit_code == 0, result.output
    assert (
        "train" in result.output and "reference_original" in result.output and "unsafe_path" in result.output
    )
    assert (out / "reference_lengths.png").stat().st_size > 1000

    result = invoke(
        "data", "info", out, "--json", "--png", tmp_path / "h.png", "--tokenizer", tiny_tokenizer_dir
    )
    assert result.exit_code == 0, result.output
    info = json.loads(result.stdout)
    assert info["counts"]["eval"] == 3 and info["rejections"]["truncated_image"] == 2
    assert set(info["length_stats"]["tokens"]) == {"prompt", "reference_original", "reference"}
    assert (tmp_path / "h.png").exists()


def test_prepare_errors_exit_cleanly(fixture_template, tmp_path):
    result = invoke(
        "data",
        "prepare",
        "sharegpt4v",
        "--json",
        tmp_path / "nope.json",
        "--image-root",
        fixture_template.image_root,
        "--out",
        tmp_path / "o",
    )
    assert result.exit_code == 2 and "is not a file" in result.output
    result = invoke(
        "data",
        "prepare",
        "sharegpt4v",
        "--json",
        fixture_template.json_path,
        "--image-root",
        fixture_template.image_root,
        "--out",
        tmp_path / "o",
        "--images",
        "symlink",
    )
    assert result.exit_code == 2 and "choose auto, hardlink, copy or reencode" in result.output
    broken = tmp_path / "broken.json"
    broken.write_text('[{"id": 1}, {"id"')
    result = invoke(
        "data",
        "prepare",
        "sharegpt4v",
        "--json",
        broken,
        "--image-root",
        fixture_template.image_root,
        "--out",
        tmp_path / "o",
        "--no-progress",
    )
    assert result.exit_code == 2 and "download it again" in result.output

    def prepare_with_tokenizer(tokenizer):
        return invoke("data", "prepare", "sharegpt4v", "--json", fixture_template.json_path, "--image-root",
                      fixture_template.image_root, "--out", tmp_path / "o", "--tokenizer", tokenizer)  # fmt: skip

    result = prepare_with_tokenizer(tmp_path / "none")
    assert result.exit_code == 2 and f"--tokenizer {tmp_path / 'none'}: no such folder" in result.output
    (tmp_path / "no-tokenizer").mkdir()
    result = prepare_with_tokenizer(tmp_path / "no-tokenizer")
    assert result.exit_code == 2 and "cannot load a tokenizer" in result.output


def test_info_on_a_folder_that_is_not_a_dataset(tmp_path):
    result = invoke("data", "info", tmp_path)
    assert result.exit_code == 2 and "not a finished balcaprl dataset" in result.output


def test_prepare_refuses_then_resumes_or_replaces(fixture_template, tmp_path):
    out = tmp_path / "ds"
    command = ["data", "prepare", "sharegpt4v", "--json", fixture_template.json_path, "--image-root",
               fixture_template.image_root, "--out", out, "--eval-size", "2", "--workers", "0", "--no-progress"]  # fmt: skip
    assert invoke(*command).exit_code == 0
    before = read_card(out)["counts"]
    refused = invoke(*command)
    assert refused.exit_code == 2 and "already holds results (dataset.json" in " ".join(
        refused.output.split()
    )
    resumed = invoke(*command, "--resume")
    assert resumed.exit_code == 0, resumed.output
    reused = re.search(r"reused from an earlier run (\d+)", resumed.output).group(0)
    assert reused != "reused from an earlier run 0"  # (only missing files are checked again)
    (out / "images" / "stale.jpg").write_bytes(b"left by an earlier run")
    (out / "notes.txt").write_text("left by hand")
    replaced = invoke(*command, "--overwrite", "--eval-size", "3")
    assert replaced.exit_code == 0, replaced.output
    assert read_card(out)["counts"]["eval"] == 3 and sum(before.values()) == sum(
        read_card(out)["counts"].values()
    )
    assert not (out / "images" / "stale.jpg").exists() and not (out / "notes.txt").exists()
    assert reused in replaced.output  # the image checks came along; the results did not
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]


def test_a_trial_preparation_is_continued_by_the_full_run(fixture_template, tmp_path):
    out = tmp_path / "ds"
    command = ["data", "prepare", "sharegpt4v", "--json", fixture_template.json_path, "--image-root",
               fixture_template.image_root, "--out", out, "--eval-size", "2", "--workers", "0", "--no-progress"]  # fmt: skip
    trial = invoke(*command, "--limit", "5")
    assert trial.exit_code == 0, trial.output
    assert read_card(out)["source"]["entries_read"] == 5
    full = invoke(*command)  # no --resume: the trial's folder is continued, not refused
    assert full.exit_code == 0, full.output
    assert f"continuing the trial run (--limit 5) in {out}" in " ".join(full.output.split())
    card = read_card(out)
    assert card["source"]["limit"] is None and card["source"]["entries_read"] > 5
    assert re.search(r"reused from an earlier run [1-9]", full.output)  # the trial's image checks
    refused = invoke(*command)  # a full run's results are protected as before
    assert refused.exit_code == 2 and "pass --resume to continue them" in " ".join(refused.output.split())
