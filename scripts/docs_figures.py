"""Figures in README.md and docs/ that come from a run, written from the run's recorded results.

A figure block in a guide is delimited by ``<!-- figures:NAME -->`` and ``<!-- /figures -->``; what
lies between is written by this script from ``docs/figures/NAME.json``, never by hand:

    python scripts/docs_figures.py run NAME [NAME ...]   # measure: run NAME's command, record it
    python scripts/docs_figures.py render                # rewrite every block from the records
    python scripts/docs_figures.py render --check        # exit 1 if a block differs (the test)

``make docs-figures`` runs every measurement, then renders. A record holds, beside the run's own
results, the commit it ran at (and whether the working tree had changes), the machine's cores and
1-minute load before and after, the wall time and the CPU time of the command and all its children
(CPU-minutes: what the work cost, whatever else the machine was doing). Every time a guide states is
rendered as CPU-minutes with the wall time and the load it was measured under.

A measurement whose record is not committed yet renders as "not yet regenerated", so that a figure
never outlives the code that produced it unmarked.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RECORDS = REPO / "docs" / "figures"
GUIDES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# A block may be indented (inside a list item): its rendered lines take the same indentation.
BLOCK = re.compile(
    r"^(?P<indent>[ ]*)(?P<open><!-- figures:(?P<name>[\w-]+) -->\n)(?P<body>.*?)^(?P=indent)<!-- /figures -->",
    re.S | re.M,
)


@dataclass(frozen=True)
class Measurement:
    """What a figure block is measured by: a command (run from the repository root under ``nice``),
    the JSON file of results it writes (None: its timing is the result), and the block's text."""

    command: tuple[str, ...]
    render: Callable[[dict[str, Any]], str]
    results: str | None = None


def _measured(record: dict[str, Any]) -> str:
    """How a record's time reads in a guide: CPU-minutes first, then wall time under which load."""
    commit = record["commit"][:10] + ("+changes" if record.get("dirty") else "")
    return (
        f"{record['cpu_s'] / 60:.1f} CPU-minutes ({record['wall_s'] / 60:.1f} min wall on {record['cores']} "
        f"cores at 1-minute load {record['load_before']:.1f}; commit {commit}, `make docs-figures`)"
    )


def render_offline_walk(record: dict[str, Any]) -> str:
    return f"The whole walk takes {_measured(record)}; `tests/test_offline_guide.py` runs it as written.\n"


def render_demo(record: dict[str, Any]) -> str:
    summary = record["results"]
    name, variant = next(iter(summary["variants"].items()))
    before, after = summary["before"]["b_capscore"], variant["after"]["b_capscore"]
    change = variant["b_capscore_change"]
    return (
        f"Measured: held-out b-CapScore {before:.1f} -> {after:.1f} ({name}), 95% CI of the change "
        f"[{change['low']:+.1f}, {change['high']:+.1f}]; {_measured(record)}.\n"
    )


def render_test_suite(record: dict[str, Any]) -> str:
    return f"Measured: {record['results']['summary']} in {_measured(record)}.\n"


def render_world_preflight(record: dict[str, Any]) -> str:
    """The pre-flight tables (docs/synthetic-world.md) as scripts/world_preflight_table.py wrote them."""
    return (
        f"{record['results']['markdown']}\nMeasured by `scripts/world_preflight_table.py` in "
        f"{_measured(record)}.\n"
    )


PYTEST = (sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider")
MEASUREMENTS: dict[str, Measurement] = {
    "offline-walk": Measurement(
        (*PYTEST, "tests/test_offline_guide.py", "-k", "runs_as_written"), render_offline_walk
    ),
    "test-suite": Measurement(
        (*PYTEST, "--junitxml", "runs/docs-figures-tests.xml"),
        render_test_suite,
        results="runs/docs-figures-tests.xml",
    ),
    "demo": Measurement(
        (sys.executable, "-m", "balcaprl.cli", "demo", "--out", "runs/docs-figures-demo"),
        render_demo,
        results="runs/docs-figures-demo/summary.json",
    ),
    "world-preflight": Measurement(
        (sys.executable, "scripts/world_preflight_table.py", "--json", "runs/world-preflight.json"),
        render_world_preflight,
        results="runs/world-preflight.json",
    ),
}


def not_regenerated(name: str) -> str:
    return (
        f"*Not yet regenerated for this version: `python scripts/docs_figures.py run {name}` (or `make "
        "docs-figures`) measures it and writes the figures here.*\n"
    )


def render(name: str, records: Path = RECORDS) -> str:
    """The text of block ``name`` from its committed record (or the not-regenerated line)."""
    if name not in MEASUREMENTS:
        raise KeyError(f"figures:{name}: no such measurement; known: {', '.join(MEASUREMENTS)}")
    path = records / f"{name}.json"
    if not path.is_file():
        return not_regenerated(name)
    return MEASUREMENTS[name].render(json.loads(path.read_text(encoding="utf-8")))


def rendered(text: str, records: Path = RECORDS) -> str:
    """``text`` with every figure block rewritten from the records."""

    def block(match: re.Match) -> str:
        indent = match.group("indent")
        lines = render(match.group("name"), records).splitlines(keepends=True)
        return (
            indent
            + match.group("open")
            + "".join(indent + line for line in lines)
            + indent
            + "<!-- /figures -->"
        )

    return BLOCK.sub(block, text)


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()


def _results(path: Path) -> dict[str, Any]:
    """A run's results: its JSON, or from a JUnit XML file the counts of a test run."""
    if path.suffix != ".xml":
        return json.loads(path.read_text(encoding="utf-8"))
    import xml.etree.ElementTree as ElementTree

    suite = ElementTree.parse(path).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    passed = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    return {**counts, "summary": f"{passed:,} tests passed, {counts['skipped']} skipped"}


def measure(name: str, records: Path = RECORDS) -> Path:
    """Run measurement ``name`` and write its record (commit, cores, load, wall and CPU time, results)."""
    spec = MEASUREMENTS[name]
    commit, dirty = _git("rev-parse", "HEAD"), bool(_git("status", "--porcelain", "--untracked-files=no"))
    load_before = os.getloadavg()[0]
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    environment = {**os.environ, "PYTHONPATH": str(REPO / "src"), "COLUMNS": "120"}
    subprocess.run(["nice", "-n", "5", *spec.command], cwd=REPO, env=environment, check=True)
    wall = time.monotonic() - start
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    record = {
        "name": name,
        "command": " ".join(spec.command[1:] if spec.command[0] == sys.executable else spec.command),
        "commit": commit,  # what ran: the tree before the command
        "dirty": dirty,
        "measured_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cores": os.cpu_count(),
        "load_before": round(load_before, 2),
        "load_after": round(os.getloadavg()[0], 2),
        "wall_s": round(wall, 1),
        "cpu_s": round(cpu, 1),
        "results": _results(REPO / spec.results) if spec.results else None,
    }
    records.mkdir(parents=True, exist_ok=True)
    path = records / f"{name}.json"
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="what", required=True)
    run = commands.add_parser("run", help="measure, then render")
    run.add_argument("names", nargs="*", help=f"measurements (default: all of {', '.join(MEASUREMENTS)})")
    check = commands.add_parser("render", help="rewrite the figure blocks from the records")
    check.add_argument("--check", action="store_true", help="exit 1 if a block differs, write nothing")
    args = parser.parse_args(argv)
    if args.what == "run":
        for name in args.names or MEASUREMENTS:
            print(f"wrote {measure(name)}")
    stale = []
    for guide in GUIDES:
        text = guide.read_text(encoding="utf-8")
        new = rendered(text)
        if new != text:
            stale.append(str(guide.relative_to(REPO)))
            if not getattr(args, "check", False):
                guide.write_text(new, encoding="utf-8")
    if getattr(args, "check", False) and stale:
        print(f"figure blocks differ from their records: {', '.join(stale)}; run `make docs-figures`")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
