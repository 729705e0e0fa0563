"""`balcaprl train CONFIG [key.sub=value ...]`, registered on the main app."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import typer

from balcaprl.config import RecipeError, load_recipe

__all__ = ["judge_for_recipe", "register"]


def judge_for_recipe(
    spec: Mapping[str, Any] | str | Path | None, recipe_dir: Path | None = None, image_root=None
):
    """A Judge from a judge config (a mapping, or a YAML path relative to the cwd or the recipe) through
    ``balcaprl.judge.build_judge``; errors become :class:`RecipeError`."""
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


def register(app: typer.Typer) -> None:
    """Add `train` to ``app``."""

    @app.command("train", context_settings={"help_option_names": ["-h", "--help"]})
    def train_command(
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
            False,
            "--allow-recipe-change",
            help="Resume even if the recipe differs from the run's recipe.yaml.",
        ),
        print_config: bool = typer.Option(
            False, "--print-config", help="Print the resolved recipe and exit."
        ),
        backend: str = typer.Option(
            "trl",
            "--backend",
            help="trl: one machine (TRL). verl: Ray cluster (pip install 'balcaprl[verl]').",
        ),
        nnodes: int = typer.Option(1, "--nnodes", min=1, help="verl: machines in the Ray cluster."),
        gpus_per_node: int = typer.Option(8, "--gpus-per-node", min=1, help="verl: GPUs per machine."),
        verl_data: Path | None = typer.Option(
            None, "--verl-data", help="verl: `balcaprl export verl` folder [default: DATA/verl]."
        ),
        verl_override: list[str] = typer.Option(
            None, "--verl-override", help="verl: extra Hydra override KEY=VALUE (repeatable; applied last)."
        ),
        dry_run: bool = typer.Option(False, "--dry-run", help="verl: print the rendered overrides and exit."),
    ) -> None:
        """Train a captioner with c-GDPO on TRL's GRPOTrainer (one machine; multi-GPU via `accelerate launch`),
        or with --backend verl on a Ray cluster (FSDP + vLLM rollouts)."""
        if backend == "verl":
            from balcaprl.train.verl_backend.cli import train_verl

            if resume or resume_from is not None or allow_recipe_change or print_config:
                typer.secho(
                    "--resume/--resume-from/--allow-recipe-change/--print-config are TRL options; verl resumes "
                    "from its newest checkpoint by itself, and --dry-run prints its settings",
                    err=True,
                    fg=typer.colors.RED,
                )
                raise typer.Exit(2)
            train_verl(
                config,
                overrides or [],
                judge=judge,
                nnodes=nnodes,
                gpus_per_node=gpus_per_node,
                verl_data=verl_data,
                verl_overrides=verl_override or [],
                dry_run=dry_run,
            )
            return
        if backend != "trl":
            typer.secho(f"--backend must be trl or verl, got {backend!r}", err=True, fg=typer.colors.RED)
            raise typer.Exit(2)
        try:
            recipe = load_recipe(config, overrides or [])
            if print_config:
                typer.echo(recipe.to_yaml(), nl=False)
                return
            judge_object = judge_for_recipe(
                judge if judge is not None else recipe.judge,
                config.resolve().parent,
                image_root=Path(recipe.data.path).expanduser().resolve(),
            )
        except RecipeError as err:
            typer.secho(str(err), err=True, fg=typer.colors.RED)
            raise typer.Exit(2) from None

        from balcaprl.train.trl_backend import train

        try:
            result = train(
                recipe,
                judge_object,
                resume=resume_from if resume_from is not None else resume,
                allow_recipe_change=allow_recipe_change,
            )
        except RecipeError as err:
            typer.secho(str(err), err=True, fg=typer.colors.RED)
            raise typer.Exit(2) from None
        typer.echo(f"done: {result.global_step} steps; metrics in {result.metrics_path}")
        if result.final_model_dir is not None:
            typer.echo(f"final policy: {result.final_model_dir}")
