"""The paper's ablation tables in miniature, with seeds and intervals: ``balcaprl demo --variants
ablation --seeds 3 --jobs 2`` (``make ablation``).

Every variant (:mod:`balcaprl.demo.variants`) is trained ``seeds`` times (``train.seed`` = 0, 1, ...)
from the one dataset, SFT policy and "before" evaluation the demo makes (:mod:`balcaprl.demo.pipeline`
stages, reused as they are), up to ``jobs`` runs at a time in separate processes (one torch thread
each: one run per core). Each run is then evaluated on the same held-out scenes, and the report gives,
per variant:

- the mean change from the SFT start and its 95% interval over seeds and scenes
  (:func:`~balcaprl.demo.report.seed_scene_bootstrap`), for b-CapScore, precision, recall, linguistic;
- caption length, meta-commentary share (non-pointable assertions) and hallucination share
  (non-visible assertions), averaged over seeds;
- each direction the paper reports for its row (:class:`~balcaprl.demo.variants.Claim`), with the
  interval of the difference and the verdict: reproduced / not reproduced / opposite.

Written to ``OUTPUT/comparison.md`` and ``OUTPUT/comparison.csv``; every run folder is
``OUTPUT/rl/VARIANT-seedN`` and resumes or is reused like the demo's.
"""

from __future__ import annotations

import csv
import functools
import io
import json
import math
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from balcaprl.demo.config import DemoConfig
from balcaprl.demo.pipeline import (
    Evaluation,
    Log,
    ensure_dataset,
    ensure_evaluation,
    ensure_rl,
    ensure_sft,
    oracle_judge,
    quiet_library_progress_bars,
    rl_folder_name,
)
from balcaprl.demo.report import BootstrapInterval, HeldOut, direction_verdict, seed_scene_bootstrap
from balcaprl.demo.variants import Variant, get_variant
from balcaprl.errors import UserError
from balcaprl.progress import Progress

CHANGE_METRICS = (("b_capscore", 100.0), ("precision", 1.0), ("recall", 1.0), ("linguistic", 1.0))
MEAN_METRICS = ("tokens", "non_pointable_share", "non_visible_share", "fluency")


def run_name(variant: Variant, seed: int, steps: int | None) -> str:
    return f"{rl_folder_name(variant, steps)}-seed{seed}"


def _train_and_evaluate(
    config_json: dict[str, Any], variant_name: str, seed: int, steps: int | None, sft_dir: str, data_dir: str
) -> tuple[str, float]:
    """One (variant, seed) run in a worker process: train (or resume, or reuse), then evaluate.
    Returns the evaluation's name under OUTPUT/eval and the training seconds."""
    import torch

    from balcaprl.synthetic.oracle import OracleJudge

    config = DemoConfig.model_validate(config_json)
    torch.set_num_threads(config.threads)
    quiet_library_progress_bars()
    variant = get_variant(variant_name)
    root = Path(config.output_dir).expanduser()
    name = run_name(variant, seed, steps)
    overrides = [*variant.overrides, f"train.seed={seed}"]
    if steps is not None:
        overrides.append(f"train.max_steps={steps}")
    recipe = config.training_recipe(sft_dir, data_dir, root / "rl" / name, overrides)
    oracle = OracleJudge.from_dataset(data_dir)
    quiet: Log = lambda line: None  # noqa: E731  (the parent logs each run's start and end)
    final, train_s = ensure_rl(recipe, lambda: oracle_judge(config, Path(data_dir), oracle, quiet), quiet)
    silent = functools.partial(Progress, enabled=False)  # runs in parallel: one line each from the parent
    ensure_evaluation(final, Path(data_dir), config, name, name, root, quiet, oracle, silent)
    return name, train_s


NOT_RUN = "not run"  # the verdict of a direction whose baseline variant was not in the run


@dataclass(frozen=True)
class ClaimCheck:
    metric: str
    sign: int
    baseline: str
    interval: BootstrapInterval | None  # None when the baseline did not run beside the variant
    verdict: str
    basis: str = ""

    @property
    def label(self) -> str:
        return f"{self.metric} {'>' if self.sign > 0 else '<'} {self.baseline}"


@dataclass
class VariantSummary:
    variant: Variant
    seeds: int
    changes: dict[str, BootstrapInterval]  # from the SFT start, over seeds and scenes
    means: dict[str, float]  # MEAN_METRICS averaged over seeds and scenes
    claims: list[ClaimCheck]
    train_s: float
    per_seed: list[tuple[float, float]]  # each seed's (Δ b-CapScore, mean tokens), averaged over scenes


@dataclass
class AblationResult:
    root: Path
    before: dict[str, float]
    variants: list[VariantSummary]
    wall_s: float
    comparison_path: Path


def _matrix(evaluations: Sequence[Evaluation], key: str) -> list[list[float]]:
    return [
        [float(r.get(key) if r.get(key) is not None else math.nan) for r in e.records] for e in evaluations
    ]


def _minus(a: list[list[float]], b: list[list[float]], scale: float = 1.0) -> list[list[float]]:
    return [[(x - y) * scale for x, y in zip(ra, rb, strict=True)] for ra, rb in zip(a, b, strict=True)]


def _nan_free(matrix: list[list[float]]) -> list[list[float]]:
    """Scenes with a missing figure in any run are left out of that figure (e.g. fluency of a failed judgement)."""
    keep = [j for j in range(len(matrix[0])) if all(math.isfinite(row[j]) for row in matrix)]
    return [[row[j] for j in keep] for row in matrix]


def summarise(
    variant: Variant,
    runs: Sequence[Evaluation],
    before: Evaluation,
    others: Mapping[str, Sequence[Evaluation]],
    boot: dict[str, Any],
    train_s: float,
) -> VariantSummary:
    """The figures of one variant from its runs (one per seed), the SFT start and the runs of the other
    variants (``others``, by name: each claim's baseline, paired seed by seed). A claim whose baseline
    did not run is kept, with the verdict "not run", so every direction the paper states is listed."""
    start = {key: _matrix([before], key) * len(runs) for key, _ in CHANGE_METRICS}
    # per scene, a row per seed
    change = {key: _nan_free(_minus(_matrix(runs, key), start[key], scale)) for key, scale in CHANGE_METRICS}
    changes = {key: seed_scene_bootstrap(rows, **boot) for key, rows in change.items()}
    means = {}
    for key in MEAN_METRICS:
        values = [v for row in _matrix(runs, key) for v in row if math.isfinite(v)]
        means[key] = sum(values) / len(values) if values else math.nan
    claims = []
    for claim in variant.claims:
        if claim.baseline == "start":
            base = _matrix([before], claim.metric) * len(runs)
        elif others.get(claim.baseline):
            base = _matrix(others[claim.baseline][: len(runs)], claim.metric)
        else:
            claims.append(ClaimCheck(claim.metric, claim.sign, claim.baseline, None, NOT_RUN, claim.basis))
            continue
        scale = dict(CHANGE_METRICS).get(claim.metric, 1.0)
        diff = _nan_free(_minus(_matrix(runs[: len(base)], claim.metric), base, scale))
        interval = seed_scene_bootstrap(diff, **boot)
        verdict = direction_verdict(interval, claim.sign)
        claims.append(ClaimCheck(claim.metric, claim.sign, claim.baseline, interval, verdict, claim.basis))
    per_seed = [
        (sum(row) / len(row), run.held_out.mean_tokens)
        for row, run in zip(change["b_capscore"], runs, strict=True)
    ]
    return VariantSummary(variant, len(runs), changes, means, claims, train_s, per_seed)


def run_ablation(
    config: DemoConfig,
    variants: Sequence[Variant],
    *,
    seeds: int = 3,
    jobs: int = 2,
    steps: int | None = None,
    log: Log = print,
) -> AblationResult:
    """Train and evaluate every (variant, seed), ``jobs`` at a time, and write the comparison."""
    if not variants:
        raise UserError("no variant to run")
    if seeds < 1 or jobs < 1:
        raise UserError(f"--seeds and --jobs must be >= 1, got {seeds} and {jobs}")
    import torch

    from balcaprl.synthetic.oracle import OracleJudge

    start_clock = time.perf_counter()
    torch.set_num_threads(config.threads)
    root = Path(config.output_dir).expanduser()
    root.mkdir(parents=True, exist_ok=True)
    (root / "demo_config.yaml").write_text(config.to_yaml(), encoding="utf-8")
    data_dir = ensure_dataset(config, root, log)
    sft_dir = ensure_sft(config, data_dir, root, log)
    oracle = OracleJudge.from_dataset(data_dir)
    before = ensure_evaluation(sft_dir, data_dir, config, "sft", "SFT", root, log, oracle)

    work = [(v, s) for s in range(seeds) for v in variants]  # seed-major: every variant gets seed 0 first
    config_json = config.model_dump(mode="json")
    train_s: dict[tuple[str, int], float] = {}
    # Runs evaluated by an earlier invocation are reused in seconds: the time left counts the others.
    before_now = {(v.name, s) for v, s in work if (root / "eval" / f"{run_name(v, s, steps)}.json").is_file()}
    reused = f"; {len(before_now)} finished before, reused" if before_now else ""
    log(f"ablation: {len(work)} runs ({len(variants)} variants x {seeds} seeds), {jobs} at a time{reused}")
    paths = (str(sft_dir.resolve()), str(data_dir.resolve()))
    runs_clock, to_run = time.perf_counter(), len(work) - len(before_now)

    def finished(done: int, key: tuple[str, int], name: str, seconds: float) -> None:
        train_s[key] = seconds
        ran = len(train_s.keys() - before_now)
        left = time_left(time.perf_counter() - runs_clock, ran, to_run - ran)
        log(f"ablation: {name} done ({done}/{len(work)}, trained in {seconds:.0f} s{left})")

    if jobs == 1:  # one at a time, in this process (no worker start-up to pay)
        for done, (v, s) in enumerate(work, start=1):
            finished(done, (v.name, s), *_train_and_evaluate(config_json, v.name, s, steps, *paths))
    else:
        # spawn, not fork: a forked torch (with its thread pools) and a running event loop do not mix
        with ProcessPoolExecutor(max_workers=min(jobs, len(work)), mp_context=get_context("spawn")) as pool:
            futures = {
                pool.submit(_train_and_evaluate, config_json, v.name, s, steps, *paths): (v.name, s)
                for v, s in work
            }
            for done, future in enumerate(as_completed(futures), start=1):
                finished(done, futures[future], *future.result())

    wall = time.perf_counter() - start_clock
    return write_comparison(config, variants, seeds, steps, before, train_s, wall)


def time_left(elapsed_s: float, ran: int, left: int) -> str:
    """``"; about N min left"`` after ``ran`` runs trained in ``elapsed_s`` of wall time (several at a
    time: their wall time per run already counts the parallelism), ``left`` still to train; empty
    when nothing is left or nothing has run yet to tell."""
    if ran <= 0 or left <= 0:
        return ""
    return f"; about {math.ceil(elapsed_s / ran * left / 60)} min left"


def write_comparison(
    config: DemoConfig,
    variants: Sequence[Variant],
    seeds: int,
    steps: int | None,
    before: Evaluation,
    train_s: Mapping[tuple[str, int], float],
    wall_s: float,
) -> AblationResult:
    """Summarise the evaluations of seeds 0..``seeds``-1 of every variant in the run folder and write
    ``comparison.md`` / ``.csv``. Also for a run stopped early: :func:`finished_seeds` says how many
    seeds every variant has."""
    root = Path(config.output_dir).expanduser()

    def evaluation(v: Variant, s: int) -> Evaluation:
        stored = json.loads((root / "eval" / f"{run_name(v, s, steps)}.json").read_text(encoding="utf-8"))
        return Evaluation(HeldOut(**stored["held_out"]), stored["records"])

    runs = {v.name: [evaluation(v, s) for s in range(seeds)] for v in variants}
    e = config.evaluation
    boot = {"samples": e.bootstrap_samples, "level": e.level, "seed": e.seed}
    summaries = [
        summarise(
            v, runs[v.name], before, runs, boot, sum(train_s.get((v.name, s), 0.0) for s in range(seeds))
        )
        for v in variants
    ]
    before_means = {key: getattr(before.held_out, attr) for key, attr in _HELD_OUT_KEYS}
    path = root / "comparison.md"
    path.write_text(ablation_markdown(before_means, summaries, seeds, e.level, wall_s), encoding="utf-8")
    (root / "comparison.csv").write_text(ablation_csv(summaries), encoding="utf-8")
    return AblationResult(root, before_means, summaries, wall_s, path)


def finished_seeds(root: Path, variants: Sequence[Variant], steps: int | None) -> int:
    """How many seeds (0, 1, ...) every variant has an evaluation for in ``root``."""
    seeds = 0
    while all((root / "eval" / f"{run_name(v, seeds, steps)}.json").is_file() for v in variants):
        seeds += 1
    return seeds


_HELD_OUT_KEYS = (
    ("b_capscore", "b_capscore"),
    ("precision", "precision"),
    ("recall", "recall"),
    ("linguistic", "linguistic"),
    ("tokens", "mean_tokens"),
    ("non_pointable_share", "non_pointable_share"),
    ("non_visible_share", "non_visible_share"),
    ("fluency", "fluency"),
)


def _ci(i: BootstrapInterval, spec: str) -> str:
    return f"{i.delta:+{spec}} [{i.low:+{spec}}, {i.high:+{spec}}]"


def ablation_markdown(
    before: dict[str, float], summaries: Sequence[VariantSummary], seeds: int, level: float, wall_s: float
) -> str:
    pct = f"{level:.0%}"
    lines = [
        "| variant | paper row | Δ b-CapScore ["
        + pct
        + "] | Δ P | Δ R | Δ L | tokens | meta | halluc. | fluency |",
        "| --- | --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: |",
        f"| SFT start (absolute) | | {before['b_capscore']:.1f} | {before['precision']:.3f} | {before['recall']:.3f} "
        f"| {before['linguistic']:.3f} | {before['tokens']:.1f} | {before['non_pointable_share']:.3f} "
        f"| {before['non_visible_share']:.3f} | {before['fluency']:.2f} |",
    ]
    for s in summaries:
        c, m = s.changes, s.means
        lines.append(
            f"| {s.variant.name} | {s.variant.paper_row} | {_ci(c['b_capscore'], '.1f')} | {_ci(c['precision'], '.3f')} "
            f"| {_ci(c['recall'], '.3f')} | {_ci(c['linguistic'], '.3f')} | {m['tokens']:.1f} "
            f"| {m['non_pointable_share']:.3f} | {m['non_visible_share']:.3f} | {m['fluency']:.2f} |"
        )
    lines += ["", "Against the paper's directions (difference from the baseline, " + pct + " interval):", ""]
    lines += ["| variant | paper's direction | where the paper says it | difference | verdict |"]
    lines += ["| --- | --- | --- | --- | --- |"]
    for s in summaries:
        for claim in s.claims:
            difference = _ci(claim.interval, ".3f") if claim.interval is not None else ""
            lines.append(
                f"| {s.variant.name} | {claim.label} | {claim.basis} | {difference} | {claim.verdict} |"
            )
    lines += ["", direction_count([c for s in summaries for c in s.claims])]
    # Each seed apart: an interval over seeds and scenes hides whether runs agree or fall into modes.
    lines += ["", "Per seed, Δ b-CapScore from the SFT start (mean caption tokens):", ""]
    lines += ["| variant | " + " | ".join(f"seed {i}" for i in range(seeds)) + " |"]
    lines += ["| --- |" + " ---: |" * seeds]
    for s in summaries:
        cells = [f"{delta:+.1f} ({tokens:.1f})" for delta, tokens in s.per_seed]
        lines.append(f"| {s.variant.name} | " + " | ".join(cells + [""] * (seeds - len(cells))) + " |")
    lines += [
        "",
        f"Changes are after RL minus the SFT start, per held-out scene, averaged over {seeds} seed(s) and the "
        f"scenes; intervals resample seeds and scenes."
        + (
            f" Wall time {wall_s / 60:.1f} min."
            if math.isfinite(wall_s)
            else " Summarised from the finished runs."
        ),
        "",
    ]
    return "\n".join(lines)


def direction_count(claims: Sequence[ClaimCheck]) -> str:
    """ "k of N": the directions reproduced among all those the paper states for the rows run."""
    counts = Counter(c.verdict for c in claims)
    ran = len(claims) - counts[NOT_RUN]
    line = (
        f"Directions reproduced: **{counts['reproduced']} of {len(claims)}** stated for these rows "
        f"({counts['opposite']} opposite, {counts['not reproduced']} not reproduced"
    )
    return line + (
        f", {counts[NOT_RUN]} not run: their baseline was not in the run)." if ran < len(claims) else ")."
    )


def ablation_csv(summaries: Sequence[VariantSummary]) -> str:
    fields = ["variant", "paper_row", "seeds"]
    for key, _ in CHANGE_METRICS:
        fields += [f"{key}_change", f"{key}_low", f"{key}_high"]
    fields += list(MEAN_METRICS) + ["claims", "train_s"]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    for s in summaries:
        row: dict[str, Any] = {"variant": s.variant.name, "paper_row": s.variant.paper_row, "seeds": s.seeds}
        for key, _ in CHANGE_METRICS:
            i = s.changes[key]
            row.update({f"{key}_change": i.delta, f"{key}_low": i.low, f"{key}_high": i.high})
        row.update({k: ("" if not math.isfinite(s.means[k]) else s.means[k]) for k in MEAN_METRICS})
        row["claims"] = "; ".join(f"{c.label}: {c.verdict}" for c in s.claims)
        row["train_s"] = round(s.train_s, 1)
        writer.writerow(row)
    return buffer.getvalue()


def comparison_so_far(
    config: DemoConfig, variants: Sequence[Variant], steps: int | None = None
) -> AblationResult:
    """The comparison of a run folder whose ablation stopped early (a time limit, a crash): every seed
    that each variant finished, written as the finished run writes it. Raises when no seed is complete."""
    root = Path(config.output_dir).expanduser()
    seeds = finished_seeds(root, variants, steps)
    if seeds == 0:
        raise UserError(
            f"{root}: no seed has finished for every one of {', '.join(v.name for v in variants)}"
        )
    stored = json.loads((root / "eval" / "sft.json").read_text(encoding="utf-8"))
    before = Evaluation(HeldOut(**stored["held_out"]), stored["records"])
    return write_comparison(config, variants, seeds, steps, before, {}, math.nan)
