"""The NVIDIA driver check before a GPU run: one line naming the minimum, with the driver and CUDA
versions injected (no GPU here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from balcaprl.errors import ConfigError
from balcaprl.train.driver import check_driver, installed_driver, minimum_driver

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "cuda, driver, minimum",
    [
        ("13.0", "575.57.08", "580.65.06"),  # the one-node set's torch 2.13.0 (CUDA 13) on an R575 driver
        ("13.0", "580.65.05", "580.65.06"),  # compared number by number, not as text
        ("12.8", "525.60.12", "525.60.13"),
        ("12.8", "470.256.02", "525.60.13"),  # 470 < 525 (as text "470" > "4" would mislead)
    ],
)
def test_an_old_driver_is_refused_in_one_line_naming_the_minimum(cuda, driver, minimum):
    with pytest.raises(ConfigError) as caught:
        check_driver(cuda=cuda, driver=driver, available=False)
    message = str(caught.value)
    assert "\n" not in message
    assert f"NVIDIA driver {driver} is too old for torch's CUDA {cuda}" in message
    assert f"needs driver {minimum} or newer (R{minimum.split('.')[0]})" in message


@pytest.mark.parametrize(
    "cuda, driver",
    [
        ("13.0", "580.65.06"),
        ("13.0", "590.1"),
        ("12.8", "580.65.06"),  # a newer driver runs older CUDA
        ("12.1", "1000.0.0"),  # 1000 > 580: numbers, not text
        ("99.0", "1.0"),  # a CUDA the table does not know: not guessed
        ("13.0", "575.57.08"),  # older than the minimum, but torch can use CUDA: forward compatibility
    ],
)
def test_whatever_torch_can_use_passes_and_is_described(cuda, driver):
    seen = check_driver(cuda=cuda, driver=driver, available=True)
    assert f"for CUDA {cuda}, NVIDIA driver {driver}" in seen and seen.endswith("CUDA available")
    assert ("forward-compatibility" in seen) == (driver == "575.57.08")


def test_a_cpu_build_has_nothing_to_check():
    assert "CPU build" in check_driver(cuda="", driver="580.65.06", available=False)


@pytest.mark.parametrize("driver", ["", "580.65.06"])
def test_a_cuda_build_that_cannot_use_cuda_is_refused_saying_what_it_saw(driver):
    with pytest.raises(ConfigError) as caught:
        check_driver(cuda="13.0", driver=driver, available=False)
    message = str(caught.value)
    assert "\n" not in message and message.startswith("torch cannot use CUDA: torch ")
    assert f"NVIDIA driver {driver or 'not loaded'}" in message


def test_the_driver_version_is_read_from_the_kernel_module(tmp_path):
    proc = tmp_path / "version"
    proc.write_text(
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build  (dvs-builder@U16)\n"
        "GCC version:  gcc version 12.3.0\n"
    )
    assert installed_driver(proc) == "580.65.06"
    proc.write_text(
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May 12 19:39:15 UTC 2024\n"
    )
    assert installed_driver(proc) == "535.183.01"
    assert installed_driver(tmp_path / "absent") is None
    assert minimum_driver("13.0") == "580.65.06" and minimum_driver("12.4") == "525.60.13"


def test_the_pinned_torch_is_the_cuda_13_build_the_check_knows():
    """The one-node set's comment names the driver the check enforces."""
    text = (ROOT / "constraints" / "gpu-one-node.txt").read_text()
    assert "torch==2.13.0" in text and "CUDA 13.0 build (NVIDIA driver R580 or newer)" in text
    assert minimum_driver("13.0").startswith("580.")


def test_zero3_is_pinned_or_marked_untested():
    """DeepSpeed is in no pin set: the ZeRO-3 config and the GPU guide say it is untested."""
    pins = (ROOT / "constraints" / "gpu-one-node.txt").read_text()
    config = (ROOT / "configs" / "accelerate" / "deepspeed_zero3.yaml").read_text()
    guide = (ROOT / "docs" / "gpu.md").read_text()
    if "deepspeed==" not in pins:
        assert "UNTESTED" in config.splitlines()[0]
        assert "ZeRO-3 (`configs/accelerate/deepspeed_zero3.yaml`) is untested" in guide
