"""Reading and writing files: atomic writes, and text that must be UTF-8.

Writes go through a temporary file in the same folder and an atomic rename, so an interruption
never leaves a half-written file that looks complete. Work that is paid for as it goes (judge calls,
generated captions) is recorded in a :class:`JsonlLog` as each piece finishes, so a killed run
loses at most the pieces in flight.

Text inputs (caption and reference files, benchmark annotations) must be UTF-8. Bytes that are not
are an error naming the file, the byte offset and the line, never replaced silently: a caption file
in another encoding (Latin-1, Windows-1252) would otherwise have every accented letter turned into
U+FFFD and then be judged as if the captioner had written that.

A write the system refuses (a full disk, an I/O error) raises an ``OSError`` that names the file
(:func:`naming`): a write to an open file reports no path of its own, and the command line prints the
error in one line with its path (``balcaprl.cli.common.system_error_line``).
"""

from __future__ import annotations

import codecs
import contextlib
import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from balcaprl.errors import InputError, MissingInputError


def jsonl_lines(text: str) -> list[str]:
    """The lines of JSONL text: split at ``\n`` only. ``str.splitlines`` also splits at U+2028, U+0085
    and other separators that JSON allows unescaped inside a string (``ensure_ascii=False`` writes
    them), which would cut a caption in two."""
    return text.split("\n")


def jsonl_values(text: str, where: str) -> Iterator[tuple[int, Any]]:
    """``(line number, value)`` of each non-blank line of JSONL ``text`` (:func:`jsonl_lines`); a line
    that does not parse is an :class:`InputError` naming ``where`` and the line, ``a.jsonl:7: not
    JSON (...)``. What each value must be is the caller's to check."""
    for number, line in enumerate(jsonl_lines(text), 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as error:
            raise InputError(f"{where}:{number}: not JSON ({error.msg})") from None
        yield number, value


@contextlib.contextmanager
def naming(path: Path | str) -> Iterator[None]:
    """Give an ``OSError`` raised inside the block ``path`` as its file name when it has none (a
    ``write``/``flush``/``fsync`` on an open file fails with no path); same errno, same subclass."""
    try:
        yield
    except OSError as error:
        if error.filename is not None or error.errno is None:
            raise
        raise OSError(error.errno, error.strerror or os.strerror(error.errno), str(path)) from error


def _process_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _process_umask()
# The longest line a text input may have: a caption, a reference, a benchmark row, or a whole JSON
# document written on one line (CapArena's annotations are ~1 MB). Inputs are read in chunks and
# refused at the first line longer than this, so `--captions /dev/zero` is an error, not a MemoryError.
MAX_LINE_BYTES = 64 * 2**20
_CHUNK_BYTES = 2**20  # read once, at import (setting it is process-wide, so not per write)


def temporary_sibling(path: Path | str) -> tuple[int, str]:
    """An open ``(fd, name)`` for a new hidden file beside ``path``, to be renamed onto it when done.

    ``mkstemp`` makes the file readable by its owner only; it gets the mode any new file would get
    (0666 less the umask), so results on a shared file system stay readable by the rest of a team.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.fchmod(fd, 0o666 & ~_UMASK)
    return fd, tmp


def atomic_write_bytes(path: Path | str, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file in the same folder and an atomic rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with naming(path):
        fd, tmp = temporary_sibling(path)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def atomic_write_text(path: Path | str, text: str) -> None:
    r"""UTF-8 ``text`` to ``path``, atomically (see :func:`atomic_write_bytes`). A lone surrogate in it
    (a path the OS gave with a byte that is not UTF-8, ``imgs\xff`` as ``imgs\udcff``; a text that is
    no valid Unicode, a row refused as ``bad_input``) is written as its escape, ``\udcff``, which in a
    JSON file reads back as the same text, instead of failing the write after the work was done."""
    atomic_write_bytes(path, text.encode("utf-8", errors="backslashreplace"))


atomic_write_json_text = atomic_write_text  # the name JSON writers use: the escape reads back as the text


# An error handler for text shown to a person (the command line's stdout and stderr): a byte the OS
# gave in a path that is not UTF-8 (decoded as a surrogate, U+DC80..U+DCFF) is shown as the byte,
# ``\xff``, any other character that cannot be encoded as its ``\u`` escape; never an exception.
SHOWN_ERRORS = "balcaprl.shown"


def _shown(error: UnicodeError) -> tuple[str, int]:
    if not isinstance(error, UnicodeEncodeError):
        raise error
    bad = error.object[error.start : error.end]
    shown = "".join(
        f"\\x{ord(c) - 0xDC00:02x}" if 0xDC80 <= ord(c) <= 0xDCFF else f"\\u{ord(c):04x}" for c in bad
    )
    return shown, error.end


codecs.register_error(SHOWN_ERRORS, _shown)


def decode_utf8(data: bytes, where: str) -> str:
    """``data`` as UTF-8 text (a leading byte-order mark dropped); :class:`InputError` naming
    ``where``, the byte offset and the line of the first byte that is not UTF-8."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        bad = data[error.start : error.start + 4].hex(" ")
        raise InputError(
            f"{where}: not UTF-8 at byte {error.start} (line {line}: bytes {bad}); "
            "re-save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)"
        ) from None


def invalid_unicode(text: str) -> str | None:
    """Why ``text`` is not valid Unicode, or None. Valid UTF-8 can still carry a lone surrogate through
    a JSON escape (``"\\ud800"``): such a string cannot be written, hashed as UTF-8 or sent anywhere, so
    the row that holds it is refused (``bad_input``) instead of failing the whole run."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        return f"not valid Unicode: a lone surrogate U+{ord(text[error.start]):04X} at character {error.start + 1}"
    return None


def unicode_refusal(texts: Iterable[tuple[str, str]], where: str) -> str | None:
    """Why a row is refused (``bad_input``), naming what and where, for the first of its ``(what,
    text)`` pairs that is not valid Unicode (:func:`invalid_unicode`), e.g. ``the caption of image
    'a.jpg' is not valid Unicode: a lone surrogate U+D800 at character 7``; None when all are valid.
    Every path that would send such a text to a judge refuses its row with this instead: cleaning
    it (U+FFFD for the surrogate) would have the judge score a text nobody wrote."""
    for what, text in texts:
        reason = invalid_unicode(text)
        if reason is not None:
            return f"the {what} of {where} is {reason}"
    return None


def usable_unicode(rows: list[tuple[str, str]], what: str) -> tuple[list[tuple[str, str]], dict[int, str]]:
    """``rows`` of ``(image, text)`` with every text writable (a lone surrogate shown as its escape),
    and why each row that held one is refused (``bad_input``, :func:`unicode_refusal`): it is never
    sent to the judge."""
    usable, refused = [], {}
    for i, (image, text) in enumerate(rows):
        reason = unicode_refusal([(what, image), (what, text)], "this row")
        if reason is not None:
            refused[i] = reason
            image, text = (t.encode("utf-8", "backslashreplace").decode("utf-8") for t in (image, text))
        usable.append((image, text))
    return usable, refused


def read_utf8_text(path: Path | str, what: str = "") -> str:
    """The UTF-8 text of ``path`` (see :func:`decode_utf8`); a missing or unreadable file is an
    :class:`InputError` too. ``what`` names the input in messages, e.g. ``"--captions"``."""
    path = Path(path)
    label = f"{what} {path}".strip()
    try:
        data = _read_bounded(path, label)
    except FileNotFoundError:
        raise MissingInputError(f"{label}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{label} is a folder; give a file") from None
    except OSError as error:
        raise InputError(f"{label}: cannot read it ({error.strerror or error})") from None
    return decode_utf8(data, label)


def _read_bounded(path: Path, label: str) -> bytes:
    """The bytes of ``path``, read in chunks; :class:`InputError` at a line over :data:`MAX_LINE_BYTES`."""
    chunks: list[bytes] = []
    line_start = 0  # offset of the current line's first byte
    size = 0
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK_BYTES):
            newline = chunk.rfind(b"\n")
            if newline >= 0:
                line_start = size + newline + 1
            size += len(chunk)
            if size - line_start > MAX_LINE_BYTES:
                line = sum(c.count(b"\n") for c in chunks) + chunk.count(b"\n", 0, newline + 1) + 1
                raise InputError(
                    f"{label}: line {line} is longer than {MAX_LINE_BYTES // 2**20} MiB (the limit for one "
                    "line of a text input); is it the right file?"
                )
            chunks.append(chunk)
    return b"".join(chunks)


class JsonlLog:
    """An append-only JSONL record that survives its process being killed at any moment.

    Each :meth:`append` writes one line and flushes it to the operating system at once (a killed
    process loses nothing written); every ``sync_every`` lines, and on :meth:`close`, the file is
    also fsynced (a power cut loses at most the lines since). A last line cut short by an
    interruption is dropped when the record is read back, so the file stays valid JSONL.
    """

    def __init__(self, path: Path | str, sync_every: int = 32) -> None:
        self.path = Path(path)
        self.sync_every = sync_every
        self._handle: IO[str] | None = None
        self._unsynced = 0

    def read(self) -> list[dict[str, Any]]:
        """Every complete record in the file, in order (none if the file does not exist)."""
        return [record for _, record in self.scan()]

    def scan(self) -> Iterator[tuple[int, dict[str, Any]]]:
        """``(byte offset, record)`` of every complete record, in order, read line by line (a long
        record stays on disk: :meth:`at` reads one back by its offset)."""
        try:
            handle = self.path.open("r+b")
        except FileNotFoundError:
            return
        with handle:
            offset = 0
            for line in handle:
                if not line.endswith(b"\n"):  # a line cut by an interruption
                    handle.truncate(offset)
                    return
                try:
                    record = json.loads(line.decode("utf-8", errors="replace"))
                except json.JSONDecodeError:
                    record = None
                if isinstance(record, dict):
                    yield offset, record
                offset += len(line)

    def at(self, offset: int) -> dict[str, Any]:
        """The record that starts at byte ``offset`` (one :meth:`scan` gave)."""
        if self._handle is not None:
            self._handle.flush()
        with self.path.open("rb") as handle:
            handle.seek(offset)
            return json.loads(handle.readline().decode("utf-8", errors="replace"))

    def append(self, record: dict[str, Any] | str) -> None:
        """Append ``record``: an object, or its JSON text already made (one line, no newline)."""
        line = record if isinstance(record, str) else json.dumps(record, ensure_ascii=False)
        with naming(self.path):
            if self._handle is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                # backslashreplace: a lone surrogate (no valid Unicode, in a refused row's text) is
                # written as its JSON escape, which reads back as the same text
                self._handle = self.path.open("a", encoding="utf-8", errors="backslashreplace")
            self._handle.write(line + "\n")
            self._handle.flush()
        self._unsynced += 1
        if self._unsynced >= self.sync_every:
            self.sync()

    def sync(self) -> None:
        if self._handle is not None and self._unsynced:
            with naming(self.path):
                os.fsync(self._handle.fileno())
            self._unsynced = 0

    def close(self) -> None:
        if self._handle is not None:
            handle, self._handle = self._handle, None
            with naming(self.path):
                try:
                    if self._unsynced:
                        os.fsync(handle.fileno())
                finally:
                    self._unsynced = 0
                    handle.close()

    def __enter__(self) -> JsonlLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
