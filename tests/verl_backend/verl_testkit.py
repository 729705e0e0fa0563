"""Builders for the verl-backend tests (a module with a unique name; imported as ``verl_testkit``).

Reuses the training tests' builders (``tests/train/train_testkit.py``: tiny Qwen2.5-VL, tiny dataset,
scripted judge), loaded by file path so this folder does not depend on sys.path order.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from balcaprl.judge.protocol import JudgeRequest

_TRAIN_TESTKIT = Path(__file__).resolve().parents[1] / "train" / "train_testkit.py"


def train_testkit():
    """``tests/train/train_testkit.py`` as a module (shared with the TRL backend's tests)."""
    module = sys.modules.get("train_testkit")
    if module is None:
        spec = importlib.util.spec_from_file_location("train_testkit", _TRAIN_TESTKIT)
        module = importlib.util.module_from_spec(spec)
        sys.modules["train_testkit"] = module
        spec.loader.exec_module(module)
    return module


class RaisingJudge:
    """A judge whose every call raises (a crashed client, not a JudgeFailure)."""

    calls = 0

    async def judge_batch(self, requests: Sequence[JudgeRequest]):
        RaisingJudge.calls += 1
        raise ConnectionError("judge endpoint unreachable")


# judge_factory targets ("tests' module:callable"), called with image_root=...
JUDGES: dict[str, object] = {}


def scripted_judge(image_root=None):
    """The training tests' scripted judge; one instance per process, kept in JUDGES for inspection."""
    judge = JUDGES.get("scripted")
    if judge is None:
        judge = train_testkit().ScriptedJudge(fail_every=None)
        JUDGES["scripted"] = judge
    return judge


def failing_judge(image_root=None):
    """A scripted judge that fails (JudgeFailure 'timeout') on every caption."""
    return train_testkit().ScriptedJudge(fail_every=1, fail_reason="timeout")


def raising_judge(image_root=None):
    return RaisingJudge()


def crafted_batch(seed: int = 0):
    """Crafted rewards for the estimator tests: interleaved uids, groups of 1..5 rollouts, a rollout whose
    judge failed (all NaN), a partial NaN, a group whose every judge failed, and varied caption lengths.

    Returns (uids (N,) object array, rewards (N, 3) float64, response_mask (N, L) float32).
    """
    g = torch.Generator().manual_seed(seed)
    uids = np.array(
        ["p0", "p1", "p2", "p0", "p3", "p1", "p0", "p4", "p2", "p1", "p0", "p5", "p5", "p0", "p1"],
        dtype=object,
    )
    n, length = len(uids), 12
    rewards = torch.rand(n, 3, generator=g, dtype=torch.float64)
    rewards[3] = float("nan")  # p0: a failed judge
    rewards[9, 1] = float("nan")  # p1: recall missing, the rest judged
    rewards[11] = float("nan")  # p5: every judge failed
    rewards[12] = float("nan")
    lengths = torch.randint(1, length + 1, (n,), generator=g)
    mask = (torch.arange(length).unsqueeze(0) < lengths.unsqueeze(1)).to(torch.float32)
    return uids, rewards, mask


def ensure_qwen_vl_utils_importable() -> bool:
    """Let ``qwen_vl_utils`` (verl's vision path) import on a CPU-only machine; True if a stand-in was used.

    ``qwen_vl_utils`` imports torchvision at module level but uses it only for *video*; images go through
    PIL. PyPI has no torchvision build for a CPU-only torch (its CUDA build fails to load its operators),
    so on CPU a stand-in module with the three names it imports is present only while ``qwen_vl_utils``
    is imported, then removed (transformers must keep seeing no torchvision). GPU machines have the real one.
    """
    try:
        import qwen_vl_utils  # noqa: F401

        return False
    except Exception:
        import enum
        import types

        stub = types.ModuleType("torchvision")
        stub.__version__ = "0.0.0+balcaprl-test-stand-in"
        stub.io = types.ModuleType("torchvision.io")
        transforms = types.ModuleType("torchvision.transforms")
        transforms.InterpolationMode = enum.Enum("InterpolationMode", "NEAREST BILINEAR BICUBIC")
        stub.transforms = transforms
        names = {"torchvision": stub, "torchvision.io": stub.io, "torchvision.transforms": transforms}
        sys.modules.update(names)
        try:
            for name in [n for n in sys.modules if n.startswith("qwen_vl_utils")]:
                del sys.modules[name]
            import qwen_vl_utils  # noqa: F401,F811
        finally:
            for name in names:
                sys.modules.pop(name, None)
        return True
