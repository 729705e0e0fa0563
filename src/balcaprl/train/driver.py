"""The NVIDIA driver against the CUDA that torch was built for, checked before a GPU run starts.

A torch wheel built for CUDA 13 (the one-node set's torch 2.13.0) needs driver R580 or newer; with an
older driver ``torch.cuda.is_available()`` is False and only a warning says why, so a run would fail
later, or train on the CPU. CUDA's minor-version compatibility lets a driver run every toolkit of its
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


def check_driver(cuda: str | None = None, driver: str | None = None) -> None:
    """Refuse, in one line naming the minimum, a driver older than torch's CUDA needs.

    ``cuda`` defaults to ``torch.version.cuda`` (None on a CPU build: nothing to check), ``driver`` to
    :func:`installed_driver` (None without an NVIDIA driver: nothing to check, torch reports no GPU).
    """
    if cuda is None:
        import torch

        cuda = torch.version.cuda
    driver = driver if driver is not None else installed_driver()
    if not cuda or not driver:
        return
    minimum = minimum_driver(cuda)
    if minimum is not None and _parts(driver) < _parts(minimum):
        raise ConfigError(
            f"NVIDIA driver {driver} is too old for torch's CUDA {cuda}: it needs driver {minimum} or newer "
            f"(R{minimum.split('.')[0]}); update the driver or install a torch built for an older CUDA"
        )
