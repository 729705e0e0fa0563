"""Command-line fronts of the verl backend: ``balcaprl export verl`` and ``balcaprl train --backend verl``.

``register(app)`` adds the ``export`` group to the main app; ``train_verl(...)`` is what
``balcaprl train --backend verl`` calls (``balcaprl.train.cli``).
"""

from __future__ import annotations

from pathlib import Path

import typer

from balcaprl.config import RecipeError, load_recipe

__all__ = ["export_app", "register", "train_verl"]

export_app = typer.Typer(help="Export a dataset folder for another trainer.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    """Add ``export`` (with ``export verl``) to ``app``."""
    app.add_typer(export_app, name="export")


@export_app.command("verl")
def export_verl_command(
    data: Path = typer.Option(
        ..., "--data", exists=True, file_okay=False, help="Dataset folder (pinned format)."
    ),
    out: Path | None = typer.Option(None, "--out", help="Output folder [default: DATA/verl]."),
    reference: str = typer.Option(
        "reference",
        "--reference",
        help="Caption column the judge compares against: reference | reference_original.",
    ),
    tokenizer: str | None = typer.Option(
        None, "--tokenizer", help="Count reference tokens with this tokenizer (pass the policy checkpoint)."
    ),
    embed_images: bool = typer.Option(
        False, "--embed-images", help="Store image bytes in the parquet files."
    ),
    max_samples: int | None = typer.Option(
        None, "--max-samples", min=1, help="Only the first N rows per split."
    ),
) -> None:
    """Write verl's multimodal RL parquet rows (train.parquet, eval.parquet, export.json)."""
    from balcaprl.train.verl_backend.export import export_verl

    if reference not in ("reference", "reference_original"):
        raise typer.BadParameter("choose reference or reference_original", param_hint="--reference")
    target = out if out is not None else data / "verl"
    try:
        result = export_verl(
            data,
            target,
            reference=reference,
            tokenizer=tokenizer,
            embed_images=embed_images,
            max_samples=max_samples,
        )
    except (ValueError, FileNotFoundError) as err:
        typer.secho(str(err), err=True, fg=typer.colors.RED)
        raise typer.Exit(2) from None
    counts = ", ".join(f"{n} {split}" for split, n in result.counts.items())
    typer.echo(f"wrote {counts} rows to {result.out_dir}")


def train_verl(
    config: Path,
    overrides: list[str] | None = None,
    *,
    judge: Path | None = None,
    nnodes: int = 1,
    gpus_per_node: int = 8,
    verl_data: Path | None = None,
    verl_overrides: list[str] | None = None,
    reward_workers: int = 8,
    dry_run: bool = False,
) -> None:
    """``balcaprl train --backend verl``: render the recipe for verl, then start it (or print it)."""
    from balcaprl.train.verl_backend.render import render_verl

    try:
        recipe = load_recipe(config, overrides or [])
        launch = render_verl(
            recipe,
            nnodes=nnodes,
            gpus_per_node=gpus_per_node,
            verl_data=verl_data,
            judge=judge,
            recipe_dir=config.resolve().parent,
            reward_workers=reward_workers,
            extra=verl_overrides or [],
        )
    except RecipeError as err:
        typer.secho(str(err), err=True, fg=typer.colors.RED)
        raise typer.Exit(2) from None
    for note in launch.notes:
        typer.secho(f"note: {note}", err=True, fg=typer.colors.YELLOW)
    if dry_run:
        env = " ".join(f"{k}={v}" for k, v in launch.env.items())
        typer.echo(f"# {env} python -m balcaprl.train.verl_backend.main \\")
        typer.echo(launch.to_text(), nl=False)
        return

    from balcaprl.train.verl_backend.launch import run_verl

    try:
        code = run_verl(recipe, launch)
    except RecipeError as err:
        typer.secho(str(err), err=True, fg=typer.colors.RED)
        raise typer.Exit(2) from None
    if code:
        raise typer.Exit(code)
    typer.echo(f"verl run finished; checkpoints in {Path(recipe.run.output_dir) / 'checkpoints'}")
