"""``balcaprl demo``: the offline main job. Thin: parse arguments, run the pipeline, print."""

from __future__ import annotations

import time
from pathlib import Path

import typer

from balcaprl.demo.variants import VARIANTS
from balcaprl.errors import UserError


def demo(
    variant: str | None = typer.Option(
        None, "--variant", help=f"One variant: {' | '.join(VARIANTS)} (default: full)."
    ),
    variants: str | None = typer.Option(
        None,
        "--variants",
        help="Several variants, comma-separated, or a set: all (= ablation), table3, table4, tau "
        "(Table 4's tau grid), weights (one shared dataset and SFT policy).",
    ),
    seeds: int = typer.Option(
        1,
        "--seeds",
        min=1,
        help="RL seeds per variant; above 1 the comparison gives intervals over seeds and scenes and the "
        "paper's direction per row (make ablation: 3).",
    ),
    jobs: int = typer.Option(
        1, "--jobs", min=1, help="With --seeds: runs trained at a time, one process each (up to the cores)."
    ),
    steps: int | None = typer.Option(
        None, "--steps", min=1, help="RL steps per variant instead of the recipe's (quick sweeps)."
    ),
    out: Path | None = typer.Option(
        None, "--out", help="Run folder (default: the config's output_dir, runs/demo)."
    ),
    config: Path | None = typer.Option(
        None,
        "--config",
        help="Demo config YAML (default: the built-in one, spelled out in configs/demo.yaml).",
    ),
    judge: str | None = typer.Option(
        None, "--judge", help="http (the real judge client against a local oracle server) | in-process."
    ),
    set_: list[str] = typer.Option(
        [], "--set", help="Override a config value, e.g. --set recipe.train.learning_rate=1e-4 (repeatable)."
    ),
) -> None:
    """The whole method offline on a CPU: a synthetic world, c-GDPO against its oracle judge.

    Builds a synthetic world, warm-starts a tiny captioner, trains it with c-GDPO against the oracle
    judge, and compares held-out oracle scores before and after RL.
    """
    import functools
    import sys

    from balcaprl.demo.config import load_demo_config
    from balcaprl.demo.pipeline import quiet_library_progress_bars, run_demo
    from balcaprl.demo.report import comparison_rows, rich_before_after_table, rich_comparison_table
    from balcaprl.demo.variants import parse_variants
    from balcaprl.progress import Progress, make_console

    if variant is not None and variants is not None:
        raise UserError("give --variant or --variants, not both")
    chosen = parse_variants(variants or variant or "full")  # ConfigError names the choices
    overrides = list(set_)
    if out is not None:
        overrides.append(f"output_dir={out}")
    if judge is not None:
        overrides.append(f"judge.transport={judge}")
    settings = load_demo_config(config, overrides)

    console = make_console()  # off a terminal: no 80-column wrapping of log lines and tables
    quiet_library_progress_bars()
    start = time.perf_counter()

    def log(message: str) -> None:
        # soft_wrap: a log file gets whole lines, not lines cut at 80 columns
        console.print(
            f"[dim]{time.perf_counter() - start:6.0f}s[/dim]  {message}", highlight=False, soft_wrap=True
        )

    if seeds > 1 or jobs > 1:  # the ablation runner: every variant x seed, in parallel processes
        from balcaprl.demo.ablation import run_ablation

        ablation = run_ablation(settings, chosen, seeds=seeds, jobs=jobs, steps=steps, log=log)
        console.print(ablation.comparison_path.read_text(encoding="utf-8"), highlight=False, soft_wrap=True)
        console.print(f"comparison: {ablation.comparison_path} (+ .csv); run folder: {ablation.root}")
        return

    # The long stages report on stdout with the demo's log lines: a bar on a terminal, a line every
    # 30 s (steps, rate, ETA) in a log file.
    progress = functools.partial(Progress, stream=sys.stdout)
    result = run_demo(settings, chosen, steps=steps, log=log, progress=progress)
    wall = time.perf_counter() - start

    if len(result.variants) == 1:
        r = result.variants[0]
        _print_samples(console, result, n=2)
        title = f"balcaprl demo — {r.variant.name}: held-out oracle scores, {r.after.held_out.n} scenes"
        console.print(rich_before_after_table(result.before.held_out, r.after.held_out, r.ci, title))
    else:
        rows = comparison_rows(
            result.before.held_out,
            [(r.variant.name, r.after.held_out, r.ci, r.steps) for r in result.variants],
        )
        title = f"balcaprl demo — variants: held-out oracle scores, {result.before.held_out.n} scenes"
        console.print(rich_comparison_table(rows, title))
    for r in result.variants:
        verdict = "[green]rises[/green]" if r.balanced_rise else "[yellow]does not rise in balance[/yellow]"
        console.print(
            f"{r.variant.name}: b-CapScore {verdict} "
            f"({r.ci.delta:+.1f}, {r.ci.level:.0%} CI [{r.ci.low:+.1f}, {r.ci.high:+.1f}]; "
            + ", ".join(f"{k} {ci.delta:+.3f}" for k, ci in r.reward_cis.items())
            + ")",
            soft_wrap=True,
        )
    # What this run wrote, only: a stale file of an earlier run is never announced.
    console.print(f"report: {result.report_dir}  ({', '.join(result.written)})", soft_wrap=True)
    curves = ", ".join(str(r.run_dir / "training_curves.png") for r in result.variants)
    console.print(f"RL runs: {result.root / 'rl'}  (training curves: {curves})", soft_wrap=True)
    stages = ", ".join(
        f"{k} {v:.0f}/{result.cpu_timings.get(k, 0.0):.0f}s" for k, v in result.timings.items()
    )
    console.print(
        f"wall time: {wall / 60:.1f} min, CPU time: {time.process_time() / 60:.1f} min "
        f"(per stage, wall/CPU: {stages})",
        soft_wrap=True,
    )


def _print_samples(console, result, n: int) -> None:
    """The first ``n`` held-out captions before and after RL (samples.md has more)."""
    from balcaprl.data.format import read_split_rows

    rows = read_split_rows(result.root / "data", "eval")[:n]
    after = result.variants[0].after.records
    for i, row in enumerate(rows):
        console.print(
            f"[bold]{row['id']}[/bold]  reference: {row['reference']}", highlight=False, soft_wrap=True
        )
        for label, record in (("before", result.before.records[i]), ("after ", after[i])):
            console.print(
                f"  {label} (b-CapScore {100 * record['b_capscore']:4.1f}): {record['caption']}",
                highlight=False,
                soft_wrap=True,
            )
