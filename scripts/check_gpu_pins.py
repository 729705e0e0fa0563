#!/usr/bin/env python3
"""Prove that each GPU pin set resolves for Linux x86_64 / Python 3.12, from registry metadata alone.

    python3 scripts/check_gpu_pins.py                  # both sets (what CI runs, via `make check-gpu-pins`)
    python3 scripts/check_gpu_pins.py --python-version 3.11 --python-version 3.12

For each set it resolves exactly what a GPU user installs (``pip install -e ".[EXTRAS]" -c FILE``) with
``uv pip compile``: balcaprl's own requirements with the extras, constrained by the set's file, for the
target platform and Python, wheels only. uv reads a wheel's metadata with HTTP range requests when the
index serves no separate metadata file, so no CUDA wheel (torch alone is ~0.5 GB) is downloaded; pip's
``install --dry-run`` downloads whole wheels for the same answer. uv is installed from the registry into
a throwaway virtual environment; nothing is installed anywhere else.

Outcomes, one line per set and Python version:

    OK              resolved; the line names the resolved torch / transformers / vLLM / TRL / verl
    NOT CHECKED     the registry did not answer (no connection, DNS, timeouts): says so, exit 0
    FAIL            the set cannot be resolved ("No solution found"), or uv failed otherwise: exit 1

So CI fails only when a set genuinely cannot resolve, never because the registry is unreachable.
The platform tag is manylinux_2_35 (glibc 2.35, e.g. Ubuntu 22.04): vLLM's llguidance dependency ships
manylinux_2_31 wheels only, which the older default tag (2_28) excludes.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_INDEX = "https://pypi.org/simple"
PLATFORM = "x86_64-manylinux_2_35"
UV_REQUIREMENT = "uv>=0.13,<0.14"
REPORTED = ("torch", "transformers", "vllm", "trl", "verl", "accelerate", "peft")

__all__ = ["PIN_SETS", "Outcome", "PinSet", "classify", "main", "probe_index", "resolve"]


@dataclass(frozen=True)
class PinSet:
    """One GPU stack: the extras a user installs and the constraints file they pass with ``-c``."""

    name: str
    extras: tuple[str, ...]
    constraints: str


PIN_SETS = (
    PinSet("one node (TRL + vLLM)", ("trl", "vllm"), "constraints/gpu-one-node.txt"),
    PinSet("cluster (verl)", ("verl", "vllm"), "constraints/gpu-cluster.txt"),
)

# What uv (and pip) print when the registry cannot be reached or stops answering; uv exits 2 then.
NETWORK_ERRORS = re.compile(
    r"error sending request|failed to fetch|dns error|failed to lookup address|tcp connect error|"
    r"connection (refused|reset|closed|aborted)|timed out|timeout|could not connect|network is unreachable|"
    r"temporary failure in name resolution|max retries exceeded|request failed after|"
    r"status server error|503 service unavailable|502 bad gateway|504 gateway",
    re.IGNORECASE,
)
UNSATISFIABLE = re.compile(r"no solution found", re.IGNORECASE)


@dataclass(frozen=True)
class Outcome:
    """What one resolution attempt showed: ``resolved``, ``unreachable``, ``unresolvable`` or ``error``."""

    status: str
    detail: str = ""

    @property
    def fails_ci(self) -> bool:
        return self.status in ("unresolvable", "error")


def classify(returncode: int | None, output: str) -> Outcome:
    """The outcome of ``uv pip compile`` from its exit status (None: killed by our timeout) and output.

    A network failure counts as "unreachable" even when uv also reports an unsatisfiable set, since a
    missing index page can make a set look unsatisfiable.
    """
    if returncode is None:
        return Outcome("unreachable", "the registry did not answer within the time limit")
    if returncode == 0:
        return Outcome("resolved")
    if NETWORK_ERRORS.search(output):
        return Outcome("unreachable", _last_lines(output))
    if UNSATISFIABLE.search(output):
        return Outcome("unresolvable", _last_lines(output, 20))
    return Outcome("error", f"uv exited with status {returncode}: {_last_lines(output)}")


def _last_lines(text: str, n: int = 6) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return "\n".join(lines[-n:])


def probe_index(index_url: str, timeout: float = 10.0) -> str | None:
    """None when the index answers for one small project page; else why not."""
    url = index_url.rstrip("/") + "/uv/"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            response.read(1024)
    except (urllib.error.URLError, OSError, ValueError) as error:
        return f"{url}: {error}"
    return None


def install_uv(workdir: Path, timeout: float) -> tuple[Path | None, str]:
    """uv installed from the registry into a throwaway venv under ``workdir``; (None, why) on failure."""
    venv = workdir / "uv-venv"
    commands = [
        [sys.executable, "-m", "venv", str(venv)],
        [
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            UV_REQUIREMENT,
        ],
    ]
    for command in commands:
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            return None, f"{' '.join(command)}: no answer within {timeout:.0f} s"
        if done.returncode != 0:
            return None, _last_lines(done.stdout + done.stderr)
    return venv / "bin" / "uv", ""


def resolve(
    uv: Path | str,
    pin_set: PinSet,
    python_version: str,
    index_url: str,
    workdir: Path,
    timeout: float,
    root: Path = ROOT,
) -> tuple[Outcome, dict[str, str]]:
    """Resolve one set for one Python version; returns the outcome and the resolved versions."""
    lock = workdir / f"{pin_set.constraints.replace('/', '_')}.py{python_version}.lock"
    command = [
        str(uv), "pip", "compile", str(root / "pyproject.toml"),
        *(arg for extra in pin_set.extras for arg in ("--extra", extra)),
        "--constraint", str(root / pin_set.constraints),
        "--python-version", python_version,
        "--python-platform", PLATFORM,
        "--only-binary", ":all:",
        "--index-url", index_url,
        "--no-config", "--no-annotate", "--no-header", "--quiet",
        "--cache-dir", str(workdir / "uv-cache"),
        "--output-file", str(lock),
    ]  # fmt: skip
    # uv reads neither pip's configuration nor its local wheel folders (a CPU torch would satisfy
    # torch==2.13.0 for the wrong platform); its own settings come only from the flags above.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UV_", "PIP_"))}
    env.update(UV_HTTP_TIMEOUT="30", UV_PYTHON_DOWNLOADS="never", UV_NO_PROGRESS="1")
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, check=False)
    except subprocess.TimeoutExpired:
        return classify(None, ""), {}
    outcome = classify(done.returncode, done.stdout + done.stderr)
    versions = read_versions(lock.read_text()) if outcome.status == "resolved" and lock.is_file() else {}
    return outcome, versions


def read_versions(lock_text: str) -> dict[str, str]:
    """``name==version`` lines of a uv lock (markers and comments dropped), by lower-case name."""
    versions = {}
    for line in lock_text.splitlines():
        match = re.match(r"^([A-Za-z0-9_.\-]+)==([^\s;]+)", line.strip())
        if match:
            versions[match.group(1).lower().replace("_", "-")] = match.group(2)
    return versions


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--index-url", default=os.environ.get("BALCAPRL_PIN_INDEX_URL", DEFAULT_INDEX))
    parser.add_argument("--python-version", action="append", help="target Python (repeatable; default 3.12)")
    parser.add_argument("--uv", help="an existing uv executable (default: install one into a throwaway venv)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per resolution (default 120)")
    parser.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)  # tests: another checkout
    args = parser.parse_args(argv)
    pythons = args.python_version or ["3.12"]

    why = probe_index(args.index_url)
    if why is not None:
        print(f"NOT CHECKED: registry unreachable ({why}); the GPU pin sets were not checked")
        return 0
    with tempfile.TemporaryDirectory(prefix="balcaprl-pins-") as tmp:
        workdir = Path(tmp)
        uv: Path | str | None = args.uv
        if uv is None:
            uv, why = install_uv(workdir, args.timeout)
            if uv is None:
                print(
                    f"NOT CHECKED: could not install {UV_REQUIREMENT} from the registry; the GPU pin sets were"
                )
                print(f"not checked. pip said:\n{why}")
                return 0
        failed = False
        for pin_set in PIN_SETS:
            for python in pythons:
                label = f"{pin_set.name}, {pin_set.constraints}, Python {python}, {PLATFORM}"
                outcome, versions = resolve(
                    uv, pin_set, python, args.index_url, workdir, args.timeout, args.root
                )
                if outcome.status == "resolved":
                    shown = ", ".join(f"{name} {versions[name]}" for name in REPORTED if name in versions)
                    print(f"OK          {label}: {shown}")
                elif outcome.status == "unreachable":
                    print(f"NOT CHECKED {label}: registry unreachable, not checked\n{outcome.detail}")
                else:
                    failed = True
                    print(f"FAIL        {label}: {outcome.status}\n{outcome.detail}")
        return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
