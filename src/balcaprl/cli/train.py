"""``balcaprl train CONFIG [key.sub=value ...]``: c-GDPO on TRL's GRPOTrainer, one machine.

(verl on a Ray cluster is ``balcaprl verl launch``, in ``cli/verl.py``, with verl's own flags.)
"""

from __future__ import annotations

from pathlib import Path

import typer

__all__ = ["train"]


def train(
    config: Path = typer.Argument(..., exists=True, dir_okay=False, help="Recipe YAML (see configs/)."),
    overrides: list[str] = typer.Argument(
        None, help="Recipe overrides, key.sub=value (values are YAML), e.g. rewards.weights.precision=0."
    ),
    resume: bool = typer.Option(
        False, "--resume", help="Continue from the newest checkpoint in run.output_dir."
    ),
    resume_from: Path | None = typer.Option(
        None, "--resume-from", help="Continue from this checkpoint folder."
    ),
    overwrite: bool = typer.Option(
        False, "--overwrite", help="Replace the run already in run.output_dir (its checkpoints are deleted)."
    ),
    judge: Path | None = typer.Option(
        None, "--judge", help="Judge config YAML (replaces the recipe's judge:)."
    ),
    allow_recipe_change: bool = typer.Option(
        False, "--allow-recipe-change", help="Resume even if the recipe differs from the run's recipe.yaml."
    ),
    print_config: bool = typer.Option(False, "--print-config", help="Print the resolved recipe and exit."),
) -> None:
    """Train a captioner with c-GDPO on TRL's GRPOTrainer, on one machine.

    Several GPUs: run it under `accelerate launch`. For a Ray cluster, use `balcaprl verl launch`.
    """
    from balcaprl.recipe import load_recipe

    recipe = load_recipe(config, overrides or [])
    if print_config:
        typer.echo(recipe.to_yaml(), nl=False)
        return
    from balcaprl.data.format import read_card
    from balcaprl.errors import ConfigError, UserError
    from balcaprl.outputs import ensure_writable_dir
    from balcaprl.train.checkpointing import replace_run, resolve_resume

    if overwrite and (resume or resume_from is not None):
        raise UserError("give --resume (or --resume-from) or --overwrite, not both")
    judge_config = judge if judge is not None else recipe.judge
    if judge_config is None:
        raise ConfigError(
            f"{config}: the recipe has no judge: section; add one (see configs/qwen2_5_vl_3b.yaml) or pass "
            "--judge JUDGE.yaml (in Python: balcaprl.train.train(recipe, judge) with any Judge object)"
        )
    import balcaprl.judge

    judge_object = balcaprl.judge.build_judge(
        judge_config, image_root=Path(recipe.data.path).expanduser().resolve()
    )
    # Before any model is loaded: the data, and a run folder that may be written.
    try:
        read_card(Path(recipe.data.path).expanduser())
    except UserError as error:
        raise ConfigError(f"data.path: {error}") from None
    output_dir = Path(recipe.run.output_dir).expanduser()
    if overwrite:
        replace_run(output_dir)
    else:
        resolve_resume(output_dir, resume_from if resume_from is not None else resume)  # refusals
    ensure_writable_dir(output_dir, "run.output_dir")

    from balcaprl.train.trl_backend import train as train_with_trl

    result = train_with_trl(
        recipe,
        judge_object,
        resume=resume_from if resume_from is not None else resume,
        allow_recipe_change=allow_recipe_change,
    )
    typer.echo(f"done: {result.global_step} steps; metrics in {result.metrics_path}")
    if result.final_model_dir is not None:
        typer.echo(f"final policy: {result.final_model_dir}")
