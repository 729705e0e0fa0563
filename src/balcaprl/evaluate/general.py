"""General vision benchmarks (the paper's Table 2) through lmms-eval — run, not re-implemented.

``balcaprl evaluate-general --model CKPT --out EVAL_DIR`` builds and runs

    [accelerate launch --num_processes N -m] python -m lmms_eval --model qwen2_5_vl \\
        --model_args pretrained=CKPT --tasks blink,chartqa,docvqa_val,... --batch_size 1 \\
        --output_path EVAL_DIR/lmms_eval [--log_samples]

then imports lmms-eval's results file (``<output_path>/<model>/<date>_results.json``; its
``results`` map each task to ``"<metric>,<filter>": value``) into ``EVAL_DIR/eval.json`` under
``results.general``, on the paper's 0..100 scale, where ``balcaprl report`` shows it in Table 2's form.
``--import-only FILE`` imports an existing results file (e.g. from a cluster run) without running.

lmms-eval is not a dependency of balcaprl: install it where the GPUs are (``pip install lmms-eval``,
or from its repository), together with what its tasks need. Some tasks call an LLM judge or need a
submission server (MMBench's GPT matching, for instance); see lmms-eval's documentation.
"""

from __future__ import annotations

import datetime as _dt
import json
import shlex
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from balcaprl.errors import InputError, MissingInputError, UserError
from balcaprl.files import read_utf8_text
from balcaprl.model_paths import check_model_path


@dataclass(frozen=True)
class GeneralBenchmark:
    name: str  # as Table 2 names it
    task: str  # the lmms-eval task
    metrics: tuple[str, ...]  # "<metric>,<filter>" keys to look for, first found wins
    scale: str = "fraction"  # fraction: x100; percent: as is; auto: x100 when <= 1


GENERAL_BENCHMARKS: tuple[GeneralBenchmark, ...] = (
    GeneralBenchmark("BLINK", "blink", ("blink_acc,none",)),
    GeneralBenchmark("ChartQA", "chartqa", ("relaxed_overall,none",)),
    GeneralBenchmark("DocVQA", "docvqa_val", ("anls,none",)),
    GeneralBenchmark("InfoVQA", "infovqa_val", ("anls,none",)),
    GeneralBenchmark("MMBench", "mmbench_en_dev", ("gpt_eval_score,none", "submission,none"), "auto"),
    GeneralBenchmark("MMStar", "mmstar", ("average,none",)),
    GeneralBenchmark("OCRBench", "ocrbench", ("ocrbench_accuracy,none",)),
    GeneralBenchmark("ScienceQA", "scienceqa_img", ("exact_match,none",)),
    GeneralBenchmark("SEEDBench", "seedbench", ("seed_image,none",)),
    GeneralBenchmark("TextVQA", "textvqa_val", ("exact_match,none",)),
)
_BY_NAME = {b.name.lower(): b for b in GENERAL_BENCHMARKS}
_BY_TASK = {b.task: b for b in GENERAL_BENCHMARKS}


def select(names: Sequence[str] | None) -> list[GeneralBenchmark]:
    """Benchmarks by Table 2 name or lmms-eval task name (all ten when ``names`` is empty)."""
    if not names:
        return list(GENERAL_BENCHMARKS)
    chosen = []
    for name in names:
        bench = _BY_NAME.get(name.lower()) or _BY_TASK.get(name)
        if bench is None:
            known = ", ".join(b.name for b in GENERAL_BENCHMARKS)
            raise InputError(f"--benchmarks: unknown general benchmark {name!r}; choose from {known}")
        chosen.append(bench)
    return chosen


def lmms_eval_command(
    model: str | Path,
    output_path: Path,
    *,
    benchmarks: Sequence[GeneralBenchmark] | None = None,
    model_type: str = "qwen2_5_vl",
    model_args: str | None = None,
    batch_size: int = 1,
    num_processes: int = 1,
    log_samples: bool = True,
    limit: int | None = None,
    python: str = sys.executable,
    extra: Sequence[str] = (),
) -> list[str]:
    """The lmms-eval command line (argv) for ``model`` on ``benchmarks``."""
    tasks = ",".join(b.task for b in (benchmarks or GENERAL_BENCHMARKS))
    args = f"pretrained={model}" + (f",{model_args}" if model_args else "")
    if num_processes > 1:
        argv = [
            python,
            "-m",
            "accelerate.commands.launch",
            f"--num_processes={num_processes}",
            "-m",
            "lmms_eval",
        ]
    else:
        argv = [python, "-m", "lmms_eval"]
    argv += ["--model", model_type, "--model_args", args, "--tasks", tasks, "--batch_size", str(batch_size),
             "--output_path", str(output_path)]  # fmt: skip
    if log_samples:
        argv.append("--log_samples")
    if limit is not None:
        argv += ["--limit", str(limit)]
    return argv + list(extra)


def find_results_file(output_path: Path) -> Path:
    """The newest ``*_results.json`` under lmms-eval's output path."""
    found = sorted(Path(output_path).rglob("*_results.json"), key=lambda p: (p.stat().st_mtime, p.name))
    if not found:
        raise MissingInputError(f"no lmms-eval *_results.json under {output_path}")
    return found[-1]


def _value(raw: Any, scale: str) -> float:
    value = float(raw)
    if scale == "fraction" or (scale == "auto" and value <= 1.0):
        return 100 * value
    return value


def import_lmms_eval_results(path: Path) -> dict[str, Any]:
    """``{"scores": {Table-2 name: 0..100}, "average": mean of those, "tasks": raw per-task metrics,
    "missing": names without a score, "source": path, "model": ...}`` from a results file."""
    try:
        data = json.loads(read_utf8_text(path, "lmms-eval results"))
    except json.JSONDecodeError as error:
        raise InputError(
            f"{path}: not JSON ({error.msg} at line {error.lineno}); not an lmms-eval results file"
        ) from None
    results = data.get("results") if isinstance(data, dict) else None
    if not isinstance(results, dict):
        raise InputError(f"{path}: not an lmms-eval results file (no 'results' mapping)")
    scores: dict[str, float] = {}
    used: dict[str, str] = {}
    for bench in GENERAL_BENCHMARKS:
        task = results.get(bench.task)
        if not isinstance(task, dict):
            continue
        key = next((k for k in bench.metrics if isinstance(task.get(k), int | float)), None)
        if key is not None:
            scores[bench.name] = round(_value(task[key], bench.scale), 4)
            used[bench.name] = f"{bench.task}:{key}"
    config = data.get("config") or {}
    return {
        "scores": scores,
        "average": round(sum(scores.values()) / len(scores), 4) if scores else None,
        "metrics_used": used,
        "missing": [b.name for b in GENERAL_BENCHMARKS if b.name not in scores],
        "tasks": {k: v for k, v in results.items() if isinstance(v, dict)},
        "source": str(path),
        "model": data.get("model_name") or config.get("model_args") or config.get("model"),
        "date": data.get("date"),
    }


def record_general(eval_dir: Path, imported: dict[str, Any], label: str | None = None) -> Path:
    """Add the imported scores to ``EVAL_DIR/eval.json`` (created if needed) under ``results.general``."""
    from balcaprl.evaluate.suite import _write_eval, read_eval

    eval_dir = Path(eval_dir)
    eval_dir.mkdir(parents=True, exist_ok=True)
    record = read_eval(eval_dir)
    record["label"] = label or record.get("label") or eval_dir.name
    record.setdefault("results", {})
    record["results"]["general"] = {
        **imported,
        "finished": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    }
    _write_eval(eval_dir, record)
    return eval_dir / "eval.json"


def run_lmms_eval(argv: Sequence[str], model: str | Path | None = None) -> int:
    """Run lmms-eval (output streams through); its exit status. :class:`~balcaprl.errors.UserError`
    when lmms-eval is not installed here, or when ``model`` (its ``pretrained=``; then it is loaded
    here) is a local path that does not exist."""
    try:
        import importlib.util

        if importlib.util.find_spec("lmms_eval") is None:
            raise ModuleNotFoundError
    except ModuleNotFoundError:
        raise UserError(
            "lmms-eval is not installed in this environment: `pip install lmms-eval` (or from "
            "https://github.com/EvolvingLMMs-Lab/lmms-eval) on the GPU machine, or run the printed "
            "command there and import its results with --import-only FILE"
        ) from None
    if model is not None:
        check_model_path(model, "--model")  # a mistyped local path is not sent to the hub
    return subprocess.call(list(argv))


def shell_line(argv: Sequence[str]) -> str:
    return shlex.join(argv)
