"""``balcaprl verl export`` and ``balcaprl verl launch``: training on a Ray cluster with verl.

Only verl's flags live here; the one-machine TRL trainer is ``balcaprl train`` (``cli/train.py``).
"""

from __future__ import annotations

from pathlib import Path

import typer

from balcaprl.errors import UserError

REFERENCE_COLUMNS = ("reference", "reference_original")


def export(
    data: Path = typer.Option(
        ..., "--data", exists=True, file_okay=False, help="Dataset folder (pinned format)."
    ),
    out: Path | None = typer.Option(None, "--out", help="Output folder (default: DATA/verl)."),
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
    overwrite: bool = typer.Option(
        False, "--overwrite",
        help="Replace the export already in the output folder (kept until the new one is complete).",
    ),
) -> None:  # fmt: skip
    """Write verl's multimodal RL parquet rows (train.parquet, eval.parquet, export.json).

    Every input is checked before the output folder is touched; an earlier export there is refused
    unless --overwrite, and then replaced in one step at the end.
    """
    from balcaprl.train.verl_backend.export import export_verl

    if reference not in REFERENCE_COLUMNS:
        raise UserError(f"--reference {reference}: choose reference or reference_original")
    target = out if out is not None else data / "verl"
    result = export_verl(  # a row or folder that cannot be exported is an InputError naming it
        data,
        target,
        reference=reference,
        tokenizer=tokenizer,
        embed_images=embed_images,
        max_samples=max_samples,
        overwrite=overwrite,
        what="--out" if out is not None else "the export folder",
    )
    counts = ", ".join(f"{n} {split}" for split, n in result.counts.items())
    typer.echo(f"wrote {counts} rows to {result.out_dir}")


def launch(
    config: Path = typer.Argument(..., exists=True, dir_okay=False, help="Recipe YAML (see configs/)."),
    overrides: list[str] = typer.Argument(
        None, help="Recipe overrides, key.sub=value (values are YAML), e.g. rewards.weights.precision=0."
    ),
    judge: Path | None = typer.Option(
        None, "--judge", help="Judge config YAML (replaces the recipe's judge:)."
    ),
    nnodes: int = typer.Option(1, "--nnodes", min=1, help="Machines in the Ray cluster."),
    gpus_per_node: int = typer.Option(8, "--gpus-per-node", min=1, help="GPUs per machine."),
    verl_data: Path | None = typer.Option(
        None, "--verl-data", help="`balcaprl verl export` folder (default: DATA/verl)."
    ),
    verl_override: list[str] = typer.Option(
        None, "--verl-override", help="Extra Hydra override KEY=VALUE (repeatable; applied last)."
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the rendered overrides and exit."),
    gpu_memory: float = typer.Option(
        80.0, "--gpu-memory", help="Memory of one GPU, GiB (the per-GPU token budget of the micro-batches)."
    ),
    flash_attn: bool = typer.Option(
        True,
        "--flash-attn/--no-flash-attn",
        help="--no-flash-attn: nodes without flash-attn; the actor runs unpacked on sdpa (slower).",
    ),
) -> None:
    """Train a captioner with c-GDPO on a Ray cluster with verl (FSDP + vLLM rollouts).

    Needs the verl extra. verl resumes from the run's newest checkpoint by itself; export the dataset
    first with `balcaprl verl export`.
    """
    from balcaprl.recipe import load_recipe
    from balcaprl.train.verl_backend.render import render_verl

    recipe = load_recipe(config, overrides or [])
    rendered = render_verl(
        recipe,
        nnodes=nnodes,
        gpus_per_node=gpus_per_node,
        verl_data=verl_data,
        judge=judge,
        recipe_dir=config.resolve().parent,
        extra=verl_override or [],
        gpu_memory_gib=gpu_memory,
        flash_attn=flash_attn,
    )
    for note in rendered.notes:
        typer.secho(f"note: {note}", err=True, fg=typer.colors.YELLOW)
    if dry_run:
        env = " ".join(f"{k}={v}" for k, v in rendered.env.items())
        typer.echo(f"# {env} python -m balcaprl.train.verl_backend.main \\")
        typer.echo(rendered.to_text(), nl=False)
        return

    from balcaprl.train.verl_backend.launch import run_verl

    code = run_verl(recipe, rendered)
    if code:
        raise typer.Exit(code)
    typer.echo(f"verl run finished; checkpoints in {Path(recipe.run.output_dir) / 'checkpoints'}")
