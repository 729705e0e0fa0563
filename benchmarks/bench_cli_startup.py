"""Start-up time of the command line: ``balcaprl --help`` against a bare ``python -c pass``.

Both run as fresh processes, alternately, several times; the medians and their ratio are printed,
and, for scale, how long ``import torch`` alone takes (what the help no longer pays for). The help
should stay well under a second: command modules import torch, transformers, openai and pyarrow
inside the command bodies, and ``import balcaprl`` loads its public names on first use.

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/bench_cli_startup.py [--runs N]`` (about 10 s).
Not a timed test.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def _wall(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env={**os.environ, "COLUMNS": "100"})
    return time.perf_counter() - start


def _help_command() -> list[str]:
    """The installed ``balcaprl`` script next to this interpreter, else ``python -m balcaprl.cli``."""
    script = Path(sys.executable).parent / "balcaprl"
    return [str(script), "--help"] if script.exists() else [sys.executable, "-m", "balcaprl.cli", "--help"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="Runs of each command (median reported).")
    runs = parser.parse_args().runs
    commands = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "balcaprl --help": _help_command(),
        "python -c 'import torch'": [sys.executable, "-c", "import torch"],
    }
    for argv in commands.values():  # warm the file cache once
        _wall(argv)
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(runs):
        for name, argv in commands.items():
            times[name].append(_wall(argv))
    medians = {name: statistics.median(values) for name, values in times.items()}
    print(f"{'command':<26} {'median s':>9}  (of {runs} runs; {' '.join(_help_command()[:1])})")
    for name, value in medians.items():
        print(f"{name:<26} {value:>9.3f}")
    print(f"balcaprl --help / python -c pass: {medians['balcaprl --help'] / medians['python -c pass']:.1f}x")


if __name__ == "__main__":
    main()
