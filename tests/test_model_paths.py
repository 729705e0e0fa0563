"""Which model names are local paths (refused at once when missing) and which go to the hub."""

from __future__ import annotations

import pytest

from balcaprl.errors import MissingInputError
from balcaprl.model_paths import check_model_path, names_local_path


@pytest.fixture
def here(tmp_path, monkeypatch):
    """A working directory holding runs/ckpt (a checkpoint folder) and nothing named like a hub org."""
    (tmp_path / "runs" / "ckpt").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize(
    ("value", "local"),
    [
        ("runs/nope", True),  # its first folder exists here
        ("runs/ckpt", True),
        ("./nope", True),
        ("../nope", True),
        ("/abs/nope", True),
        ("~/nope", True),
        ("a/b/c", True),  # more than one slash: never a hub id
        ("Qwen/Qwen2.5-VL-3B-Instruct", False),
        ("gpt2", False),
        ("runs", True),  # exists here
    ],
)
def test_what_names_a_local_path(here, value, local):
    assert names_local_path(value) is local


@pytest.mark.parametrize("value", ["runs/nope", "./nope", "a/b/c", "~/balcaprl-no-such-folder"])
def test_a_missing_local_path_is_refused_naming_the_flag(here, value):
    with pytest.raises(MissingInputError) as caught:
        check_model_path(value, "--model")
    assert str(caught.value) == f"--model {value}: no such folder; give a checkpoint folder or a hub id"


@pytest.mark.parametrize("value", ["runs/ckpt", "Qwen/Qwen2.5-VL-3B-Instruct", "gpt2", "org/name"])
def test_an_existing_folder_or_a_hub_id_passes_unchanged(here, value, monkeypatch):
    monkeypatch.setattr("balcaprl.model_paths.hub_unreachable", lambda: None)  # a hub that answers
    assert check_model_path(value, "--model") == value
