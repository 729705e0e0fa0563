"""Where a command's results go: never over earlier results by surprise, never after paying for them.

One policy for every command that writes results (``score``, ``evaluate``, ``caption``,
``data prepare``, ``data recaption``, ``synthetic build``, ``synthetic sft``,
``synthetic init-policy``, ``judge audit``, ``verl export``, ``train``):

* A new or empty output place is simply written.
* One that already holds results is refused with a message naming what is there, unless
* ``--resume``: continue in place; what is finished is reused, nothing finished is paid for again
  (only commands that can continue offer it: ``offers_resume``);
* ``--overwrite``: replace it. The new results are built in a temporary sibling folder
  (``.NAME.overwrite``) while the old ones stay untouched; at the end the two are exchanged in one
  step (``renameat2(RENAME_EXCHANGE)`` on Linux; two renames where that is not available) and the
  old folder is deleted, so no stale file of the old results survives. A command names what the new
  folder starts with (``copy``: a judge cache, which is not a result; results of parts it does not
  redo) and what of a killed replacement's leftover it keeps (``resumable``: its record of paid
  work), so even a replacement that crashed never pays twice.

Before any work starts, the place is created and a probe file is written and removed there, so a
read-only folder, or a file where a folder should be, is found before the first paid call, not
after the last one (:func:`ensure_writable_dir`).

One writer per place: every claim takes an exclusive lock on the place first (:func:`lock_output`,
``flock`` on ``.NAME.lock`` beside it), so a second command on the same place, whatever its flags, is
refused in one line instead of paying for the same calls twice or interleaving two runs' files. The
lock file lies beside the place, not in it, because ``--overwrite`` exchanges or renames the folder
itself; the kernel drops a ``flock`` when its process ends, so a crashed run never blocks the next.

:func:`shortfall` is the other half of an honest exit status: the reason a run that did its work
still produced too little (exit status 1).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from stat import S_ISREG
from typing import Literal

from balcaprl.errors import OutputError, UserError

Mode = Literal["new", "resume", "overwrite"]
REFUSAL_HINT = "pass --resume to continue them, --overwrite to replace them, or choose another place"
REFUSAL_HINT_NO_RESUME = "pass --overwrite to replace them, or choose another place"


def choose_mode(resume: bool, overwrite: bool) -> Mode:
    """The mode the two flags ask for; both at once is a user error."""
    if resume and overwrite:
        raise UserError("give --resume or --overwrite, not both")
    return "resume" if resume else "overwrite" if overwrite else "new"


def present(folder: Path, names: Iterable[str]) -> list[str]:
    """Which of ``names`` (file or folder names, ``*`` patterns allowed) exist in ``folder``."""
    found: list[str] = []
    for name in names:
        hits = sorted(p.name for p in folder.glob(name)) if "*" in name else [name] * (folder / name).exists()
        found += [hit for hit in hits if hit not in found]
    return found


def remove(folder: Path, names: Iterable[str]) -> None:
    """Delete the entries ``names`` (files or folders) of ``folder``; absent ones are fine."""
    for name in names:
        entry = Path(folder) / name
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink(missing_ok=True)


def _reason(error: OSError) -> str:
    return error.strerror or type(error).__name__


def ensure_writable_dir(path: Path | str, what: str = "--out") -> Path:
    """Create ``path`` (and its parents) if needed and prove a file can be written in it.

    Raises :class:`~balcaprl.errors.OutputError` naming ``what`` (the flag or setting) and the path.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise OutputError(f"{what} {path} is a file; give a folder (new or empty) for the results")
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".balcaprl-write-probe-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as error:
        raise OutputError(
            f"{what} {path}: cannot write there ({_reason(error)}); choose a writable folder"
        ) from None
    return path


@dataclass(frozen=True)
class _Held:
    fd: int
    path: Path


_HELD: dict[str, _Held] = {}  # lock file -> this process's hold on it (re-entrant within a process)


def _lock_file(place: Path) -> Path:
    """``.NAME.lock`` beside ``place``; inside it when its parent cannot take a file (a read-only parent)."""
    beside = place.parent / f".{place.name}.lock"
    try:
        os.close(_open_lock(beside))
        return beside
    except OSError as error:
        if error.errno not in (errno.EACCES, errno.EPERM, errno.EROFS) or not place.is_dir():
            raise
        return place / ".balcaprl.lock"


def _open_lock(lock: Path) -> int:
    """``lock`` opened (created if absent) without following a link: a symbolic link planted at its
    name fails with ``ELOOP`` (``O_NOFOLLOW``), so the PID written into a lock file never lands in a
    file the link points at. Whatever was opened must then be a plain file of one name (``fstat``):
    a hard link to another file, a FIFO or a device is refused with ``ELOOP`` too."""
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o666)
    stat = os.fstat(fd)
    if not S_ISREG(stat.st_mode) or stat.st_nlink > 1:  # 0: a releaser just deleted it (retried)
        os.close(fd)
        raise OSError(errno.ELOOP, "not a plain file of its own", str(lock))
    return fd


def _planted(lock: Path, place: Path, what: str) -> OutputError:
    """The refusal of a lock file that is a link (or no plain file): it is left as it is."""
    shown = (
        f"a symbolic link to {os.readlink(lock)}" if os.path.islink(lock) else "not a plain file of its own"
    )
    return OutputError(
        f"{what} {place}: its lock file {lock} is {shown}; balcaprl never writes through a link: "
        "remove the link (what it points at is left as it is) and run again"
    )


def lock_output(path: Path | str, what: str = "--out") -> Path:
    """Hold an exclusive lock on the output place ``path`` until :func:`release_output_locks` or the
    end of the process; a place another process holds is refused with :class:`OutputError`.

    Returns the lock file. Taking it again in the same process is a no-op (one command may claim a
    place twice). A released lock file is deleted; a lock file left by a killed process is taken over
    (its ``flock`` died with it).
    """
    place = Path(os.path.abspath(Path(path).expanduser()))
    try:
        place.parent.mkdir(parents=True, exist_ok=True)
        real = Path(os.path.realpath(place))  # one lock however the place is named (symlinks)
        lock = _lock_file(real)
    except OSError as error:
        if error.errno == errno.ELOOP and error.filename is not None:
            raise _planted(Path(error.filename), place, what) from None
        raise OutputError(
            f"{what} {place}: cannot write there ({_reason(error)}); choose a writable folder"
        ) from None
    key = os.path.realpath(lock)
    if key in _HELD:
        return lock
    while True:
        try:
            fd = _open_lock(lock)
        except OSError as error:
            if error.errno == errno.ELOOP:
                raise _planted(lock, place, what) from None
            raise OutputError(f"{what} {place}: cannot lock {lock} ({_reason(error)})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
            os.close(fd)
            if error.errno not in (errno.EAGAIN, errno.EACCES):
                raise OutputError(f"{what} {place}: cannot lock {lock} ({_reason(error)})") from None
            by = f" (pid {holder})" if holder.isdigit() else ""
            raise OutputError(
                f"{what} {place} is in use by another balcaprl command{by}; wait for it to finish or "
                "choose another place (one writer per output place)"
            ) from None
        try:  # the file we locked must still be the one at the path: a releaser deletes it
            if os.stat(lock).st_ino == os.fstat(fd).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)  # for the refusal message of a second command
    _HELD[key] = _Held(fd, lock)
    return lock


def release_output_locks() -> None:
    """Release every output lock this process holds (the command line does at the end of a command)."""
    while _HELD:
        _, held = _HELD.popitem()
        with contextlib.suppress(OSError):
            os.unlink(held.path)  # before the unlock: whoever locks next makes a fresh file
        os.close(held.fd)


@dataclass
class OutputDir:
    """A claimed output folder: write into :attr:`work`; :meth:`commit` puts the results at :attr:`final`.

    :attr:`work` is :attr:`final` itself, except when replacing (``mode == "overwrite"`` and the
    folder held results): then it is the temporary sibling the new results are built in.
    """

    final: Path
    work: Path
    mode: Mode

    @property
    def replacing(self) -> bool:
        return self.work != self.final

    def commit(self) -> Path:
        """Swap the new results in (when replacing) and delete the old ones; returns :attr:`final`."""
        if not self.replacing:
            return self.final
        if not self.final.exists():
            os.rename(self.work, self.final)
        elif _exchange(self.work, self.final):
            shutil.rmtree(self.work)  # now the old results
        else:
            aside = _sibling(self.final, "replaced")
            shutil.rmtree(aside, ignore_errors=True)
            os.rename(self.final, aside)
            os.rename(self.work, self.final)
            shutil.rmtree(aside)
        self.work = self.final
        return self.final

    @contextlib.contextmanager
    def committing(self) -> Iterator[OutputDir]:
        """``with out.committing():`` commits when the block ends without an exception. After one,
        the old results stay as they were, and a replacement's folder stays for the next
        ``--overwrite`` (which keeps its ``resumable`` entries and rebuilds the rest)."""
        yield self
        self.commit()


def _sibling(path: Path, role: str) -> Path:
    return path.parent / f".{path.name}.{role}"


def _exchange(a: Path, b: Path) -> bool:
    """Exchange two paths atomically (Linux ``renameat2``); False where that is not possible."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    at_fdcwd, rename_exchange = -100, 2
    return renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0


def _refuse_results(
    final: Path, what: str, results: Callable[[Path], Sequence[str]], mode: Mode, offers_resume: bool
) -> list[str]:
    """The results ``final`` holds; refused (:class:`UserError`) when there are some and ``mode`` is new."""
    found = list(results(final)) if final.is_dir() else []
    if found and mode == "new":
        shown = ", ".join(found[:4]) + (f" and {len(found) - 4} more" if len(found) > 4 else "")
        hint = REFUSAL_HINT if offers_resume else REFUSAL_HINT_NO_RESUME
        raise UserError(f"{what} {final} already holds results ({shown}); {hint}")
    return found


def claim_output_dir(
    path: Path | str,
    *,
    what: str = "--out",
    results: Callable[[Path], Sequence[str]],
    resume: bool = False,
    overwrite: bool = False,
    copy: Sequence[str] = (),
    resumable: Sequence[str] = (),
    offers_resume: bool = True,
) -> OutputDir:
    """Apply the policy (module docstring) to the output folder ``path`` before any work starts.

    ``results(folder)``: the names of the results ``folder`` holds (empty: nothing to protect).
    When replacing: ``copy`` names entries (``*`` patterns allowed) copied from the old folder into
    the new one at the start; ``resumable`` names entries a killed replacement left that are kept
    (everything else it left is deleted). ``offers_resume``: False for a command without
    ``--resume`` (its refusal then names ``--overwrite`` only). Raises
    :class:`~balcaprl.errors.UserError` (refusal) or :class:`~balcaprl.errors.OutputError` (cannot
    write).
    """
    final = Path(path).expanduser()
    mode = choose_mode(resume, overwrite)
    if final.exists() and not final.is_dir():
        raise OutputError(f"{what} {final} is a file; give a folder (new or empty) for the results")
    lock_output(final, what)  # first: "in use" says more than what a running command has written so far
    found = _refuse_results(final, what, results, mode, offers_resume)
    if not (found and mode == "overwrite"):
        return OutputDir(final, ensure_writable_dir(final, what), mode)
    work = _sibling(final, "overwrite")
    if work.is_dir():  # a killed replacement: its results were never swapped in
        kept = set(present(work, resumable))
        remove(work, [entry.name for entry in work.iterdir() if entry.name not in kept])
    ensure_writable_dir(work, what)
    for name in present(final, copy):
        source, target = final / name, work / name
        if target.exists():
            continue
        if source.is_dir():
            shutil.copytree(source, target)
        else:
            shutil.copy2(source, target)
    return OutputDir(final, work, mode)


def claim_in_place(
    path: Path | str,
    *,
    what: str,
    results: Callable[[Path], Sequence[str]],
    resume: bool = False,
    overwrite: bool = False,
) -> Mode:
    """The policy for a command that rewrites a folder in place (``data recaption``): refuse when it
    holds results of an earlier run unless ``resume``/``overwrite``; check it can be written. The
    caller discards its own record of the earlier run for ``overwrite``."""
    folder = Path(path).expanduser()
    mode = choose_mode(resume, overwrite)
    if folder.is_dir():
        lock_output(folder, what)
    found = list(results(folder)) if folder.is_dir() else []
    if found and mode == "new":
        raise UserError(f"{what} {folder} already holds results ({', '.join(found)}); {REFUSAL_HINT}")
    if folder.is_dir():
        ensure_writable_dir(folder, what)
    return mode


def claim_output_file(
    path: Path | str,
    *,
    what: str = "--out",
    partial: Sequence[Path] = (),
    resume: bool = False,
    overwrite: bool = False,
) -> Mode:
    """The same policy for a result that is one file (written atomically at the end, so replacing
    it needs no temporary folder): ``path`` or any ``partial`` file (an unfinished run's record)
    existing means results are there. ``--overwrite`` deletes the partial files; the caller's
    atomic write replaces ``path``. Checks that the folder can be written."""
    target = Path(path).expanduser()
    mode = choose_mode(resume, overwrite)
    if target.is_dir():
        raise OutputError(f"{what} {target} is a folder; give a file name for the results")
    lock_output(target, what)
    found = [p.name for p in (target, *map(Path, partial)) if p.exists()]
    if found and mode == "new":
        raise UserError(f"{what} {target} already has results ({', '.join(found)}); {REFUSAL_HINT}")
    ensure_writable_dir(target.parent, what)
    if mode == "overwrite":
        for stale in partial:
            Path(stale).unlink(missing_ok=True)
    return mode


def shortfall(
    done: int, total: int, min_share: float, *, unit: str, verb: str, flag: str = "--min-scored"
) -> str | None:
    """Why ``done`` of ``total`` is not enough (``min_share`` of them must succeed), or None.

    An empty input is never enough: a run over nothing has no result. E.g.
    ``shortfall(3, 5, 1.0, unit="captions", verb="scored")`` ->
    ``"only 3 of 5 captions scored (60.0%; --min-scored 1 asks for 100%)"``.
    """
    if total == 0:
        return f"no {unit} in the input: nothing {verb}"
    if done == 0:
        return f"none of the {total} {unit} {verb}"
    if done < min_share * total:
        return (
            f"only {done} of {total} {unit} {verb} ({100 * done / total:.1f}%; "
            f"{flag} {min_share:g} asks for {100 * min_share:g}%)"
        )
    return None
