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

A repeat (``demo-clone``) runs another measurement's command again in a fresh ``git clone`` of the
commit that measurement's record names, in a scratch folder, and its block states its figures beside
the first run's with the difference: the spread a reader can expect from a clone of their own.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
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


@dataclasses.dataclass(frozen=True)
class Measurement:
    """What a figure block is measured by: a command (run from the repository root under ``nice``),
    the JSON file of results it writes (None: its timing is the result), and the block's text.
    ``repeats``: the measurement this one runs again, in a fresh clone of its record's commit; its
    ``render`` then gets that record too (None while there is none). A command that fails stops the
    measurement unless ``failure_is_a_result`` (the test suite: its record names what failed)."""

    command: tuple[str, ...]
    render: Callable[..., str]
    results: str | None = None
    repeats: str | None = None
    failure_is_a_result: bool = False  # a test run's failures are what it measures: recorded, not raised


def _measured(record: dict[str, Any]) -> str:
    """How a record's time reads in a guide: CPU-minutes first, then wall time under which load (at the
    run's start and end: other work may start or stop meanwhile)."""
    commit = record["commit"][:10] + ("+changes" if record.get("dirty") else "")
    return (
        f"{record['cpu_s'] / 60:.1f} CPU-minutes ({record['wall_s'] / 60:.1f} min wall on {record['cores']} "
        f"cores, 1-minute load {record['load_before']:.1f} at the start and {record['load_after']:.1f} at the end; "
        f"commit {commit}, `make docs-figures`)"
    )


def render_offline_walk(record: dict[str, Any]) -> str:
    return f"The whole walk takes {_measured(record)}; `tests/test_offline_guide.py` runs it as written.\n"


def _demo_figures(record: dict[str, Any]) -> tuple[str, float, float, dict[str, float]]:
    """A demo record's variant, held-out b-CapScore before and after RL, and the change's interval."""
    summary = record["results"]
    name, variant = next(iter(summary["variants"].items()))
    return name, summary["before"]["b_capscore"], variant["after"]["b_capscore"], variant["b_capscore_change"]


def render_demo(record: dict[str, Any]) -> str:
    name, before, after, change = _demo_figures(record)
    return (
        f"Measured: held-out b-CapScore {before:.1f} -> {after:.1f} ({name}), 95% CI of the change "
        f"[{change['low']:+.1f}, {change['high']:+.1f}]; {_measured(record)}.\n"
    )


def render_demo_clone(record: dict[str, Any], first: dict[str, Any] | None) -> str:
    """The repeat's figures, and how far they are from the first run's (which must be the same commit)."""
    name, before, after, change = _demo_figures(record)
    text = (
        f"A second fresh clone of commit {record['commit'][:10]} printed {before:.1f} -> {after:.1f} ({name}), "
        f"[{change['low']:+.1f}, {change['high']:+.1f}]"
    )
    if first is None or first["commit"] != record["commit"]:
        return (
            text
            + f"; not the commit of the run above, so not compared (run `demo-clone` again); {_measured(record)}.\n"
        )
    _, first_before, first_after, first_change = _demo_figures(first)
    differences = (before - first_before, after - first_after, change["delta"] - first_change["delta"])
    spread = "before {:+.2f}, after {:+.2f}, change {:+.2f}".format(*differences)
    same = "the same figures" if not any(differences) else "differences from the run above"
    return text + f": {same} ({spread}); {_measured(record)}.\n"


def render_audit_flips(record: dict[str, Any]) -> str:
    """docs/inspect.md's table: the exact oracle against the oracle with flipped flags, by flip rate."""
    table, flags = record["results"], ("pointable", "visible", "covered")
    first = table["rows"][0]
    lines = [
        f"On {first['items']:,} captions of {table['images']} synthetic images (good captions and every flaw kind: "
        "hallucinations, meta-commentary, too short, repetitions, lists, run-ons; "
        f"{first['caption_pairs']:,} caption and {first['reference_pairs']:,} reference assertion pairs), the "
        f"exact oracle against the oracle with flipped flags (`scripts/audit_flip_table.py`; {_measured(record)}):",
        "",
        "| flip rate | "
        + " | ".join(f"error {f}" for f in flags)
        + " | "
        + " | ".join(f"kappa {f}" for f in flags)
        + " | Kendall tau-b of b-CapScores |",
        "|---:" * 8 + "|",
    ]
    for row in table["rows"]:
        cells = [f"{row['flip_rate']:.2f}", *(f"{row['error'][f]:.3f}" for f in flags),
                 *(f"{row['kappa'][f]:.3f}" for f in flags), f"{row['kendall_tau_b']:.3f}"]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def render_synthetic_sft(record: dict[str, Any]) -> str:
    """docs/synthetic-world.md's commands: what the default SFT costs and what its policy scores."""
    held_out = record["results"]["held_out"]
    after, references = held_out["after"], held_out["references"]
    return (
        f"Measured: `synthetic build` and `synthetic sft` as above ({record['results']['steps']:,} steps) take "
        f"{_measured(record)}; the saved policy scores held-out b-CapScore {after['b_capscore']:.1f} (precision "
        f"{after['precision']:.2f}, recall {after['recall']:.2f}, linguistic {after['linguistic']:.2f}, "
        f"{after['mean_tokens']:.0f} tokens) on {after['n']} scenes, the references {references['b_capscore']:.1f}.\n"
    )


def render_test_suite(record: dict[str, Any]) -> str:
    return f"Measured: {record['results']['summary']} in {_measured(record)}.\n"


def render_world_preflight(record: dict[str, Any]) -> str:
    """The pre-flight tables (docs/synthetic-world.md) as scripts/world_preflight_table.py wrote them."""
    return (
        f"{record['results']['markdown']}\nMeasured by `scripts/world_preflight_table.py` in "
        f"{_measured(record)}.\n"
    )


def render_hedging_replay(record: dict[str, Any]) -> str:
    """docs/measurements.md's replay of hedging rules on the judge-stage benchmark's draws."""
    r = record["results"]
    return (
        f"{r['markdown']}\n{r['steps']} steps of the stage benchmark's paper size; a rule's duplicates at most "
        f"{r['share']:.0%} of each process's calls, none before the {r['floor_s']:.0f} s floor; the model's 98th "
        f"percentile of the time to first byte is {r['quantile_s']:.1f} s. Measured by `benchmarks/replay_hedging.py` "
        f"in {_measured(record)}.\n"
    )


PYTEST = (sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider")
DEMO = Measurement(
    (sys.executable, "-m", "balcaprl.cli", "demo", "--out", "runs/docs-figures-demo"),
    render_demo,
    results="runs/docs-figures-demo/summary.json",
)
MEASUREMENTS: dict[str, Measurement] = {
    "offline-walk": Measurement(
        (*PYTEST, "tests/test_offline_guide.py", "-k", "runs_as_written"), render_offline_walk
    ),
    "test-suite": Measurement(
        (*PYTEST, "--junitxml", "runs/docs-figures-tests.xml"),
        render_test_suite,
        results="runs/docs-figures-tests.xml",
        failure_is_a_result=True,
    ),
    "demo": DEMO,
    "audit-flips": Measurement(
        (sys.executable, "scripts/audit_flip_table.py", "--out", "runs/docs-figures-audit.json"),
        render_audit_flips,
        results="runs/docs-figures-audit.json",
    ),
    "synthetic-sft": Measurement(  # docs/synthetic-world.md's first two commands, into runs/
        (
            "sh",
            "-c",
            'set -e; "$0" -m balcaprl.cli synthetic build --world demo --out runs/docs-figures-shapes --n-train 2000 '
            '--n-eval 200 --seed 0 --overwrite; "$0" -m balcaprl.cli synthetic sft --data runs/docs-figures-shapes '
            "--out runs/docs-figures-sft --overwrite",
            sys.executable,
        ),  # fmt: skip
        render_synthetic_sft,
        results="runs/docs-figures-sft/sft_result.json",
    ),
    "demo-clone": dataclasses.replace(DEMO, render=render_demo_clone, repeats="demo"),
    "hedging-replay": Measurement(
        (sys.executable, "benchmarks/replay_hedging.py", "--json", "runs/hedging-replay.json"),
        render_hedging_replay,
        results="runs/hedging-replay.json",
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
    spec, record = MEASUREMENTS[name], _record(name, records)
    if record is None:
        return not_regenerated(name)
    if spec.repeats:
        return spec.render(record, _record(spec.repeats, records))
    return spec.render(record)


def _record(name: str, records: Path) -> dict[str, Any] | None:
    path = records / f"{name}.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


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


def _git(*args: str, cwd: Path = REPO) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


def _results(path: Path) -> dict[str, Any]:
    """A run's results: its JSON, or from a JUnit XML file the counts of a test run."""
    if path.suffix != ".xml":
        return json.loads(path.read_text(encoding="utf-8"))
    import xml.etree.ElementTree as ElementTree

    suite = ElementTree.parse(path).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    passed = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    failed = [
        f"{case.get('classname')}::{case.get('name')}"
        for case in suite.iter("testcase")
        if case.find("failure") is not None or case.find("error") is not None
    ]
    summary = f"{passed:,} tests passed, {counts['skipped']} skipped"
    if failed:
        summary += f", {len(failed)} failed ({', '.join(failed)})"
    return {**counts, "failed": failed, "summary": summary}


def measure(name: str, records: Path = RECORDS) -> Path:
    """Run measurement ``name`` and write its record (commit, cores, load, wall and CPU time, results)."""
    spec = MEASUREMENTS[name]
    if spec.repeats:
        first = _record(spec.repeats, records)
        if first is None:
            raise SystemExit(f"{name} repeats {spec.repeats}, which has no record yet: run it first")
        with tempfile.TemporaryDirectory(prefix=f"balcaprl-{name}-") as scratch:
            clone = Path(scratch) / "balcaprl"
            _git("clone", "--quiet", "--no-checkout", str(REPO), str(clone))
            _git("checkout", "--quiet", first["commit"], cwd=clone)
            return _write(records, _run(name, spec, clone))
    return _write(records, _run(name, spec, REPO))


def _run(name: str, spec: Measurement, tree: Path) -> dict[str, Any]:
    """Run ``spec``'s command in ``tree`` (this checkout, or a clone) and return its record."""
    commit = _git("rev-parse", "HEAD", cwd=tree)
    dirty = bool(_git("status", "--porcelain", "--untracked-files=no", cwd=tree))
    load_before = os.getloadavg()[0]
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    environment = {**os.environ, "PYTHONPATH": str(tree / "src"), "COLUMNS": "120"}
    status = subprocess.run(["nice", "-n", "5", *spec.command], cwd=tree, env=environment).returncode
    if status and not spec.failure_is_a_result:
        raise SystemExit(f"{name}: `{' '.join(spec.command)}` exited with status {status}; nothing recorded")
    wall = time.monotonic() - start
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    return {
        "name": name,
        "command": " ".join("python" if word == sys.executable else word for word in spec.command),
        "commit": commit,  # what ran: the tree before the command
        "dirty": dirty,
        "measured_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cores": os.cpu_count(),
        "load_before": round(load_before, 2),
        "load_after": round(os.getloadavg()[0], 2),
        "wall_s": round(wall, 1),
        "cpu_s": round(cpu, 1),
        "exit_status": status,
        "fresh_clone": tree != REPO,
        "results": _results(tree / spec.results) if spec.results else None,
    }


def _write(records: Path, record: dict[str, Any]) -> Path:
    name = record["name"]
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
