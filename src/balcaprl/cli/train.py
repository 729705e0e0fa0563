"""``balcaprl train CONFIG [key.sub=value ...]``: c-GDPO on TRL's GRPOTrainer, one machine.

(verl on a Ray cluster is ``balcaprl verl launch``, in ``cli/verl.py``, with verl's own flags.)
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import typer

__all__ = ["judge_for_recipe", "train"]


def judge_for_recipe(
    spec: Mapping[str, Any] | str | Path | None, recipe_dir: Path | None = None, image_root=None
):
    """A Judge from a judge config (a mapping, or a YAML path relative to the cwd or the recipe) through
    ``balcaprl.judge.build_judge``; errors become :class:`~balcaprl.config.RecipeError`."""
    from balcaprl.config import RecipeError

    if spec is None:
        raise RecipeError(
            "no judge: give the recipe a `judge:` section (or --judge JUDGE.yaml), or call "
            "balcaprl.train.train(recipe, judge) with a Judge object"
        )
    import balcaprl.judge as judge_package

    factory = getattr(judge_package, "build_judge", None)
    if factory is None:
        raise RecipeError(
            "balcaprl.judge.build_judge is not available in this version, so a judge cannot be built from a "
            "config; call balcaprl.train.train(recipe, judge) with a Judge object instead"
        )
    if not isinstance(spec, Mapping):
        path = Path(spec).expanduser()
        if not path.exists() and recipe_dir is not None and (recipe_dir / path).exists():
            path = recipe_dir / path
        if not path.is_file():
            raise RecipeError(f"judge config not found: {spec}")
        spec = path
    try:
        return factory(dict(spec) if isinstance(spec, Mapping) else spec, image_root=image_root)
    except ValueError as err:  # JudgeConfigError: bad key, missing API key variable, ...
        raise RecipeError(f"judge: {err}") from None


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
    from balcaprl.config import load_recipe

    recipe = load_recipe(config, overrides or [])
    if print_config:
        typer.echo(recipe.to_yaml(), nl=False)
        return
    judge_object = judge_for_recipe(
        judge if judge is not None else recipe.judge,
        config.resolve().parent,
        image_root=Path(recipe.data.path).expanduser().resolve(),
    )

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
