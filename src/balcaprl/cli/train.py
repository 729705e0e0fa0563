"""``balcaprl train CONFIG [key.sub=value ...]``: c-GDPO on TRL's GRPOTrainer, one machine.

``--plan`` prints the per-GPU memory estimate instead (``plan/memory.py``), for an accelerate
launch config or a verl layout. (verl on a Ray cluster is ``balcaprl verl launch``, in ``cli/verl.py``.)
"""

from __future__ import annotations

from pathlib import Path

import typer

from balcaprl.threads import DEFAULT_CPU_THREADS, THREADS_HELP


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
    plan: bool = typer.Option(
        False, "--plan", help="Print the estimated memory per GPU (no GPU, no download) and exit."
    ),
    launcher: Path | None = typer.Option(
        None,
        "--launcher",
        exists=True,
        dir_okay=False,
        help="--plan: the accelerate config of the launch (configs/accelerate/*.yaml); default one GPU.",
    ),
    verl_layout: str | None = typer.Option(
        None, "--verl-layout", help="--plan: a verl launch on NODESxGPUS, e.g. 1x8 or 4x8."
    ),
    gpus: int | None = typer.Option(
        None, "--gpus", min=1, help="--plan: processes (GPUs) instead of the launcher's num_processes."
    ),
    gpu_memory: float = typer.Option(80.0, "--gpu-memory", help="--plan: memory of one GPU, GiB."),
    threads: int = typer.Option(DEFAULT_CPU_THREADS, "--threads", min=1, help=THREADS_HELP),
) -> None:
    """Train a captioner with c-GDPO on TRL's GRPOTrainer, on one machine.

    Several GPUs: run it under `accelerate launch`. For a Ray cluster, use `balcaprl verl launch`.
    """
    from balcaprl.recipe import load_recipe

    recipe = load_recipe(config, overrides or [])
    if print_config:
        typer.echo(recipe.to_yaml(), nl=False)
        return
    if plan:
        _print_plan(recipe, launcher, verl_layout, gpus, gpu_memory)
        return
    from balcaprl.threads import use_cpu_threads

    use_cpu_threads(threads, on_cpu=True if recipe.train.use_cpu else None)
    from balcaprl.data.format import read_card
    from balcaprl.errors import ConfigError, UserError
    from balcaprl.outputs import ensure_writable_dir, lock_output
    from balcaprl.train.checkpointing import replace_run, resolve_resume

    if launcher is not None or verl_layout is not None or gpus is not None:
        raise UserError("--launcher, --verl-layout and --gpus describe a launch for --plan; add --plan")

    if overwrite and (resume or resume_from is not None):
        raise UserError("give --resume (or --resume-from) or --overwrite, not both")
    judge_config = judge if judge is not None else recipe.judge
    if judge_config is None:
        raise ConfigError(
            f"{config}: the recipe has no judge: section; add one (see configs/qwen2_5_vl_3b.yaml) or pass "
            "--judge JUDGE.yaml (in Python: balcaprl.train.train(recipe, judge) with any Judge object)"
        )
    from accelerate import PartialState

    import balcaprl.judge

    # Under `accelerate launch` every GPU process runs this command and builds its own judge client:
    # they share the configured concurrency and rate caps, which are the endpoint's.
    processes = PartialState(cpu=recipe.train.use_cpu)
    judge_object = balcaprl.judge.build_judge(
        judge_config,
        image_root=Path(recipe.data.path).expanduser().resolve(),
        processes=processes.num_processes,
        rollouts=True,
    )
    # Before any model is loaded: the model's path, the data, and a run folder that may be written.
    from balcaprl.model_paths import check_model_path

    try:
        read_card(Path(recipe.data.path).expanduser())
    except UserError as error:
        raise ConfigError(f"data.path: {error}") from None
    output_dir = Path(recipe.run.output_dir).expanduser()
    if processes.is_main_process:  # one run per folder; a launch's other processes are the same run
        lock_output(output_dir, "run.output_dir")
    checkpoint = None
    if not overwrite:
        checkpoint = resolve_resume(
            output_dir, resume_from if resume_from is not None else resume
        )  # refusals
    check_model_path(recipe.model.path, "model.path")  # a hub that cannot be reached: the cache or exit 2
    from balcaprl.train.trl_backend import grpo_config

    grpo_config(recipe, processes.num_processes)  # every value as TRL gets it, before the folder is touched
    if overwrite:
        replace_run(output_dir, processes)
    ensure_writable_dir(output_dir, "run.output_dir")

    from balcaprl.train.trl_backend import train as train_with_trl

    if checkpoint is not None and processes.is_main_process:  # which weights, optimizer and step go on
        typer.echo(f"resuming from {checkpoint}")

    try:
        result = train_with_trl(
            recipe,
            judge_object,
            resume=resume_from if resume_from is not None else resume,
            allow_recipe_change=allow_recipe_change,
        )
    finally:
        # Its HTTP session lives on the trainer's reward loop: closed now, while that loop still runs
        # (left to exit, the close is scheduled on a loop that is stopped first: "Unclosed client session").
        aclose = getattr(judge_object, "aclose", None)
        if aclose is not None:
            import asyncio

            asyncio.run(aclose())
    resumed = f" (resumed from {result.resumed_from})" if result.resumed_from is not None else ""
    typer.echo(f"done: {result.global_step} steps{resumed}; metrics in {result.metrics_path}")
    if result.final_model_dir is not None:
        typer.echo(f"final policy: {result.final_model_dir}")


def _print_plan(
    recipe, launcher: Path | None, verl_layout: str | None, gpus: int | None, gpu_memory: float
) -> None:
    from balcaprl.errors import UserError
    from balcaprl.plan.memory import (
        Launcher,
        launcher_from_accelerate,
        launcher_from_verl_layout,
        plan_memory,
    )

    if launcher is not None and verl_layout is not None:
        raise UserError(
            "--launcher (accelerate, TRL) and --verl-layout (verl) describe different launches; pick one"
        )
    if verl_layout is not None:
        if gpus is not None:
            raise UserError("--gpus: a verl layout already says how many GPUs (NODESxGPUS)")
        chosen = launcher_from_verl_layout(verl_layout)
    elif launcher is not None:
        chosen = launcher_from_accelerate(launcher, gpus)
    elif gpus is not None and gpus > 1:
        raise UserError("--gpus > 1 needs --launcher (how the GPUs share the model: DDP, FSDP, ZeRO-3)")
    else:
        chosen = Launcher("single", 1, description="one process on one GPU")
    result = plan_memory(recipe, chosen, gpu_memory)
    typer.echo(result.to_text())
    from balcaprl.plan.judge_cost import plan_judge

    judge_plan = plan_judge(recipe)  # the judge's calls, tokens, dollars and minutes
    if judge_plan is not None:
        typer.echo(judge_plan.to_text())
