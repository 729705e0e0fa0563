"""Shared fixtures for the data tests: a ShareGPT4V-layout fixture and a tokenizer built locally."""

import dataclasses
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # data_testkit, whatever pytest's import mode

from data_testkit import scripted_app  # noqa: E402

from balcaprl.testing.sharegpt4v_fixture import make_sharegpt4v_fixture  # noqa: E402


@pytest.fixture(scope="session")
def fixture_template(tmp_path_factory):
    """The generated ShareGPT4V fixture; read-only (tests that change files use `sharegpt4v`)."""
    return make_sharegpt4v_fixture(tmp_path_factory.mktemp("sharegpt4v"))


@pytest.fixture
def sharegpt4v(fixture_template, tmp_path):
    """A private copy of the fixture that a test may change (its symlinks are relative)."""
    src = fixture_template.json_path.parent
    dst = tmp_path / "sharegpt4v"
    shutil.copytree(src, dst, symlinks=True)
    return dataclasses.replace(
        fixture_template,
        json_path=dst / fixture_template.json_path.name,
        image_root=dst / "images",
        good=list(fixture_template.good),
        bad=dict(fixture_template.bad),
        renamed=dict(fixture_template.renamed),
    )


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory):
    """A word-level tokenizer saved to a local folder, loadable with AutoTokenizer (no network)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = "a an the of with in on object picture description detailed has many details it red blue green"
    vocab = {"[UNK]": 0, "[PAD]": 1, **{w: i + 2 for i, w in enumerate(dict.fromkeys(words.split()))}}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", pad_token="[PAD]")
    path = tmp_path_factory.mktemp("tokenizer")
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture
def recaption_server():
    """``start(ScriptedCaptioner(...)) -> base_url``: a uvicorn server on 127.0.0.1, port 0."""
    import socket
    import threading
    import time

    import uvicorn

    servers = []

    def start(model):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        config = uvicorn.Config(scripted_app(model), log_level="critical", access_log=False, lifespan="off")
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        deadline = time.monotonic() + 20
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "the scripted server did not start"
            time.sleep(0.01)
        servers.append((server, thread))
        return f"http://127.0.0.1:{sock.getsockname()[1]}/v1"

    yield start
    for server, thread in servers:
        server.should_exit = True
        thread.join(timeout=10)
