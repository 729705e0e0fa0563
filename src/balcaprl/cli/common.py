"""What several commands share: the options of the output policy, the exit status of a run that
did its work but produced too little (``balcaprl.outputs``; docs/robustness.md), and the one-line
reports of the error boundary (``balcaprl.cli``) for what the system refused or the user stopped."""

from __future__ import annotations

import errno
import logging
import os
import re
import types

import typer

SYSTEM_ERROR_STATUS = 1  # the work ran (some of it was paid for) and could not be written or read
INTERRUPTED_STATUS = 130  # 128 + SIGINT, what a shell reports for a command stopped by Ctrl-C
KEPT = "what was finished is kept: run the same command again (with --resume where it has one) to go on"

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


def system_error(error: BaseException) -> OSError | None:
    """The ``OSError`` behind ``error``: itself, or what it was raised from (``raise X from oserror``)."""
    while error is not None:
        if isinstance(error, OSError):
            return error
        error = error.__cause__
    return None


def system_error_line(error: OSError) -> str:
    """One line for an ``OSError`` the system raised mid-run: the path, the reason, what to do."""
    reason = error.strerror or os.strerror(error.errno) if error.errno else str(error) or type(error).__name__
    where = f"{error.filename}: " if error.filename is not None else ""
    if error.filename2 is not None:
        where = f"{error.filename} -> {error.filename2}: "
    advice = {
        errno.ENOSPC: "free some space (or choose another place)",
        errno.EDQUOT: "free some space within your quota (or choose another place)",
        errno.EROFS: "choose a writable place",
        errno.EACCES: "check the permissions (or choose another place)",
        errno.EPERM: "check the permissions (or choose another place)",
    }.get(error.errno or 0)
    return f"{where}{reason}; " + (f"{advice}; " if advice else "") + KEPT


def interrupted_line() -> str:
    return f"interrupted; {KEPT}"


def quiet_abandoned_tasks() -> None:
    """After Ctrl-C, the judge calls in flight on a background loop (the trainer's reward loop) are
    abandoned on purpose; asyncio would log each as "Task was destroyed but it is pending!" at exit."""
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)


# Help screens name a value's kind as click does (FILE, TEXT, INTEGER), never typer's Python types
# (``<list[str]>``, ``<float range>``): a user reads ``--captions FILE``, not an annotation.
_PLAIN_KINDS = {"str": "TEXT", "int": "INTEGER", "float": "NUMBER", "path": "PATH", "file": "FILE",
                "directory": "DIR", "bool": "BOOLEAN"}  # fmt: skip
_TYPER_LABEL = re.compile(r"^<(?:list\[)?(?P<kind>[^\]>]*?)(?: range)?\]?>$")


def plain_kind(label: str) -> str:
    """``<list[str]>`` -> ``TEXT``, ``<float range>`` -> ``NUMBER``, ``<file>`` -> ``FILE``; choices
    (``a|b``) and anything else unchanged but for the brackets."""
    match = _TYPER_LABEL.match(label)
    kind = match.group("kind") if match else label.strip("<>")
    return _PLAIN_KINDS.get(kind, kind)


def plain_help_types(command) -> None:
    """Give every parameter of ``command`` (and of its subcommands) a plain kind in its help, and
    keep a hidden argument (an old spelling, such as ``data info DIR``) out of the usage line too:
    click hides it from the argument list only, so the usage would name what the help never lists."""
    for sub in getattr(command, "commands", {}).values():
        plain_help_types(sub)
    for param in getattr(command, "params", []):
        if getattr(param, "hidden", False) and param.param_type_name == "argument":
            param.get_usage_pieces = types.MethodType(lambda self, ctx: [], param)
        typer_label = getattr(param, "display_type", None)
        if typer_label is None or getattr(param, "_plain_kind", False):
            continue
        param._plain_kind = True
        param.display_type = types.MethodType(
            lambda self, ctx, label=typer_label: plain_kind(label(ctx)), param
        )


def renamed(value, old_value, flag: str, old_flag: str, *, required: bool = True):
    """The value of an option given under its name (``flag``) or its old, hidden spelling
    (``old_flag``, kept so that earlier scripts still run); both at once must agree."""
    from balcaprl.errors import UserError

    if value is not None and old_value is not None and value != old_value:
        raise UserError(f"{flag} and {old_flag} (its old spelling) give different values; give {flag} once")
    chosen = value if value is not None else old_value
    if chosen is None and required:
        raise UserError(f"give {flag}")
    return chosen
