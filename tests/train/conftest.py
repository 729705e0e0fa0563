"""Session fixtures for the training tests; the builders live in train_testkit.py."""

from __future__ import annotations

from pathlib import Path

import pytest
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


def stand_in_vllm(monkeypatch: pytest.MonkeyPatch):
    """TRL's colocate path with the stand-in engine (tests/train/fake_vllm.py); TRL's distributed
    environment variables restored when ``monkeypatch`` undoes its changes."""
    from fake_vllm import FakeLLM, FakeSamplingParams
    from trl.generation import vllm_generation

    monkeypatch.setattr(vllm_generation, "is_vllm_available", lambda *a, **k: True)
    monkeypatch.setattr(vllm_generation, "LLM", FakeLLM, raising=False)
    monkeypatch.setattr(vllm_generation, "SamplingParams", FakeSamplingParams, raising=False)
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(name, "0" if "RANK" in name else "1" if name == "WORLD_SIZE" else "")
        monkeypatch.delenv(name)
    FakeLLM.instances.clear()
    monkeypatch.setattr(FakeLLM, "honour_processor_kwargs", True)
    return FakeLLM


@pytest.fixture
def fake_vllm(monkeypatch):
    return stand_in_vllm(monkeypatch)
