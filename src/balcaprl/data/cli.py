"""Data commands (`balcaprl prepare sharegpt4v`, `balcaprl recaption`, `balcaprl data info`).

Thin on purpose: arguments in, one call into the data modules, a printed report out.
"""

from __future__ import annotations

from pathlib import Path

import typer

prepare_app = typer.Typer(
    help="Turn a published dataset into a balcaprl dataset folder.", no_args_is_help=True
)
data_app = typer.Typer(help="Inspect balcaprl dataset folders.", no_args_is_help=True)


def _fail(message: str) -> None:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code=2)


def _console():
    from rich.console import Console

    return Console()


@prepare_app.command("sharegpt4v")
def prepare_sharegpt4v_command(
    json_file: Path = typer.Option(
        ..., "--json", help="ShareGPT4V JSON (cap100k or the 1.2M ShareCaptioner file)."
    ),
    image_root: Path = typer.Option(
        ..., "--image-root", help="Folder holding coco/, sam/, llava/, wikiart/, ..."
    ),
    out: Path = typer.Option(..., "--out", help="Dataset folder to write (re-running it resumes)."),
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
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show progress bars."),
) -> None:
    """ShareGPT4V -> train/eval parquet + images + card; every rejected entry is reported with its reason."""
    from balcaprl.data.format import TokenCounter
    from balcaprl.data.sharegpt4v import JsonFileError, PrepareOptions, prepare_sharegpt4v
    from balcaprl.data.validation import ImageLimits

    if images not in ("auto", "hardlink", "copy", "reencode"):
        _fail(f"--images {images!r}: choose auto, hardlink, copy or reencode")
    if not json_file.is_file():
        _fail(f"--json {json_file} is not a file")
    if not image_root.is_dir():
        _fail(f"--image-root {image_root} is not a folder")
    counter = None
    if tokenizer is not None:
        try:
            counter = TokenCounter.load(tokenizer)
        except ValueError as error:
            _fail(str(error))
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
    try:
        report = prepare_sharegpt4v(
            json_file, image_root, out, options=options, token_counter=counter, progress=progress
        )
    except (JsonFileError, ValueError, OSError) as error:
        _fail(str(error))
    _print_prepare_report(report)


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


@data_app.command("info")
def info_command(
    dataset: Path = typer.Argument(..., help="A balcaprl dataset folder."),
    png: Path | None = typer.Option(
        None, "--png", help="Histogram file (default DIR/reference_lengths.png)."
    ),
    tokenizer: str | None = typer.Option(
        None, "--tokenizer", help="Also count prompt and both references in this tokenizer's tokens."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the statistics as JSON instead of tables."),
) -> None:
    """Counts, splits, length statistics (original vs re-captioned), rejections; writes a length histogram."""
    from balcaprl.data.format import TokenCounter
    from balcaprl.data.info import dataset_info, info_json, render_info, write_length_histogram

    counter = None
    if tokenizer is not None:
        try:
            counter = TokenCounter.load(tokenizer)
        except ValueError as error:
            _fail(str(error))
    try:
        info = dataset_info(dataset, tokenizer=counter)
    except FileNotFoundError as error:
        _fail(str(error))
    path = write_length_histogram(info, png or dataset / "reference_lengths.png")
    if as_json:
        typer.echo(info_json(info))
    else:
        render_info(info, _console())
    typer.echo(f"wrote {path}", err=as_json)


def register(app: typer.Typer) -> None:
    """Add this area's commands to ``app``: `prepare sharegpt4v`, `recaption`, `data info`."""
    app.add_typer(prepare_app, name="prepare")
    app.add_typer(data_app, name="data")
    from balcaprl.data.recaption import recaption_command

    app.command("recaption")(recaption_command)
