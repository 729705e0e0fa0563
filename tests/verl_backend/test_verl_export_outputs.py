"""``balcaprl verl export`` and the output policy (``balcaprl.outputs``): every input is checked before
the old export is touched, an existing export is refused unless --overwrite, and a replacement is
swapped in at the end. The export needs pyarrow only, so these run without verl (in the main venv)."""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from balcaprl.cli import app
from balcaprl.errors import InputError
from balcaprl.train.verl_backend.export import export_verl

runner = CliRunner(env={"COLUMNS": "200"})


def files(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def one_line(result):
    return " ".join(result.output.split())


@pytest.fixture()
def exported(tiny_dataset, tmp_path):
    """A good export in tmp_path/verl, with a file of the user's beside it."""
    out = tmp_path / "verl"
    result = runner.invoke(app, ["verl", "export", "--data", str(tiny_dataset), "--out", str(out)])
    assert result.exit_code == 0, result.output
    (out / "notes.txt").write_text("mine")
    return out


def test_a_failed_export_leaves_the_earlier_one_untouched(tiny_dataset, exported, tmp_path):
    before = files(exported)
    no_tokenizer = tmp_path / "no-tokenizer"
    no_tokenizer.mkdir()
    for flags in ([], ["--overwrite"]):
        failed = runner.invoke(app, ["verl", "export", "--data", str(tiny_dataset), "--out", str(exported),
                                     "--tokenizer", str(no_tokenizer), *flags])  # fmt: skip
        assert failed.exit_code == 2
        assert one_line(failed).startswith(f"error: --tokenizer {no_tokenizer}: cannot load a tokenizer")
        assert files(exported) == before  # export.json included
    assert sorted(p.name for p in tmp_path.iterdir()) == ["no-tokenizer", "verl"]  # nothing left aside


def test_an_existing_export_is_refused_without_overwrite(tiny_dataset, exported):
    before = files(exported)
    refused = runner.invoke(app, ["verl", "export", "--data", str(tiny_dataset), "--out", str(exported)])
    assert refused.exit_code == 2
    assert one_line(refused) == (
        f"error: --out {exported} already holds results (export.json, train.parquet, eval.parquet); "
        "pass --overwrite to replace them, or choose another place"
    )
    assert files(exported) == before


def test_overwrite_replaces_the_export_in_one_step(tiny_dataset, exported, tmp_path):
    args = ["verl", "export", "--data", str(tiny_dataset), "--out", str(exported), "--max-samples", "1"]
    replaced = runner.invoke(app, [*args, "--overwrite"])
    assert replaced.exit_code == 0, replaced.output
    assert f"wrote 1 train, 1 eval rows to {exported}" in one_line(replaced)
    assert sorted(p.name for p in exported.iterdir()) == ["eval.parquet", "export.json", "train.parquet"]
    assert json.loads((exported / "export.json").read_text())["counts"] == {"train": 1, "eval": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["verl"]


def test_a_bad_row_fails_before_anything_is_written(tiny_dataset, exported, tmp_path):
    data = tmp_path / "ds"
    shutil.copytree(tiny_dataset, data)
    missing = sorted((data / "images").iterdir())[-1]
    missing.unlink()  # an eval image: the train split would be written first if rows were not checked
    before = files(exported)
    failed = runner.invoke(app, ["verl", "export", "--data", str(data), "--out", str(exported), "--embed-images",
                                 "--overwrite"])  # fmt: skip
    assert failed.exit_code == 2 and f"image {missing} cannot be read" in one_line(failed)
    assert files(exported) == before
    fresh = tmp_path / "fresh"
    failed = runner.invoke(
        app, ["verl", "export", "--data", str(data), "--out", str(fresh), "--embed-images"]
    )
    assert failed.exit_code == 2 and not fresh.exists()


def test_the_default_folder_is_named_and_a_folder_holding_the_dataset_is_refused(tiny_dataset, tmp_path):
    data = tmp_path / "ds"
    shutil.copytree(tiny_dataset, data)
    export = ["verl", "export", "--data", str(data)]
    assert runner.invoke(app, export).exit_code == 0
    refused = runner.invoke(app, export)
    assert refused.exit_code == 2
    assert one_line(refused).startswith(f"error: the export folder {data / 'verl'} already holds results")
    assert runner.invoke(app, [*export, "--overwrite"]).exit_code == 0
    with pytest.raises(InputError, match="must differ from the dataset folder .* and must not contain it"):
        export_verl(data, tmp_path, overwrite=True)
    assert (data / "train.parquet").is_file()
