"""The audit's tables (rich) and files: ``audit.json`` (everything but the per-item rows) and
``items.jsonl`` (per sampled caption, each run's rewards or failure)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from balcaprl.files import atomic_write_json_text
from balcaprl.judge.audit.compare import FLAGS, SCORES
from balcaprl.outputs import present

AUDIT_FILE, ITEMS_FILE = "audit.json", "items.jsonl"


def audit_results(folder: Path | str) -> list[str]:
    """What in ``folder`` is an earlier audit's results (``balcaprl.outputs``: a new audit is refused there)."""
    return present(Path(folder), [AUDIT_FILE, ITEMS_FILE])


def write_audit(report: dict[str, Any], out: Path | str) -> tuple[Path, Path]:
    """Write ``audit.json`` and ``items.jsonl`` into ``out`` (atomically); return both paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    summary = {k: v for k, v in report.items() if k != "per_item"}
    audit_path, items_path = out / AUDIT_FILE, out / ITEMS_FILE
    atomic_write_json_text(audit_path, json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    atomic_write_json_text(
        items_path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in report["per_item"])
    )
    return audit_path, items_path


def _f(value: Any, spec: str = ".3f") -> str:
    return "–" if value is None else format(value, spec)


def _x100(value: Any) -> str:
    """A reward or b-CapScore on the scale every command prints: x100, one decimal (audit.json keeps [0, 1])."""
    return "–" if value is None else f"{100 * value:.1f}"


def _label(c: dict[str, Any]) -> str:
    return f"{c['x']} twice" if c["kind"] == "retest" else f"{c['x']} vs {c['y']}"  # x: the mean x column


def audit_tables(report: dict[str, Any]) -> list[Any]:
    """The report as rich tables: runs, flags, errors against the reference, rewards, ranks."""
    from rich.table import Table

    tables = []
    runs = Table(title=f"judge runs ({report['items']} captions, {report['rubric']} rubric)")
    for name in (
        "run",
        "judged",
        "failures",
        "tokens in / 1k",
        "tokens out / 1k",
        "calls / 1k",
        "USD / 1k",
        "s",
    ):
        runs.add_column(name, justify="left" if name in ("run", "failures") else "right")
    for run in report["runs"]:
        per = run["per_1000"] or {}
        failures = ", ".join(f"{k} {v}" for k, v in run["failures"].items()) or "none"
        runs.add_row(f"{run['judge']} #{run['repeat']}", str(run["judged"]), failures,
                     _f(per.get("prompt_tokens"), ",.0f"), _f(per.get("completion_tokens"), ",.0f"),
                     _f(per.get("calls"), ",.0f"), _f(per.get("cost_usd"), ".3f"), _f(run["seconds"], ".1f"))  # fmt: skip
    tables.append(runs)

    agreement = [c for c in report["comparisons"] if c["kind"] != "reference"]
    if agreement:
        flags = Table(title="flag agreement over paired assertions (Cohen's kappa)")
        for name in ("comparison", "flag", "pairs", "agreement", "kappa", "unpaired x / y"):
            flags.add_column(name, justify="left" if name in ("comparison", "flag") else "right")
        for c in agreement:
            for flag in FLAGS:
                f = c["flags"][flag]
                which = "reference" if flag == "covered" else "caption"
                unpaired = f"{c['unpaired'][which]['x']} / {c['unpaired'][which]['y']}"
                flags.add_row(_label(c), flag, str(f["pairs"]), _f(f["agreement"]), _f(f["kappa"]), unpaired)
        tables.append(flags)

    against = [c for c in report["comparisons"] if c["kind"] == "reference"]
    if against:
        errors = Table(title=f"flag errors against the reference judge ({report['reference']})")
        for name in ("judge", "flag", "pairs", "error rate", "says true, is false", "says false, is true"):
            errors.add_column(name, justify="left" if name in ("judge", "flag") else "right")
        for c in against:
            for flag in FLAGS:
                e = c["errors"][flag]
                errors.add_row(c["y"], flag, str(e["pairs"]), _f(e["error_rate"]),
                               _f(e["false_true_rate"]), _f(e["false_false_rate"]))  # fmt: skip
        tables.append(errors)

    rewards = Table(title="rewards per caption (metric rule) and b-CapScore; means, diffs and noise x100")
    for name in ("comparison", "score", "Pearson", "Spearman", "mean |diff|", "noise sd", "mean x", "mean y"):
        rewards.add_column(name, justify="left" if name in ("comparison", "score") else "right")
    for c in report["comparisons"]:
        for score in SCORES:
            s = c["scores"][score]
            noise = _x100(s["noise_sd"]) if c["kind"] == "retest" else ""
            rewards.add_row(_label(c), score, _f(s["pearson"]), _f(s["spearman"]), _x100(s["mean_abs_diff"]),
                            noise, _x100(s["mean_x"]), _x100(s["mean_y"]))  # fmt: skip
    tables.append(rewards)

    ranks = Table(title="rank agreement of the captions' b-CapScores")
    for name in ("comparison", "Kendall tau-b", "same order of a pair"):
        ranks.add_column(name, justify="left" if name == "comparison" else "right")
    for c in report["comparisons"]:
        ranks.add_row(_label(c), _f(c["rank"]["kendall_tau_b"]), _f(c["rank"]["pairwise_order_agreement"]))
    tables.append(ranks)
    return tables
