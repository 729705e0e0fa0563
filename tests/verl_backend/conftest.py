"""Session fixtures for the verl-backend tests (builders in verl_testkit.py). Nothing here imports verl,
so the main venv (without verl) collects and skips these tests cleanly.

The folder is not called tests/verl on purpose: with tests/ on sys.path (as it is when the whole
suite runs), a folder of that name is a namespace package `verl` that shadows the real one."""

from __future__ import annotations

from pathlib import Path

import pytest
from verl_testkit import train_testkit


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory) -> Path:
    return train_testkit().build_tiny_dataset(tmp_path_factory.mktemp("verl-tiny-dataset"))


@pytest.fixture(scope="session")
def tiny_qwen(tmp_path_factory) -> Path:
    return train_testkit().build_tiny_qwen2_5_vl(tmp_path_factory.mktemp("verl-tiny-qwen2_5_vl"))


@pytest.fixture(scope="session")
def tiny_policy(tmp_path_factory) -> Path:
    """The synthetic world's tiny LLaVA policy (what `balcaprl demo` trains), saved like a checkpoint."""
    from balcaprl.synthetic.policy import create_policy

    return create_policy(tmp_path_factory.mktemp("verl-tiny-policy"))
