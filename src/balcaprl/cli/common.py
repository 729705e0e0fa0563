"""What several commands share: the options of the output policy and the exit status of a run that
did its work but produced too little (``balcaprl.outputs``; docs/robustness.md)."""

from __future__ import annotations

import typer

__all__ = ["RESUME_HELP", "OVERWRITE_HELP", "MIN_SCORED_HELP", "exit_if_short", "resume_after_trial"]

RESUME_HELP = "Continue the results already in the output place; nothing finished is redone or paid twice."
OVERWRITE_HELP = "Replace the results already in the output place (built aside, then swapped in at the end)."
MIN_SCORED_HELP = "Exit with status 1 unless at least this share of the items was scored (default 1: all)."


def exit_if_short(reason: str | None, advice: str = "") -> None:
    """Print why the run produced too little and exit with status 1 (the files are written)."""
    if reason is None:
        return
    typer.echo(f"incomplete: {reason}" + (f"; {advice}" if advice else ""), err=True)
    raise typer.Exit(1)


def resume_after_trial(resume: bool, overwrite: bool, trial_limit: int | None, where: str) -> bool:
    """``--resume``, implied when the results in ``where`` are a trial run's (``--limit N``): the run
    after a trial continues it, as the guides' flow (a trial, then the full run) expects."""
    if trial_limit is None or resume or overwrite:
        return resume
    typer.echo(
        f"continuing the trial run (--limit {trial_limit}) in {where}; --overwrite starts again", err=True
    )
    return True
