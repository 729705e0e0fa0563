"""Judge commands (`balcaprl score`, `balcaprl serve-judge`), registered on the main app.

Thin on purpose: arguments in, one call into the judge modules, a printed result out.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer


def _fail(message: str) -> None:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code=2)


def score(
    images: Path = typer.Option(
        ..., "--images", help="Folder the caption files' image names are relative to."
    ),
    captions: Path = typer.Option(
        ..., "--captions", help='JSONL {"image", "caption"} lines, or a JSON {image: caption}.'
    ),
    references: Path = typer.Option(
        ..., "--references", help="Same formats; the reference caption per image."
    ),
    judge: Path = typer.Option(..., "--judge", help="Judge config YAML (base_url, model, api_key_env, ...)."),
    out: Path = typer.Option(..., "--out", help="Folder for scores.jsonl and summary.json."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Do not read or write the verdict cache."),
    cache: Path | None = typer.Option(None, "--cache", help="Verdict cache file (overrides cache_path)."),
    resamples: int = typer.Option(
        1000, "--bootstrap-resamples", min=100, help="Bootstrap resamples for the CIs."
    ),
    seed: int = typer.Option(0, "--seed", help="Bootstrap seed."),
) -> None:
    """b-CapScore (x100) with precision, recall and linguistic quality, judged with the evaluation rubric.

    Re-running resumes: verdicts already in the cache are not judged again.
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
    from rich.table import Table

    from balcaprl.judge.client import build_judge
    from balcaprl.judge.config import JudgeConfigError
    from balcaprl.judge.score import CaptionFileError, score_captions

    if not images.is_dir():
        _fail(f"--images {images} is not a folder")
    try:
        judge_client = build_judge(judge, image_root=images, no_cache=no_cache, cache_path=cache)
    except (JudgeConfigError, OSError) as error:
        _fail(str(error))
    console = Console(stderr=True)
    columns = (TextColumn("judging"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("judging", total=None)
        try:
            run = score_captions(
                judge_client, captions, references, out, resamples=resamples, seed=seed,
                on_start=lambda n: progress.update(task, total=n),
                on_outcome=lambda i, o: progress.advance(task),
            )  # fmt: skip
        except (CaptionFileError, JudgeConfigError) as error:
            _fail(str(error))
    summary = run.summary
    table = Table(title=f"b-CapScore — {summary['n_scored']}/{summary['n_captions']} captions scored")
    for column in ("metric", "mean", "95% CI"):
        table.add_column(column)
    for name, figures in summary["metrics"].items():
        if figures is None:
            table.add_row(name, "-", "-")
        else:
            table.add_row(
                name, f"{figures['mean']:.3f}", f"[{figures['ci95_low']:.3f}, {figures['ci95_high']:.3f}]"
            )
    Console().print(table)
    if summary["failures"]:
        typer.echo(f"failures (left out of the means): {json.dumps(summary['failures'])}")
    typer.echo(f"wrote {run.scores_path}\nwrote {run.summary_path}")


def serve_judge(
    host: str = typer.Option("127.0.0.1", "--host", help="Interface to bind; keep the loopback default."),
    port: int = typer.Option(0, "--port", min=0, max=65535, help="Port; 0 picks a free one (printed)."),
    oracle: Path | None = typer.Option(
        None,
        "--oracle",
        help="Serve the synthetic oracle judge of this dataset folder instead of the scripted judge.",
    ),
    latency: float = typer.Option(0.0, "--latency", min=0.0, help="Scripted judge: seconds per answer."),
    faults: Path | None = typer.Option(None, "--faults", help="Scripted faults, a JSON FaultScript file."),
    api_key_env: str | None = typer.Option(
        None, "--api-key-env", help="Require the key in this environment variable (default: no auth)."
    ),
) -> None:
    """Serve a local judge behind an OpenAI-compatible /v1/chat/completions (for tests and the demo)."""
    import os

    from balcaprl.testing.judge_server import FaultScript, serve_forever

    if oracle is not None:
        try:
            from balcaprl.synthetic.oracle import OracleJudge
        except ImportError as error:
            _fail(f"--oracle needs balcaprl.synthetic.oracle, which is not available ({error})")
        local_judge = OracleJudge.from_dataset(oracle)
    else:
        from balcaprl.testing.scripted_judge import ScriptedJudge

        local_judge = ScriptedJudge(latency_s=latency)
    script = None
    if faults is not None:
        try:
            script = FaultScript.from_json(json.loads(faults.read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError) as error:
            _fail(f"--faults {faults}: {error}")
    if host not in ("127.0.0.1", "::1", "localhost") and api_key_env is None:
        typer.secho(
            f"warning: serving on {host} without --api-key-env: anyone who can reach it can use it",
            fg=typer.colors.YELLOW,
            err=True,
        )
    key = None
    if api_key_env is not None:
        key = os.environ.get(api_key_env)
        if not key:
            _fail(f"--api-key-env {api_key_env}: the variable is not set")
    serve_forever(
        local_judge, host=host, port=port, faults=script, api_key=key,
        on_ready=lambda url: typer.echo(f"balcaprl judge server: {url}", nl=True),
    )  # fmt: skip


def register(app: typer.Typer) -> None:
    """Add this area's commands to ``app``."""
    app.command("score")(score)
    app.command("serve-judge")(serve_judge)
