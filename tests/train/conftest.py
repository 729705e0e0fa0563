"""Session fixtures for the training tests; the builders live in train_testkit.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from fake_vllm import stand_in_vllm
from train_testkit import build_tiny_dataset, build_tiny_llava, build_tiny_qwen2_5_vl


@pytest.fixture(scope="session")
def tiny_policy(tmp_path_factory) -> Path:
    return build_tiny_qwen2_5_vl(tmp_path_factory.mktemp("tiny-qwen2_5_vl"))


@pytest.fixture(scope="session")
def tiny_llava(tmp_path_factory) -> Path:
    return build_tiny_llava(tmp_path_factory.mktemp("tiny-llava"))


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory) -> Path:
    return build_tiny_dataset(tmp_path_factory.mktemp("tiny-dataset"))


@pytest.fixture
def fake_vllm(monkeypatch):
    return stand_in_vllm(monkeypatch)
