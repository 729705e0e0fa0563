"""Reading ShareGPT4V's published JSON as a stream: one list element at a time, never the whole file.

The 1.2M-entry ShareCaptioner file is ~1.5 GB of JSON; loading it whole would take several times
that in memory. The parsing is ijson's, with its C backend (yajl2_c): a maintained library in place
of the hand-written reader balcaprl had (the standard library's decoder driven one element at a
time), as fast within the noise of a shared machine: 0.94-1.20x its entries per second on a
100,000-entry file in ShareGPT4V's layout, the file's sha256 computed on the way included
(``benchmarks/bench_prepare.py --part json``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from balcaprl.errors import InputError

_BOM = b"\xef\xbb\xbf"
_WHITESPACE = b" \t\n\r"


class _Source:
    """The file as ijson reads it: hashed and counted on the way, the UTF-8 byte-order mark (which
    some editors and Windows tools write) skipped, and the first character looked at."""

    def __init__(self, handle: Any, on_bytes: Callable[[int], None] | None) -> None:
        self._handle = handle
        self._on_bytes = on_bytes
        self.sha256 = hashlib.sha256()
        self.bytes_read = 0  # of the file, so far
        self.last_read = 0  # bytes handed to the parser by the last call
        self._pending = b""  # read while looking for the first character, not yet handed on
        self.first_offset = 0  # where that first character is

    def _take(self, size: int) -> bytes:
        data = self._handle.read(size)
        self.sha256.update(data)
        self.bytes_read += len(data)
        if self._on_bytes is not None and data:
            self._on_bytes(len(data))
        return data

    def first_character(self) -> bytes:
        """The first byte after the byte-order mark and whitespace (b"" for an empty file)."""
        eof = False
        while not eof and len(self._pending) < len(_BOM):
            chunk = self._take(1 << 16)
            self._pending, eof = self._pending + chunk, not chunk
        self._pending = self._pending.removeprefix(_BOM)
        while True:
            self._pending = self._pending.lstrip(_WHITESPACE)
            if self._pending or eof:
                self.first_offset = self.bytes_read - len(self._pending)
                return self._pending[:1]
            chunk = self._take(1 << 16)
            self._pending, eof = chunk, not chunk

    def read(self, size: int = -1) -> bytes:
        if size == 0:  # ijson asks for nothing once, to see whether the file gives bytes or text
            return b""
        if self._pending:
            data, self._pending = self._pending, b""
        else:
            data = self._take(size)
        self.last_read = len(data)
        return data


class JsonArrayStream:
    """Iterate the elements of a top-level JSON list without loading the file.

    Elements come as ``json.load`` makes them, except that numbers with a fraction or an exponent
    are ``decimal.Decimal`` (exact; ijson's C backend would refuse integers beyond 64 bits if asked
    for floats, and no ShareGPT4V field is a float), and a lone UTF-16 surrogate escape (not valid
    Unicode) becomes ``?``. After a complete iteration, ``sha256`` is the
    file's digest and ``size`` its byte count. ``on_bytes(n)`` is called as bytes are read (progress).

    A broken file raises :class:`~balcaprl.errors.InputError` naming the file, how many entries were complete
    (and already handed out) before the problem, and the bytes the parser was reading when it found
    it.
    """

    BUFFER = 1 << 16  # bytes per read; the benchmark finds larger buffers no faster

    def __init__(self, path: Path | str, on_bytes: Callable[[int], None] | None = None) -> None:
        self.path = Path(path)
        self.size = self.path.stat().st_size
        self.sha256: str | None = None
        self._on_bytes = on_bytes

    def __iter__(self) -> Iterator[Any]:
        import ijson

        seen = 0
        with self.path.open("rb") as handle:
            source = _Source(handle, self._on_bytes)

            def fail(message: str, where: str | None = None) -> InputError:
                if where is None:  # the parser reports no offset: the bytes it was reading
                    end = source.bytes_read
                    where = f"in bytes {max(0, end - max(source.last_read, 1))}-{end} of {self.size}"
                entries = "entry" if seen == 1 else "entries"
                return InputError(
                    f"{self.path}: {message} (after {seen} complete {entries}, {where}); the file is not "
                    "a complete ShareGPT4V JSON list, download it again"
                )

            first = source.first_character()
            if first != b"[":
                found = f"found {first.decode('latin-1')!r}" if first else "found no text"
                raise fail(f"expected a JSON list '[', {found}", f"at byte {source.first_offset}")
            try:
                for value in ijson.items(source, "item", buf_size=self.BUFFER):
                    yield value
                    seen += 1
            except ijson.JSONError as error:
                raise fail(_describe(error)) from None
            except UnicodeDecodeError:
                raise fail("not UTF-8 text") from None
            self.sha256 = source.sha256.hexdigest()


def _describe(error: Exception) -> str:
    """The parser's complaint, in words a user can act on for the common cases, with the text
    around the problem when the parser shows it."""
    text = error.args[0] if error.args else ""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    lines = [line.strip() for line in str(text).splitlines()]
    first = lines[0] if lines and lines[0] else type(error).__name__
    if "premature EOF" in first:
        return "the file ends inside the list (cut short)"
    if "trailing garbage" in first:
        message = "text after the closing ']'"
    elif "invalid bytes in UTF8" in first:
        message = "not UTF-8 text"
    else:
        message = "JSON syntax error: " + first.removeprefix("parse error: ").removeprefix("lexical error: ")
    near = lines[1] if len(lines) > 2 and "(right here)" in lines[2] else ""  # yajl: text, then a marker
    return f"{message}, near {near[:60]!r}" if near else message
