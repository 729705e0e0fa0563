"""A hub that cannot be reached fails every command that loads a model by hub id in seconds, with
exit 2 and a local-cache message, and leaves nothing in the output place (``model_paths``)."""

from __future__ import annotations

import socket

import pytest
from typer.testing import CliRunner

import balcaprl.model_paths as model_paths
from balcaprl.cli import app

HUB_ID = "nobody-balcaprl/not-cached-anywhere"


def _closed_port() -> int:
    """A loopback port nothing listens on: a connection to it is refused at once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(params=["offline-variable", "refused"])
def dead_hub(request, monkeypatch, tmp_path):
    """The hub unusable in one of the two ways ``hub_unreachable`` detects, and an empty HF cache."""
    for variable in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HTTPS_PROXY", "https_proxy", "HTTP_PROXY",
                     "http_proxy", "ALL_PROXY", "all_proxy"):  # fmt: skip
        monkeypatch.delenv(variable, raising=False)
    if request.param == "offline-variable":
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    else:
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    model_paths._probe.cache_clear()
    yield request.param
    model_paths._probe.cache_clear()


def _recipe(tmp_path):
    built = CliRunner().invoke(app, ["synthetic", "build", "--out", str(tmp_path / "data"), "--n-train", "2",
                                     "--n-eval", "2"])  # fmt: skip
    assert built.exit_code == 0, built.output
    (tmp_path / "judge.yaml").write_text("base_url: http://127.0.0.1:9/v1\nmodel: m\napi_key_env: null\n")
    (tmp_path / "recipe.yaml").write_text(
        f"model: {{path: {HUB_ID}}}\ndata: {{path: data}}\njudge: judge.yaml\n"
        "train: {use_cpu: true, precision: fp32}\nrun: {output_dir: run}\n"
    )
    return tmp_path / "recipe.yaml"


def test_train_fails_at_once_with_a_local_cache_message_and_writes_nothing(dead_hub, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    recipe = _recipe(tmp_path)
    result = CliRunner().invoke(app, ["train", str(recipe)])
    assert result.exit_code == 2, result.output
    assert f"model.path {HUB_ID}: not in the local Hugging Face cache" in result.output
    assert "--resume" not in result.output
    assert not (tmp_path / "run" / "recipe.yaml").exists()


def test_caption_fails_at_once_with_a_local_cache_message(dead_hub, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    from PIL import Image

    (tmp_path / "images").mkdir()
    Image.new("RGB", (32, 32), "red").save(tmp_path / "images" / "a.png")
    result = CliRunner().invoke(
        app, ["caption", "--model", HUB_ID, "--images", "images", "--out", "captions.jsonl"]
    )
    assert result.exit_code == 2, result.output
    assert f"--model {HUB_ID}: not in the local Hugging Face cache" in result.output
    assert not (tmp_path / "captions.jsonl").exists()


def test_a_cached_hub_id_passes_and_later_loads_read_the_cache_only(dead_hub, tmp_path, monkeypatch):
    import huggingface_hub.constants as constants

    snapshot = tmp_path / "empty-cache" / f"models--{HUB_ID.replace('/', '--')}"
    (snapshot / "refs").mkdir(parents=True)
    (snapshot / "refs" / "main").write_text("abc")
    (snapshot / "snapshots" / "abc").mkdir(parents=True)
    (snapshot / "snapshots" / "abc" / "config.json").write_text("{}")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0" if dead_hub == "refused" else "1")
    assert model_paths.check_model_path(HUB_ID, "--model") == HUB_ID
    assert constants.HF_HUB_OFFLINE is True
