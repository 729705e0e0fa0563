"""``balcaprl inspect``: one self-contained HTML page of what the judge decided about each caption."""

from __future__ import annotations

from pathlib import Path

import typer


def inspect(
    path: Path = typer.Argument(
        ..., help="A scores folder (score/evaluate output), a training run folder or a demo run folder."
    ),
    out: Path = typer.Option(Path("report.html"), "--out", help="The HTML page to write."),
    step: list[int] = typer.Option(
        [], "--step", help="Training step whose rollouts to show (repeatable; default: the last logged)."
    ),
    images: Path | None = typer.Option(
        None, "--images", help="Image folder of a scores folder (default: the one summary.json records)."
    ),
    data: Path | None = typer.Option(
        None, "--data", help="A training run's dataset folder (default: the one its recipe.yaml names)."
    ),
    image_mode: str = typer.Option(
        "auto", "--image-mode",
        help="embed (thumbnails in the page), link (relative to the page), none, or auto: embed up to "
        "--embed-limit distinct images, link beyond.",
    ),
    embed_limit: int = typer.Option(2000, "--embed-limit", min=0, help="auto: most images to embed."),
    thumbnail_side: int = typer.Option(192, "--thumbnail-side", min=16, help="Longest side of a thumbnail."),
) -> None:  # fmt: skip
    """Write an HTML page of captions, their judged assertions and scores (and a run's curves)."""
    from balcaprl.errors import UserError
    from balcaprl.inspect import IMAGE_MODES, load_inspection, write_page
    from balcaprl.progress import Progress

    if image_mode not in IMAGE_MODES:
        raise UserError(f"--image-mode {image_mode}: choose from {', '.join(IMAGE_MODES)}")
    found = load_inspection(path, steps=step, image_root=images, data_dir=data)
    with Progress("images", total=len(found.images), unit="images", transient=True) as progress:
        written = write_page(
            found, out, image_mode,  # type: ignore[arg-type]
            thumbnail_side=thumbnail_side, embed_limit=embed_limit, on_image=progress.advance,
        )  # fmt: skip
    for note in found.notes:
        typer.echo(f"note: {note}", err=True)
    size = written.stat().st_size / 1e6
    typer.echo(
        f"{len(found.cards)} captions from {len(found.sources)} source(s); wrote {written} ({size:.1f} MB)"
    )
