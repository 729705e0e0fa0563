"""The NVIDIA driver against the CUDA that torch was built for, checked before a GPU run starts.

A torch wheel built for CUDA 13 (the one-node set's torch 2.13.0) needs driver R580 or newer, unless the
container carries CUDA's forward-compatibility package; when torch cannot use CUDA only a warning says
why, so a run would fail later, or train on the CPU. The check refuses exactly that case (a CUDA build of
torch that cannot use CUDA) and otherwise says what it saw. CUDA's minor-version compatibility lets a driver run every toolkit of its
major version from the major's first release on, so the minimum depends on the major version only
(NVIDIA's CUDA Toolkit release notes, "CUDA Driver" table, Linux).
"""

from __future__ import annotations

import re
from pathlib import Path

from balcaprl.errors import ConfigError

MINIMUM_DRIVER = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}  # CUDA major -> Linux driver
PROC_VERSION = Path("/proc/driver/nvidia/version")


def _parts(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version))


def minimum_driver(cuda: str) -> str | None:
    """The oldest Linux driver for CUDA ``cuda`` ("13.0"), or None for a major version not listed."""
    return MINIMUM_DRIVER.get(_parts(cuda)[0]) if _parts(cuda) else None


def installed_driver(proc_version: Path = PROC_VERSION) -> str | None:
    """The loaded NVIDIA kernel module's version (``/proc/driver/nvidia/version``), None without one."""
    try:
        text = proc_version.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    found = re.search(r"Kernel Module(?: for \w+)?\s+(\d+\.\d+(?:\.\d+)?)", text)
    return found.group(1) if found else None


def check_driver(cuda: str | None = None, driver: str | None = None, available: bool | None = None) -> str:
    """What the GPU check saw, in one line; refused (:class:`ConfigError`) only when torch is a CUDA build
    and cannot use CUDA, the one case a GPU run cannot start.

    A driver older than the table's minimum is not refused when torch can use CUDA: containers that ship
    CUDA's forward-compatibility package (``cuda-compat``) run newer toolkits on older drivers. When torch
    cannot, an old driver is named as the likely cause. ``cuda`` defaults to ``torch.version.cuda`` (None
    on a CPU build: nothing to check), ``driver`` to :func:`installed_driver`, ``available`` to
    ``torch.cuda.is_available()``.
    """
    import torch

    cuda = torch.version.cuda if cuda is None else cuda
    driver = installed_driver() if driver is None else driver
    if not cuda:
        return f"torch {torch.__version__} is a CPU build: no GPU to check"
    available = torch.cuda.is_available() if available is None else available
    minimum = minimum_driver(cuda)
    old = bool(driver) and minimum is not None and _parts(driver) < _parts(minimum)
    seen = f"torch {torch.__version__} for CUDA {cuda}, NVIDIA driver {driver or 'not loaded'}"
    if available:
        compat = f" (older than {minimum}: CUDA's forward-compatibility package at work)" if old else ""
        return f"{seen}{compat}: CUDA available"
    if old:
        raise ConfigError(
            f"NVIDIA driver {driver} is too old for torch's CUDA {cuda}: it needs driver {minimum} or newer "
            f"(R{minimum.split('.')[0]}), or CUDA's forward-compatibility package; torch cannot use CUDA "
            "(update the driver or install a torch built for an older CUDA)"
        )
    raise ConfigError(
        f"torch cannot use CUDA: {seen}"
        + ("" if driver else " (no /proc/driver/nvidia/version: is a GPU attached and its driver loaded?)")
    )
