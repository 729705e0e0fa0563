"""How soon ``balcaprl score`` makes its first judge call, against a bare ``python -c pass``.

A loopback judge server (a thread of this process) notes when each request arrives
(``time.monotonic``, one clock for every process on Linux). ``balcaprl score`` of 24 captions runs as
a fresh process, alternately with ``python -c pass``, several times: the figure is the time from
starting ``score`` to its first request arriving, against the time a bare interpreter takes to start
and exit. The path to the first call imports neither torch, the openai SDK, numpy (the bootstrap
after the last verdict does) nor the protocols ``score`` does not run, and typer builds the ``score``
command alone (tests/judge/test_judge_limits.py and tests/test_cli.py check both), so what is left is
the interpreter, typer, aiohttp, pydantic, Pillow and the judge client; the goal is a first call within
1 s.

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/bench_judge_startup.py [--runs N]`` (about 20 s).
Not a timed test. Results: ``benchmarks/results/judge_startup.json`` (with the machine's load);
``--write-docs`` writes them into docs/measurements.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from PIL import Image

from balcaprl.testing.judge_server import JudgeServer
from balcaprl.testing.scripted_judge import ScriptedJudge

RESULTS = Path(__file__).parent / "results" / "judge_startup.json"
REFERENCE = "A red door on the left. A black cat sits on the step."


def _workspace(root: Path, base_url: str) -> list[str]:
    """The ``score`` arguments for 24 captions of 4 images judged at ``base_url`` (no cache)."""
    images = root / "images"
    images.mkdir()
    for i in range(4):
        Image.new("RGB", (64, 64), (60 * i, 20, 20)).save(images / f"{i}.png")
    rows = [{"image": f"{i % 4}.png", "caption": f"A red door on the left, number {i}."} for i in range(24)]
    (root / "captions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "references.json").write_text(json.dumps({f"{i}.png": REFERENCE for i in range(4)}))
    judge = {"base_url": base_url, "model": "scripted", "api_key_env": None, "cache_path": None}
    (root / "judge.yaml").write_text(yaml.safe_dump(judge))
    return ["score", "--images", str(images), "--captions", str(root / "captions.jsonl"),
            "--references", str(root / "references.json"), "--judge", str(root / "judge.yaml"),
            "--no-progress"]  # fmt: skip


def _score_command() -> list[str]:
    script = Path(sys.executable).parent / "balcaprl"
    return [str(script)] if script.exists() else [sys.executable, "-m", "balcaprl.cli"]


DOCS = Path(__file__).parent.parent / "docs" / "measurements.md"
SECTION = "## The judge's first call"


def write_docs(path: Path = DOCS) -> None:
    """Rewrite the section's figures in ``path`` from the stored results."""
    r = json.loads(RESULTS.read_text())
    figures = (
        f"`balcaprl score` (24 captions, a loopback judge, no cache) makes its first judge call "
        f"{r['score_first_call_s']:.2f} s after it starts, against {r['python_pass_s']:.3f} s for a bare "
        f"`python -c pass`: {r['ratio']:.0f}x (medians of {len(r['runs']['python_pass_s'])} runs, load "
        f"average {r['load_average_1m']:.1f} on {r['cpus']} cores). Definition: {r['definition']}. The goal "
        f"is a first call within 1 s of start; "
        + ("met here." if r["score_first_call_s"] <= 1.0 else "not met here, at this load.")
        + " On the way to the first call `score` imports neither torch, the OpenAI SDK, numpy (the bootstrap "
        "after the last verdict does) nor the protocols it does not run, and typer builds the `score` command "
        "alone; what is left is the interpreter, typer, aiohttp, pydantic, Pillow and the judge client."
    )
    text = path.read_text()
    start = text.index(SECTION)
    fence = text.index("```\n\n", text.index("```bash", start) + 7) + len("```\n\n")
    end = text.index("\n## ", fence)
    path.write_text(text[:fence] + figures + "\n" + text[end:])


def main() -> None:
    if "--write-docs" in sys.argv[1:]:
        write_docs()
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="runs of each command (medians reported)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    env = {**os.environ, "COLUMNS": "100"}
    first_call: list[float] = []
    bare: list[float] = []
    with JudgeServer(ScriptedJudge()) as server, tempfile.TemporaryDirectory() as tmp:
        argv = [*_score_command(), *_workspace(Path(tmp), server.base_url)]
        for run in range(args.runs + 1):  # the first run warms the file cache and is not counted
            start = time.perf_counter()
            subprocess.run([sys.executable, "-c", "pass"], check=True)
            python = time.perf_counter() - start
            seen = len(server.counters.arrivals)
            start = time.monotonic()
            subprocess.run(
                [*argv, "--out", str(Path(tmp) / f"out{run}")], check=True, env=env, stdout=subprocess.DEVNULL
            )
            if run:
                bare.append(python)
                first_call.append(server.counters.arrivals[seen] - start)
    medians = {"score_first_call_s": statistics.median(first_call), "python_pass_s": statistics.median(bare)}
    ratio = medians["score_first_call_s"] / medians["python_pass_s"]
    load = os.getloadavg()
    print(f"first judge call of `balcaprl score`, median of {args.runs} runs (load average {load[0]:.1f})")
    print(f"  score's first call after start  {medians['score_first_call_s']:6.3f} s")
    print(f"  python -c pass                  {medians['python_pass_s']:6.3f} s")
    print(f"  ratio                           {ratio:6.1f}x   (goal: first call within 1 s)")
    record = {
        "command": " ".join(["benchmarks/bench_judge_startup.py", *sys.argv[1:]]),
        "definition": "seconds from starting `balcaprl score` to its first request arriving at the loopback "
        "judge, against the wall time of `python -c pass`; medians",
        "load_average_1m": load[0],
        "cpus": os.cpu_count(),
        **medians,
        "ratio": ratio,
        "runs": {"score_first_call_s": first_call, "python_pass_s": bare},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
