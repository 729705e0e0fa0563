"""`balcaprl synthetic ...` end to end through the real CLI app (thin wrappers, real work)."""

from __future__ import annotations

from typer.testing import CliRunner

from balcaprl.cli import app
from balcaprl.data.format import read_card, read_split_rows

runner = CliRunner(env={"COLUMNS": "100"})


def test_build_then_show(tmp_path):
    out = tmp_path / "ds"
    result = runner.invoke(
        app,
        [
            "synthetic",
            "build",
            "--out",
            str(out),
            "--n-train",
            "3",
            "--n-eval",
            "2",
            "--seed",
            "5",
            "--max-objects",
            "3",
        ],
    )
    assert result.exit_code == 0, result.output
    assert read_card(out)["counts"] == {"train": 3, "eval": 2}
    assert all(len(r["reference"]) > 0 for r in read_split_rows(out, "train"))

    shown = runner.invoke(app, ["synthetic", "show", "--data", str(out), "--index", "1"])
    assert shown.exit_code == 0, shown.output
    assert "b-CapScore 1.000" in shown.output and '"pointable": true' in shown.output

    judged = runner.invoke(
        app, ["synthetic", "show", "--data", str(out), "--caption", "The composition feels balanced."]
    )
    assert judged.exit_code == 0, judged.output
    assert "precision 0.000" in judged.output


def test_bad_arguments_are_reported(tmp_path):
    result = runner.invoke(
        app, ["synthetic", "build", "--out", str(tmp_path / "x"), "--min-objects", "5", "--max-objects", "3"]
    )
    assert result.exit_code != 0
    assert "max_objects" in result.output


def test_sft_command_defaults_match_the_config():
    import inspect

    from balcaprl.cli.synthetic import sft
    from balcaprl.synthetic.sft import SFTConfig

    params = inspect.signature(sft).parameters
    for name in ("steps", "batch_size", "lr", "flawed_fraction", "seed", "eval_limit"):
        assert params[name].default.default == getattr(SFTConfig(), name), name
