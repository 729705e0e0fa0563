"""Set-up of the real-engine slice (``make test-vllm``): vLLM's own engine, on CPU, in a venv of its own.

Everything this CPU machine needs and a GPU machine does not is done here, never in the library:
- the imports vLLM takes from torchvision-backed transformers modules are served without torchvision
  (``cpu_shims/sitecustomize.py``, put on ``PYTHONPATH`` so that child processes, a ``vllm serve``
  among them, load it too);
- vLLM's CPU backend replaces each linear weight by a packed copy after loading, so an in-place weight
  sync would write to a tensor nobody reads: the engine keeps plain weights and ``F.linear``
  (the backend's own fallback path);
- a small KV cache (``VLLM_CPU_KVCACHE_SPACE``, the engines' ``kv_cache_memory_bytes``) and the engine
  core in the test's process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), as TRL's colocated engine runs.

Without vLLM (the main venv) every module of the slice is skipped.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
SHIMS = HERE / "cpu_shims"
sys.path.insert(0, str(HERE.parent / "train"))  # train_testkit: the tiny checkpoints and dataset

HAVE_VLLM = importlib.util.find_spec("vllm") is not None


def _cpu_set_up() -> None:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(SHIMS), os.environ.get("PYTHONPATH")) if p)
    spec = importlib.util.spec_from_file_location("balcaprl_test_cpu_shims", SHIMS / "sitecustomize.py")
    spec.loader.exec_module(importlib.util.module_from_spec(spec))  # this process too

    import torch
    import vllm.model_executor.layers.utils as layer_utils

    def plain_weights(layer: torch.nn.Module, remove_weight: bool) -> None:
        layer.cpu_linear = torch.nn.functional.linear

    layer_utils.dispatch_cpu_unquantized_gemm = plain_weights


if HAVE_VLLM:
    _cpu_set_up()


@pytest.fixture(scope="session")
def tiny_qwen2_5_vl(tmp_path_factory) -> Path:
    from train_testkit import build_tiny_qwen2_5_vl

    return build_tiny_qwen2_5_vl(tmp_path_factory.mktemp("tiny-qwen2_5_vl"))


@pytest.fixture(scope="session")
def tiny_qwen2_vl(tmp_path_factory) -> Path:
    from engine_kit import build_tiny_qwen2_vl

    return build_tiny_qwen2_vl(tmp_path_factory.mktemp("tiny-qwen2_vl"))


@pytest.fixture(scope="session")
def tiny_llava(tmp_path_factory) -> Path:
    from train_testkit import build_tiny_llava

    return build_tiny_llava(tmp_path_factory.mktemp("tiny-llava"))


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory) -> Path:
    from train_testkit import build_tiny_dataset

    return build_tiny_dataset(tmp_path_factory.mktemp("tiny-dataset"))
