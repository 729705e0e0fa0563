"""`balcaprl.progress.Progress`: plain periodic lines with count, rate and ETA where the output is not a
terminal (driven by a fake clock: no sleeping), a rich bar where it is, and nothing when disabled."""

import io
import threading

import pytest

from balcaprl.progress import Progress


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def plain(clock, stream, description="checking images", **kw):
    kw = {"total": 100, "unit": "images", "interval_s": 10, "heartbeat": False, **kw}
    return Progress(description, stream=stream, terminal=False, clock=clock, **kw)


def test_periodic_lines_with_count_rate_and_eta():
    clock, out = Clock(), io.StringIO()
    with plain(clock, out) as progress:
        clock.now = 5
        progress.advance(10)  # 5 s since the last line: too early for another
        clock.now = 10
        progress.advance(10)  # 20 images in 10 s: 2/s, 80 to go: 40 s
        clock.now = 15
        progress.advance(30)
        clock.now = 25
        progress.advance(30)  # 60 images since the line at 10 s, in 15 s: 4/s, 20 to go: 5 s
        clock.now = 30
    assert out.getvalue().splitlines() == [
        "checking images: started, 100 images",
        "checking images: 20/100 images (20%), 2.0 images/s, elapsed 0:00:10, ETA 0:00:40",
        "checking images: 80/100 images (80%), 4.0 images/s, elapsed 0:00:25, ETA 0:00:05",
        "checking images: done, 80/100 images in 0:00:30 (2.7 images/s)",
    ]


def test_total_known_later_and_an_absolute_position():
    clock, out = Clock(), io.StringIO()
    with plain(clock, out, description="judging", total=None, unit="captions") as progress:
        clock.now = 12
        progress.advance(30)
        progress.total = 90
        progress.description = "judging (resumed)"
        progress.status = "3 failed"
        clock.now = 24
        progress.completed = 60  # 30 in 12 s: 2.5/s, 30 to go: 12 s
    assert out.getvalue().splitlines() == [
        "judging: started",
        "judging: 30 captions, 2.5 captions/s, elapsed 0:00:12",
        "judging (resumed): 60/90 captions (67%), 2.5 captions/s, elapsed 0:00:24, ETA 0:00:12; 3 failed",
        "judging (resumed): done, 60/90 captions in 0:00:24 (2.5 captions/s); 3 failed",
    ]


def test_a_stalled_task_says_so_and_an_interrupted_one_says_where_it_stopped():
    clock, out = Clock(), io.StringIO()
    with pytest.raises(KeyboardInterrupt), plain(clock, out, total=50) as progress:
        clock.now = 3
        progress.advance(5)
        clock.now = 10
        progress.tick()  # the heartbeat's check: a line with the rate since the start
        clock.now = 70
        progress.tick()  # nothing advanced since the last line
        raise KeyboardInterrupt
    lines = out.getvalue().splitlines()
    assert lines[1] == "checking images: 5/50 images (10%), 0.5 images/s, elapsed 0:00:10, ETA 0:01:30"
    assert lines[2] == "checking images: 5/50 images (10%), elapsed 0:01:10, no progress for 0:01:07"
    assert lines[3] == "checking images: stopped (KeyboardInterrupt) at 5/50 images after 0:01:10"


def test_bytes_are_shown_in_kb_mb_gb():
    clock, out = Clock(), io.StringIO()
    with plain(clock, out, description="reading a.json", total=3_000_000_000, unit="B") as progress:
        clock.now = 20
        progress.advance(1_500_000_000)
    assert out.getvalue().splitlines()[1:] == [
        "reading a.json: 1.5 GB/3.0 GB (50%), 75.0 MB/s, elapsed 0:00:20, ETA 0:00:20",
        "reading a.json: done, 1.5 GB/3.0 GB in 0:00:20 (75.0 MB/s)",
    ]


def test_log_lines_and_disabled_progress():
    clock, out = Clock(), io.StringIO()
    with plain(clock, out) as progress:
        progress.log("step 10  P 0.5 [not markup]")
    assert out.getvalue().splitlines()[1] == "step 10  P 0.5 [not markup]"

    for terminal in (False, True):
        silent = io.StringIO()
        with Progress("x", total=3, stream=silent, terminal=terminal, enabled=False) as progress:
            progress.advance(3)
            progress.log("nothing")
        assert silent.getvalue() == "" and progress.completed == 3


class Signalling(io.StringIO):
    def __init__(self):
        super().__init__()
        self.wrote = threading.Event()

    def write(self, text):
        n = super().write(text)
        self.wrote.set()
        return n


def test_heartbeat_writes_while_nothing_advances():
    clock, out = Clock(), Signalling()
    progress = Progress("waiting", total=4, stream=out, terminal=False, interval_s=0.05, clock=clock)
    with progress:
        out.wrote.clear()  # (the start line)
        clock.now = 100  # the task's clock moves on; nothing calls the reporter
        assert out.wrote.wait(timeout=30), "the heartbeat wrote no line"
        thread = progress._heartbeat
    assert thread is not None and not thread.is_alive()  # stopped with the task
    assert "waiting: 0/4 items (0%), elapsed 0:01:40, no progress for 0:01:40" in out.getvalue()


class Tty(io.StringIO):
    def isatty(self):
        return True


def test_where_the_output_goes_decides_bar_or_lines(monkeypatch):
    monkeypatch.setenv("TERM", "xterm")
    assert Progress("x", stream=Tty())._terminal and not Progress("x", stream=io.StringIO())._terminal
    monkeypatch.setenv("TERM", "dumb")
    assert not Progress("x", stream=Tty())._terminal


def test_rich_bar_on_a_terminal(monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")  # rich's width for a file: whatever the runner's terminal is
    out = io.StringIO()
    with Progress("placing images", total=4, unit="images", stream=out, terminal=True) as progress:
        assert progress._rich is not None
        progress.advance(4)
        progress.log("a [b] line")
    text = " ".join(out.getvalue().split())
    assert "a [b] line" in text and "placing images" in text and "4/4" in text
    assert "started" not in text  # not the plain lines


def test_timing_is_elapsed_and_eta_at_this_runs_average_rate():
    clock, out = Clock(), io.StringIO()
    progress = plain(clock, out, total=200, unit="steps")
    assert progress.timing() == ""  # not started
    progress.completed = 50  # a resumed run: 50 steps were done before this one
    with progress:
        assert progress.timing() == "elapsed 0:00:00"  # no rate yet: no ETA
        clock.now = 40
        progress.completed = 70  # 20 steps in 40 s: 0.5 steps/s, 130 to go: 260 s
        assert progress.timing() == "elapsed 0:00:40, ETA 0:04:20"
    unknown = plain(clock, out, total=None)
    with unknown:
        clock.now = 100
        unknown.advance(5)
        assert unknown.timing() == "elapsed 0:01:00"  # no total: no ETA


@pytest.mark.parametrize("columns", ["40", "80", "300"])
def test_a_console_off_a_terminal_never_wraps_a_line_or_a_table(monkeypatch, columns):
    from rich.table import Table

    from balcaprl.progress import make_console

    monkeypatch.setenv("COLUMNS", columns)  # rich's width for a file otherwise
    out = io.StringIO()
    console = make_console(out)
    line = "step    12  P 0.512  R 0.430  L 0.801  len 48 tok (x0.97)  loss -6.3700  " + "x" * 100
    console.print(line, highlight=False)
    table = Table(title="variants")
    for column in ("variant", "b-CapScore"):
        table.add_column(column)
    table.add_row("no-length-penalty-and-no-mask", "0.2345678901")
    console.print(table)
    lines = out.getvalue().splitlines()
    assert lines[0] == line
    assert any("│ no-length-penalty-and-no-mask │ 0.2345678901 │" in row for row in lines)
    assert "…" not in out.getvalue()
