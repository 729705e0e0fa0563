"""``balcaprl data ...``: build (``prepare sharegpt4v``), re-caption and inspect dataset folders.

Thin on purpose: arguments in, one call into the data modules, a printed report out.
"""

from __future__ import annotations

from pathlib import Path

import typer

from balcaprl.cli.common import OVERWRITE_HELP, RESUME_HELP, exit_if_short, implied_resume, renamed
from balcaprl.errors import InputError, UserError

IMAGE_MODES = ("auto", "hardlink", "copy", "reencode")


def _console():
    from balcaprl.progress import make_console

    return make_console()


def _trial(dataset: Path, section: str) -> str | None:
    """What ``dataset`` holds, in words, when its card records a ``--limit`` for the run that wrote
    ``section`` (``source``: preparation, ``recaption``): a trial run. None for a full run, or where
    no readable card is."""
    from balcaprl.data.format import read_card

    try:
        recorded = read_card(dataset).get(section)
    except UserError:
        return None
    limit = recorded.get("limit") if isinstance(recorded, dict) else None
    return None if limit is None else f"the trial run (--limit {limit}) in {dataset}"


def _token_counter(tokenizer: str | None):
    """The tokenizer's counter, or None (one that cannot be loaded is an InputError naming it)."""
    if tokenizer is None:
        return None
    from balcaprl.data.format import TokenCounter

    return TokenCounter.load(tokenizer)


def prepare_sharegpt4v(
    json_file: Path = typer.Option(
        ..., "--json", help="ShareGPT4V JSON (cap100k or the 1.2M ShareCaptioner file)."
    ),
    image_root: Path = typer.Option(
        ..., "--image-root", help="Folder holding coco/, sam/, llava/, wikiart/, ..."
    ),
    out: Path = typer.Option(..., "--out", help="Dataset folder to write (--resume continues one)."),
    tokenizer: str | None = typer.Option(
        None,
        "--tokenizer",
        help="Hub name or local folder whose tokenizer counts reference tokens "
        "(use the policy's model name so the trainer reuses the counts).",
    ),
    eval_size: int = typer.Option(1000, "--eval-size", min=0, help="Samples held out for evaluation."),
    seed: int = typer.Option(0, "--seed", help="Seed of the train/eval split."),
    images: str = typer.Option(
        "auto",
        "--images",
        help="How images enter the folder: auto (hard link, else copy), hardlink, copy, "
        "reencode (JPEG, long side <= --max-side).",
    ),
    max_side: int = typer.Option(1024, "--max-side", min=64, help="Long side for --images reencode."),
    min_side: int = typer.Option(
        28, "--min-side", min=1, help="Reject images whose shortest side is smaller."
    ),
    max_aspect_ratio: float = typer.Option(
        10.0, "--max-aspect-ratio", min=1.0, help="Reject longer/shorter above this."
    ),
    allow_symlinks_out: bool = typer.Option(
        False, "--allow-symlinks-out", help="Accept image paths whose symlinks lead outside --image-root."
    ),
    workers: int | None = typer.Option(
        None, "--workers", min=0, help="Image-check processes (default: all cores)."
    ),
    limit: int | None = typer.Option(
        None, "--limit", min=1, help="Read only the first N entries (trial run)."
    ),
    name: str | None = typer.Option(None, "--name", help="Dataset name in the card."),
    resume: bool = typer.Option(
        False, "--resume", help=RESUME_HELP + " Images already checked are not checked again."
    ),
    overwrite: bool = typer.Option(False, "--overwrite", help=OVERWRITE_HELP),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show progress bars."),
) -> None:
    """ShareGPT4V -> train/eval parquet + images + card; every rejected entry is reported with its reason.

    Exits with status 1 when the JSON yields no usable entry.
    """
    from balcaprl.data.sharegpt4v import PrepareOptions, prepare_results
    from balcaprl.data.sharegpt4v import prepare_sharegpt4v as prepare
    from balcaprl.data.validation import ImageLimits
    from balcaprl.outputs import claim_output_dir

    if images not in IMAGE_MODES:
        raise UserError(f"--images {images!r}: choose auto, hardlink, copy or reencode")
    if not json_file.is_file():
        raise InputError(f"--json {json_file} is not a file")
    if not image_root.is_dir():
        raise InputError(f"--image-root {image_root} is not a folder")
    counter = _token_counter(tokenizer)
    options = PrepareOptions(
        eval_size=eval_size,
        seed=seed,
        limits=ImageLimits(min_side=min_side, max_aspect_ratio=max_aspect_ratio),
        image_mode=images,  # type: ignore[arg-type]
        reencode_max_side=max_side,
        allow_symlinks_out=allow_symlinks_out,
        workers=workers,
        limit=limit,
        name=name,
    )
    if out.expanduser().resolve() == image_root.expanduser().resolve():
        raise InputError("--out must not be the image root itself; use a new folder (e.g. next to it)")
    resume = implied_resume(resume, overwrite, _trial(out, "source"))
    target = claim_output_dir(
        out,
        what="--out",
        results=prepare_results,
        resume=resume,
        overwrite=overwrite,
        copy=(".prepare",),
        resumable=(".prepare",),  # image checks are facts about the sources: reused
    )
    with target.committing():
        report = prepare(
            json_file, image_root, target.work, options=options, token_counter=counter, progress=progress
        )
    report.out = target.final
    _print_prepare_report(report)
    if report.entries == 0:
        exit_if_short(f"{json_file} holds no entries: nothing to prepare")
    if report.kept == 0:
        exit_if_short(
            f"none of the {report.entries} entries was kept (reasons above; details in "
            f"{target.final / 'rejections.jsonl'})"
        )


def _print_prepare_report(report) -> None:
    from rich.table import Table

    from balcaprl.data.validation import REASONS

    console = _console()
    console.print(
        f"[bold]{report.kept}[/] of {report.entries} entries kept: train {report.train}, eval {report.eval}; "
        f"images checked {report.images_checked} ({report.images_per_second():.0f}/s), "
        f"reused from an earlier run {report.images_reused}"
    )
    console.print("images: " + ", ".join(f"{k} {v}" for k, v in sorted(report.placement.items())))
    if report.placement.get("copied"):
        console.print(
            "[yellow]note:[/] images were copied (the output is on another filesystem or links are "
            "not permitted); put --out next to --image-root to hard-link instead"
        )
    if report.renamed_ids:
        console.print(f"{report.renamed_ids} repeated ids renamed (see renamed_ids.jsonl)")
    if report.rejections:
        table = Table(title=f"rejected: {sum(report.rejections.values())} (details in rejections.jsonl)")
        table.add_column("reason")
        table.add_column("count", justify="right")
        table.add_column("meaning")
        for reason, n in report.rejections.most_common():
            table.add_row(reason, str(n), REASONS[reason])
        console.print(table)
    console.print(f"wrote {report.out}")


def recaption(
    data: Path = typer.Option(..., "--data", help="A balcaprl dataset folder; rewritten in place."),
    model: str = typer.Option(..., "--model", help="The re-captioning model (the paper: gpt-5-mini)."),
    judge: Path | None = typer.Option(
        None,
        "--judge",
        help="Judge config YAML: endpoint, key variable, concurrency, limits, cache, prices (required).",
    ),
    judge_config: Path | None = typer.Option(None, "--judge-config", hidden=True),  # the old spelling
    rubric: str = typer.Option(
        "paper",
        "--rubric",
        help="paper: the sample's original captioning prompt, nothing added (the paper); "
        "strict: pointable-only references (no feelings, relationships, mood or composition).",
    ),
    limit: int | None = typer.Option(
        None, "--limit", min=1, help="Re-caption only the first N rows (trial run)."
    ),
    tokenizer: str | None = typer.Option(
        None,
        "--tokenizer",
        help="Recount reference_tokens with this tokenizer (default: the one the card names).",
    ),
    cache: Path | None = typer.Option(
        None, "--cache", help="Cache file (overrides the config's cache_path)."
    ),
    no_cache: bool = typer.Option(
        False, "--no-cache", help="No judge cache (the progress file still resumes)."
    ),
    resume: bool = typer.Option(False, "--resume", help=RESUME_HELP),
    overwrite: bool = typer.Option(
        False, "--overwrite", help="Forget an earlier re-captioning and ask for every reference again."
    ),
    min_recaptioned: float = typer.Option(
        1.0, "--min-recaptioned", min=0.0, max=1.0,
        help="Exit with status 1 unless at least this share of the rows asked for got a new reference.",
    ),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar."),
) -> None:  # fmt: skip
    """Re-caption every reference with a strong model, reusing each sample's original prompt.

    Keeps `reference_original`; a failed call keeps the original reference and is listed in
    recaption_failures.jsonl. --resume continues without paying twice for a finished row.
    """
    from balcaprl.data.format import read_card
    from balcaprl.data.recaption import RECAPTION_RUBRICS, recaption_dataset, recaption_results
    from balcaprl.judge.config import load_judge_config
    from balcaprl.outputs import claim_in_place, shortfall

    judge_config = renamed(judge, judge_config, "--judge", "--judge-config")
    if rubric not in RECAPTION_RUBRICS:
        raise UserError(f"--rubric {rubric!r}: choose {' or '.join(RECAPTION_RUBRICS)}")
    if not (data / ".recaption" / "card.json").is_file():  # (a rewrite that was interrupted keeps it)
        read_card(data)  # not a dataset: say so before anything else
    judge = load_judge_config(judge_config)  # a config mistake is reported before anything else
    resume = implied_resume(resume, overwrite, _trial(data, "recaption"))
    mode = claim_in_place(data, what="--data", results=recaption_results, resume=resume, overwrite=overwrite)
    report = recaption_dataset(
        data,
        judge,
        model=model,
        rubric=rubric,
        limit=limit,
        tokenizer=tokenizer,
        cache_path=cache,
        no_cache=no_cache,
        progress=progress,
        restart=mode == "overwrite",
    )
    console = _console()
    failed = sum(report.failed.values())
    console.print(
        f"[bold]{report.recaptioned}[/] of {report.rows} references re-captioned by {report.model} "
        f"(rubric {report.rubric_version}); asked for {report.requested}; "
        f"{report.from_progress} finished by an earlier run, {report.from_cache} from the cache"
    )
    reasons = ", ".join(f"{k} {v}" for k, v in report.failed.most_common()) or "none"
    console.print(f"failed (kept the original reference): {failed} ({reasons})", markup=False)
    for reason, detail in report.failure_details.items():  # the cause, e.g. a name that does not resolve
        console.print(f"  {reason}, e.g.: {detail}", markup=False, soft_wrap=True)
    cost = "" if report.cost_usd is None else f", ~${report.cost_usd:.4f}"
    total = "" if report.total_cost_usd is None else f", ~${report.total_cost_usd:.4f}"
    console.print(
        f"this run: {report.calls} calls, tokens {report.prompt_tokens} in / "
        f"{report.completion_tokens} out{cost}"
    )
    console.print(
        f"all re-captions in the dataset: tokens {report.total_prompt_tokens} in / "
        f"{report.total_completion_tokens} out{total}"
    )
    console.print(f"reference_tokens counted with: {report.tokenizer or 'none (the trainer recounts)'}")
    console.print(f"wrote {report.out}")
    done = report.requested - failed
    exit_if_short(
        shortfall(
            done,
            report.requested,
            min_recaptioned,
            unit="rows",
            verb="re-captioned",
            flag="--min-recaptioned",
        ),
        "failed rows are asked again by the same command with --resume" if failed else "",
    )


def info(
    data: Path | None = typer.Option(None, "--data", help="A balcaprl dataset folder (required)."),
    dataset: Path | None = typer.Argument(None, hidden=True),  # the old spelling: data info DIR
    png: Path | None = typer.Option(
        None, "--png", help="Histogram file (default: reference_lengths.png in the dataset folder)."
    ),
    tokenizer: str | None = typer.Option(
        None, "--tokenizer", help="Also count prompt and both references in this tokenizer's tokens."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the statistics as JSON instead of tables."),
) -> None:
    """Counts, splits, length statistics (original vs re-captioned), rejections; writes a length histogram."""
    from balcaprl.data.info import dataset_info, info_json, render_info, write_length_histogram

    dataset = renamed(data, dataset, "--data", "DIR")
    counter = _token_counter(tokenizer)
    statistics = dataset_info(dataset, tokenizer=counter)
    path = write_length_histogram(statistics, png or dataset / "reference_lengths.png")
    if as_json:
        typer.echo(info_json(statistics))
    else:
        render_info(statistics, _console())
    typer.echo(f"wrote {path}", err=as_json)
