"""What several commands share: the options of the output policy and the exit status of a run that
did its work but produced too little (``balcaprl.outputs``; docs/robustness.md)."""

from __future__ import annotations

import typer

__all__ = ["RESUME_HELP", "OVERWRITE_HELP", "MIN_SCORED_HELP", "exit_if_short", "implied_resume"]

RESUME_HELP = "Continue the results already in the output place; nothing finished is redone or paid twice."
OVERWRITE_HELP = "Replace the results already in the output place (built aside, then swapped in at the end)."
MIN_SCORED_HELP = "Exit with status 1 unless at least this share of the items was scored (default 1: all)."


def exit_if_short(reason: str | None, advice: str = "") -> None:
    """Print why the run produced too little and exit with status 1 (the files are written)."""
    if reason is None:
        return
    typer.echo(f"incomplete: {reason}" + (f"; {advice}" if advice else ""), err=True)
    raise typer.Exit(1)


def implied_resume(resume: bool, overwrite: bool, why: str | None) -> bool:
    """``--resume``, implied where the results in the output place are not worth a refusal: ``why``
    says what they are (a trial run's, ``--limit N``; a run that scored nothing), or None for
    results that are protected as usual. The run after them continues them, as the guides' flows
    (a trial, then the full run) expect; ``--overwrite`` still starts again."""
    if why is None or resume or overwrite:
        return resume
    typer.echo(f"continuing {why} (--resume implied; --overwrite starts again)", err=True)
    return True
