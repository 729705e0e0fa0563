#!/usr/bin/env python3
"""The flip-rate table of docs/inspect.md ("An offline demonstration: a judge of known error"): the
guide's walk, run at each flip rate, and the figures of each audit written as one JSON file.

    PYTHONPATH=src python scripts/audit_flip_table.py --out runs/docs-figures-audit.json

As the guide shows it: `balcaprl synthetic build --out DATA --n-train 100 --n-eval 1`, ten captions
per image (good ones and every flaw kind), then for each rate `balcaprl judge serve --oracle DATA
--flip-rate RATE` in a process of its own, a judge config pointing at it, and `balcaprl judge audit
--data DATA --captions captions.jsonl --judge flipped.yaml --sample 1000`. A row of the table is the
audit's comparison of the flipped judge with the reference (the exact oracle): each flag's error rate
and kappa, and the Kendall tau-b of the two judges' b-CapScores. Everything but the JSON is written
in a scratch folder and removed. ``scripts/docs_figures.py`` runs this as the ``audit-flips``
measurement and renders the table from its record.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from balcaprl.testing.caption_fixture import CAPTION_KINDS, synthetic_captions, write_caption_jsonl

RATES = (0.0, 0.05, 0.1, 0.2, 0.3)
FLAGS = ("pointable", "visible", "covered")
BALCAPRL = (sys.executable, "-m", "balcaprl.cli")


def audit_at(rate: float, data: Path, captions: Path, work: Path) -> dict:
    """The guide's serve-and-audit steps at ``rate``; returns the audit's audit.json."""
    serve = [*BALCAPRL, "judge", "serve", "--oracle", str(data), "--flip-rate", str(rate), "--port", "0"]
    server = subprocess.Popen(serve, stdout=subprocess.PIPE, text=True)
    try:
        announced = server.stdout.readline()  # "balcaprl judge server: http://127.0.0.1:PORT/v1"
        if not announced.startswith("balcaprl judge server: "):
            raise SystemExit(f"the oracle server did not start: {announced!r}")
        config = work / f"flipped-{rate}.yaml"
        config.write_text(
            f"base_url: {announced.split(': ', 1)[1].strip()}\nmodel: oracle\napi_key_env: null\n"
        )
        out = work / f"audit-{rate}"
        audit = ["judge", "audit", "--data", str(data), "--captions", str(captions), "--judge", str(config)]
        subprocess.run([*BALCAPRL, *audit, "--sample", "1000", "--out", str(out)], check=True)
    finally:
        server.terminate()
        server.wait(timeout=30)
        server.stdout.close()
    return json.loads((out / "audit.json").read_text(encoding="utf-8"))


def table_row(rate: float, audit: dict) -> dict:
    against = next(c for c in audit["comparisons"] if c["kind"] == "reference")
    return {
        "flip_rate": rate,
        "items": against["both_judged"],
        "caption_pairs": against["errors"]["pointable"]["pairs"],
        "reference_pairs": against["errors"]["covered"]["pairs"],
        "error": {flag: against["errors"][flag]["error_rate"] for flag in FLAGS},
        "kappa": {flag: against["flags"][flag]["kappa"] for flag in FLAGS},
        "kendall_tau_b": against["rank"]["kendall_tau_b"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the JSON file of the table")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="balcaprl-audit-flips-") as scratch:
        work = Path(scratch)
        data = work / "audit-data"
        build = ["synthetic", "build", "--out", str(data), "--n-train", "100", "--n-eval", "1"]
        subprocess.run([*BALCAPRL, *build], check=True)
        kinds = (*CAPTION_KINDS, "good", "hallucination", "meta")  # the guide's caption file
        captions = write_caption_jsonl(synthetic_captions(data, kinds), work / "captions.jsonl")
        images = len(
            {json.loads(line)["image"] for line in captions.read_text(encoding="utf-8").splitlines()}
        )
        rows = [table_row(rate, audit_at(rate, data, captions, work)) for rate in RATES]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"images": images, "rows": rows}, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
