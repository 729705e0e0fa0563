"""Progress of long work: a rich bar on a terminal, plain periodic lines in a log file or CI.

One reporter for every long task (preparing a dataset, re-captioning, judging, training)::

    from balcaprl.progress import Progress

    with Progress("checking images", total=len(todo), unit="images", enabled=show) as progress:
        for result in results:
            progress.advance()  # or advance(n)

    progress.total = n  # unknown at first (None)? set it when it is known
    progress.completed = step  # jump to an absolute position (a trainer's global step)
    progress.description = "..."  # rename the task
    progress.status = "loss 0.123"  # a short note shown after the counts
    progress.log("a line")  # printed above the bar, or as a line of its own
    progress.timing()  # "elapsed 0:01:40, ETA 0:05:00": for a line the caller writes itself

Where the output goes decides how it looks. On a terminal (``stream.isatty()``, stderr by default): a
rich progress bar. Anywhere else (redirected to a file, CI): a line when the task starts, one every
``interval_s`` seconds while it runs, from a background thread, so a task that makes no progress
says so instead of going quiet, and one at the end::

    checking images: started, 5,000 images
    checking images: 1,200/5,000 images (24%), 40.0 images/s, elapsed 0:00:30, ETA 0:01:35
    checking images: done, 5,000/5,000 images in 0:02:00 (41.7 images/s)

The rate and ETA in a periodic line are those of the interval since the line before (a resumed task
that skips finished work quickly at first does not get an ETA that is too hopeful); the last line
has the average. ``unit="B"`` shows amounts and rates in kB/MB/GB. ``enabled=False`` shows nothing
(``--no-progress``). Usable as a context manager, or with :meth:`Progress.start` and
:meth:`Progress.close` where a task starts and ends in different callbacks.

:func:`make_console` is the rich console for a command's own output (tables, log lines): rich wraps
everything at 80 columns when it does not write to a terminal, which split each training step's
line in two in a log file and cut table cells to ``0.2…``; off a terminal it has no width limit.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

UNWRAPPED_WIDTH = 10_000  # "no limit" for rich, which needs a number: lines are never this long


class Progress:
    """Reports how far one long task has come; see the module docstring.

    Args:
        description: what the task is doing, e.g. ``"checking images"``.
        total: how many units the task has, or None while unknown (settable later).
        unit: what is counted, e.g. ``"images"``; ``"B"`` formats byte counts (kB, MB, GB).
        enabled: False shows nothing at all.
        stream: where to write; default ``sys.stderr`` (stdout stays free for a command's output).
        terminal: force the rich bar (True) or plain lines (False); default: ``stream.isatty()``
            and ``TERM`` is not ``dumb``.
        interval_s: seconds between plain lines.
        transient: remove the rich bar when the task ends (plain lines are never removed).
        heartbeat: write plain lines from a background thread even while nothing advances; False
            writes them only when the task advances (tests that drive ``clock`` themselves).
        clock: monotonic time in seconds; replaceable for tests.
    """

    def __init__(
        self,
        description: str,
        total: int | float | None = None,
        *,
        unit: str = "items",
        enabled: bool = True,
        stream: TextIO | None = None,
        terminal: bool | None = None,
        interval_s: float = 30.0,
        transient: bool = False,
        heartbeat: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.unit = unit
        self.enabled = enabled
        self.interval_s = interval_s
        self.transient = transient
        self.heartbeat = heartbeat
        self._stream = stream if stream is not None else sys.stderr
        self._terminal = _is_terminal(self._stream) if terminal is None else terminal
        self._clock = clock
        self._description = description
        self._total = total
        self._status = ""
        self._completed: float = 0
        self._lock = threading.Lock()
        self._started_at: float | None = None
        self._completed_at_start: float = 0  # a resumed task's rate counts only this run's work
        self._last_line: tuple[float, float] = (0.0, 0.0)  # (time, completed) at the last plain line
        self._last_advance_at = 0.0
        self._rich: Any = None
        self._task: Any = None
        self._heartbeat: threading.Thread | None = None
        self._stop = threading.Event()

    # ---------------------------------------------------------------------------------------------
    # The API

    @property
    def total(self) -> int | float | None:
        return self._total

    @total.setter
    def total(self, value: int | float | None) -> None:
        with self._lock:
            self._total = value
            self._update_bar(total=value)

    @property
    def completed(self) -> float:
        return self._completed

    @completed.setter
    def completed(self, value: float) -> None:
        with self._lock:
            self._move_to(value)

    @property
    def description(self) -> str:
        return self._description

    @description.setter
    def description(self, value: str) -> None:
        with self._lock:
            self._description = value
            self._update_bar(description=value)

    @property
    def status(self) -> str:
        return self._status

    @status.setter
    def status(self, value: str) -> None:
        with self._lock:
            self._status = value
            self._update_bar(status=value)

    def advance(self, n: float = 1) -> None:
        """``n`` more units are done (safe to call from several threads)."""
        with self._lock:
            self._move_to(self._completed + n)

    def _move_to(self, value: float) -> None:
        if value != self._completed:
            self._last_advance_at = self._clock()
        self._completed = value
        self._update_bar(completed=value)
        self._maybe_line()

    def log(self, message: str) -> None:
        """Print a line of its own (above the bar on a terminal; never interpreted as markup)."""
        if not self.enabled:
            return
        with self._lock:
            if self._rich is not None:
                self._rich.console.print(message, markup=False, highlight=False, soft_wrap=True)
            else:
                self._write(message)

    def timing(self) -> str:
        """``elapsed H:MM:SS, ETA H:MM:SS`` at this run's average rate (the ETA once there is a rate
        and a total), for a caller's own line (a training step's); "" before :meth:`start`."""
        if self._started_at is None:
            return ""
        spent = self._clock() - self._started_at
        parts = [f"elapsed {_duration(spent)}"]
        rate = (self._completed - self._completed_at_start) / spent if spent > 0 else 0.0
        if rate > 0 and self._total is not None:
            parts.append(f"ETA {_duration(max(0.0, self._total - self._completed) / rate)}")
        return ", ".join(parts)

    def start(self) -> Progress:
        """Show the task (what ``with`` does on entry); returns self."""
        if not self.enabled or self._started_at is not None:
            return self
        now = self._clock()
        self._started_at = self._last_advance_at = now
        self._completed_at_start = self._completed
        self._last_line = (now, self._completed)
        if self._terminal:
            self._rich = self._rich_progress()
            self._rich.start()
            self._task = self._rich.add_task(
                self._description, total=self._total, completed=self._completed, status=self._status
            )
        else:
            total = f", {self._amount(self._total)}" if self._total is not None else ""
            self._write(f"{self._description}: started{total}")
            if self.heartbeat:
                self._stop.clear()
                self._heartbeat = threading.Thread(target=self._beat, name="balcaprl-progress", daemon=True)
                self._heartbeat.start()
        return self

    def close(self, error: BaseException | None = None) -> None:
        """End the task (what ``with`` does on exit): the last line, or the bar's final state."""
        if self._started_at is None:
            return
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join()
            self._heartbeat = None
        with self._lock:
            if self._rich is not None:
                self._rich.stop()
                self._rich = None
            else:
                self._write(self._final_line(error))
            self._started_at = None

    def __enter__(self) -> Progress:
        return self.start()

    def __exit__(self, kind: Any, error: BaseException | None, traceback: Any) -> None:
        self.close(error)

    def tick(self) -> None:
        """Write a plain line if one is due (the heartbeat thread calls this; so does every advance)."""
        with self._lock:
            self._maybe_line()

    # ---------------------------------------------------------------------------------------------
    # Plain lines

    def _beat(self) -> None:
        # Wakes every second (not every interval), so a line is never more than a second late.
        while not self._stop.wait(min(self.interval_s, 1.0)):
            self.tick()

    def _maybe_line(self) -> None:
        if self._started_at is None or self._rich is not None:
            return
        now = self._clock()
        if now - self._last_line[0] >= self.interval_s:
            self._write(self._periodic_line(now))
            self._last_line = (now, self._completed)

    def _periodic_line(self, now: float) -> str:
        assert self._started_at is not None
        since, then = self._last_line
        done, total = self._completed, self._total
        parts = [f"{self._amount(done)}" if total is None else f"{self._count(done)}/{self._amount(total)}"]
        if total:
            parts[0] += f" ({100 * done / total:.0f}%)"
        rate = (done - then) / (now - since)
        if rate > 0:
            parts.append(self._rate(rate))
        parts.append(f"elapsed {_duration(now - self._started_at)}")
        if rate > 0 and total is not None:
            parts.append(f"ETA {_duration(max(0.0, total - done) / rate)}")
        elif rate <= 0:
            parts.append(f"no progress for {_duration(now - self._last_advance_at)}")
        status = f"; {self._status}" if self._status else ""
        return f"{self._description}: " + ", ".join(parts) + status

    def _final_line(self, error: BaseException | None) -> str:
        assert self._started_at is not None
        spent = self._clock() - self._started_at
        done, total = self._completed, self._total
        amount = self._amount(done) if total is None else f"{self._count(done)}/{self._amount(total)}"
        rate = f" ({self._rate(done / spent)})" if spent > 0 and done > 0 else ""
        status = f"; {self._status}" if self._status else ""
        if error is None:
            return f"{self._description}: done, {amount} in {_duration(spent)}{rate}{status}"
        return f"{self._description}: stopped ({type(error).__name__}) at {amount} after {_duration(spent)}"

    def _write(self, line: str) -> None:
        try:
            self._stream.write(line + "\n")
            self._stream.flush()
        except (OSError, ValueError):  # a closed or broken stream must not stop the work it reports on
            pass

    def _count(self, n: float) -> str:
        return _bytes(n) if self.unit == "B" else f"{n:,.0f}"

    def _amount(self, n: float) -> str:
        return _bytes(n) if self.unit == "B" else f"{n:,.0f} {self.unit}"

    def _rate(self, per_second: float) -> str:
        if self.unit == "B":
            return f"{_bytes(per_second)}/s"
        return f"{per_second:,.1f} {self.unit}/s"

    # ---------------------------------------------------------------------------------------------
    # The rich bar

    def _rich_progress(self) -> Any:
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            MofNCompleteColumn,
            TaskProgressColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )
        from rich.progress import Progress as RichProgress

        count = DownloadColumn() if self.unit == "B" else MofNCompleteColumn()
        return RichProgress(
            TextColumn("{task.description}", style="bold", markup=False),
            BarColumn(),
            count,
            TaskProgressColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[status]}", markup=False),
            console=make_console(self._stream, terminal=True),
            transient=self.transient,
        )

    def _update_bar(self, **fields: Any) -> None:
        if self._rich is not None:
            self._rich.update(self._task, **fields)


def make_console(file: TextIO | None = None, terminal: bool | None = None) -> Any:
    """A rich console for a command's output on ``file`` (default stdout): the terminal's width on a
    terminal; anywhere else no width limit, so a log line or a table row stays one line.
    ``terminal`` overrides the test (default: ``file.isatty()`` and ``TERM`` is not ``dumb``)."""
    from rich.console import Console

    if terminal is None:
        terminal = _is_terminal(file if file is not None else sys.stdout)
    return Console(file=file, width=None if terminal else UNWRAPPED_WIDTH)


def _is_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty()) and os.environ.get("TERM") != "dumb"
    except ValueError:  # a closed stream
        return False


def _duration(seconds: float) -> str:
    """``H:MM:SS``, as rich shows elapsed and remaining time."""
    whole = int(round(seconds))
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


def _bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")
