"""Offline, nothing waits on the hub: a synthetic dataset's tokenizer is built locally (``data
recaption`` fills ``reference_tokens`` with it), and a hub tokenizer that is not cached fails at once,
in one line, instead of retrying an unreachable hub for minutes."""

from __future__ import annotations

import socket

import pytest
from data_testkit import ScriptedCaptioner

from balcaprl.data.format import TokenCounter, read_card, read_split_rows
from balcaprl.data.recaption import recaption_dataset
from balcaprl.errors import InputError
from balcaprl.judge import JudgeConfig
from balcaprl.model_paths import _probe
from balcaprl.synthetic.tokenizer import TOKENIZER_NAME, build_tokenizer


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture()
def no_hub(monkeypatch):
    """The hub is a port nobody listens on, offline mode is on for the hub's client, no proxy."""
    import huggingface_hub.constants

    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    for variable in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HTTPS_PROXY", "https_proxy", "HTTP_PROXY",
                     "http_proxy", "ALL_PROXY", "all_proxy"):  # fmt: skip
        monkeypatch.delenv(variable, raising=False)
    # the hub's client read the environment at import: a hub call made anyway fails fast, not in minutes
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    _probe.cache_clear()
    yield
    _probe.cache_clear()


def test_recaption_of_a_synthetic_dataset_counts_tokens_with_its_own_tokenizer(
    no_hub, tmp_path, recaption_server
):
    from balcaprl.synthetic.build import build_dataset

    data = build_dataset(tmp_path / "ds", n_train=2, n_eval=1, seed=0)
    assert read_card(data)["tokenizer"] == TOKENIZER_NAME
    config = JudgeConfig(base_url=recaption_server(ScriptedCaptioner()), model="m", api_key_env=None,
                         cache_path=None, max_retries=0)  # fmt: skip
    report = recaption_dataset(data, config, model="m")
    assert report.recaptioned == 3 and report.tokenizer == TOKENIZER_NAME
    counter = TokenCounter.from_hf(build_tokenizer())
    rows = [row for split in ("train", "eval") for row in read_split_rows(data, split)]
    assert [row["reference_tokens"] for row in rows] == counter.count([row["reference"] for row in rows])
    assert all(row["reference"] != row["reference_original"] for row in rows)


def test_a_hub_tokenizer_offline_fails_at_once_in_one_line(no_hub, capfd):
    with pytest.raises(InputError) as caught:
        TokenCounter.load("someorg/not-cached-here", what="--tokenizer")
    message = str(caught.value)
    assert message.startswith(
        "--tokenizer someorg/not-cached-here: not in the local Hugging Face cache, and the hub cannot be used "
        "(127.0.0.1:"
    )
    assert "cannot be reached" in message and "\n" not in message
    assert "Retrying" not in capfd.readouterr().err


def test_offline_mode_alone_is_enough_to_skip_the_hub(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(InputError, match=r"not in the local Hugging Face cache, and the hub cannot be used "
                                         r"\(HF_HUB_OFFLINE is set\)"):  # fmt: skip
        TokenCounter.load("someorg/not-cached-here")
