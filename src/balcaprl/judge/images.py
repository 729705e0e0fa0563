"""Images for the judge: load once, validate, downscale only when needed, hash once.

Why not always re-encode: the synthetic oracle judge recognises a scene by the exact bytes of its
image, and re-encoding a PNG or JPEG that is already small enough only costs time and fidelity. So a
PNG/JPEG within ``max_image_side`` travels as its original bytes; only larger images (or other
formats) are re-encoded (PNG stays PNG, everything else becomes JPEG unless it has transparency).

The sha256 of the original bytes is computed once per image: the loader remembers paths (keyed by
their size and modification time), and callers group a batch's rollouts by image before loading.
:meth:`ImageLoader.sha256` hashes a file without decoding it, for a cache key: a cached answer
never pays for the decoding, and a file hashed so is not hashed again when it is prepared.

Memory stays bounded however many calls are in flight: an image is opened through
:func:`balcaprl.images.open_image` (refused above the one pixel limit, ``MAX_PIXELS``, from its
header; a large JPEG decoded at a reduced scale), and every loader thread reads and decodes inside
one process-wide semaphore of :data:`~balcaprl.images.DECODE_SLOTS`.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from stat import S_ISREG

from PIL import Image, ImageOps

from balcaprl.errors import InputError
from balcaprl.images import DECODE_SLOTS, ImageReadError, ImageRoot, check_pixels, open_image, pillow

_MIME = {"PNG": "image/png", "JPEG": "image/jpeg"}
_DECODING = threading.BoundedSemaphore(DECODE_SLOTS)  # shared by every loader of the process
# Image objects a loader holds to know them again (ImageLoader.prepared): a process's images of a step
# several times over (a paper step: 32 prompts per GPU process, an image a few hundred KB encoded).
HELD_BYTES = 64 << 20


class ImageError(InputError):
    """An image that cannot be sent to the judge (missing, unreadable, corrupt, outside the image root)."""


def _read_all(fd: int) -> bytes:
    """Every byte of the open file ``fd`` from where it stands (a read may return less than asked)."""
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def sha256_hex(data: bytes) -> str:
    """sha256 of ``data`` (a function of its own so tests can count how often images are hashed)."""
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True, eq=False)
class PreparedImage:
    """An image ready to send: the bytes on the wire, their MIME type, and the original's sha256."""

    sha256: str  # of the original bytes: identifies the image in cache keys
    mime: str
    data: bytes  # what is sent: the original bytes, or a downscaled re-encoding
    width: int  # of what is sent
    height: int
    reencoded: bool

    @cached_property
    def data_url(self) -> str:
        return f"data:{self.mime};base64,{base64.b64encode(self.data).decode('ascii')}"


def decode_data_url(url: str) -> tuple[str, bytes]:
    """``(mime, bytes)`` of a ``data:<mime>;base64,<payload>`` URL; ``ValueError`` otherwise."""
    if not url.startswith("data:") or ";base64," not in url:
        raise ValueError("expected a base64 data URL (data:image/png;base64,...)")
    header, payload = url[5:].split(";base64,", 1)
    try:
        return header, base64.b64decode(payload, validate=True)
    except ValueError:
        raise ValueError("the data URL's base64 payload is corrupt") from None


class ImageLoader:
    """Turns a path or encoded bytes into a :class:`PreparedImage`; thread-safe; remembers paths.

    ``root``: when given, relative paths are resolved against it and no path may leave it
    (:class:`balcaprl.images.ImageRoot`: a folder symlink inside it, such as a dataset's ``images/``
    on shared storage, is part of it) — image paths in caption files are untrusted input. ``jpeg_quality``: re-encode every
    image as JPEG at this quality, whatever its format and size (a benchmark's official script does).
    ``upright``: a re-encoded image is turned upright per its EXIF orientation; False keeps the stored
    pixels as they are (as a benchmark's official script that never reads EXIF sends them).
    """

    def __init__(
        self,
        max_side: int,
        root: Path | str | None = None,
        remember: int = 4096,
        jpeg_quality: int | None = None,
        upright: bool = True,
    ):
        self.max_side = max_side
        self.jpeg_quality = jpeg_quality
        self.upright = upright
        self.root = Path(root).resolve() if root is not None else None
        self._inside = ImageRoot(self.root) if self.root is not None else None  # its folders, resolved once
        self._root_text = os.fspath(self.root) if self.root is not None else ""
        self._remember = remember
        self._known: OrderedDict[tuple, PreparedImage] = OrderedDict()
        self._digests: OrderedDict[tuple, str] = OrderedDict()  # files hashed but not yet prepared
        # bytes objects prepared, by identity (each held, so its id stays its own): a prompt's rollouts
        # judged one at a time as they finish share one image object, prepared once, not once each
        self._objects: OrderedDict[int, tuple[bytes, PreparedImage]] = OrderedDict()
        self._objects_bytes = 0
        self._lock = threading.Lock()

    def resolve(self, image: Path | str) -> Path:
        """The file an image path names, checked against the root. Raises :class:`ImageError`."""
        return Path(self._resolved(image)[0])

    def _resolved(self, image: Path | str) -> tuple[str, str | None]:
        """``(path to open, path relative to the root)``; no root: ``(image, None)``."""
        if self._inside is None:
            return os.fspath(image), None
        relative = self._inside.relative(image)  # a linked images/ folder inside the root is in it
        if relative is None:
            raise self._escapes(image)
        return os.path.join(self._root_text, relative), relative

    def _escapes(self, image: Path | str) -> ImageError:
        return ImageError(
            f"image path '{image}' escapes the image root {self.root}; "
            "use a path relative to --images that stays inside it"
        )

    def _open(self, image: Path | str, path: str, relative: str | None) -> tuple[int, os.stat_result]:
        """``path`` open for reading and its ``fstat``: a regular file, and where the root admitted it
        when the descriptor was opened (:meth:`ImageRoot.holds`: a link re-pointed after the check is
        caught here). NONBLOCK: a FIFO is refused, not waited on."""
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            if relative is not None and not self._inside.holds(relative, fd):  # type: ignore[union-attr]
                raise self._escapes(image)
            stat = os.fstat(fd)
            if not S_ISREG(stat.st_mode):
                raise ImageError(f"image '{image}' is not a regular file")
        except BaseException:
            os.close(fd)
            raise
        return fd, stat

    def load(self, image: Path | str | bytes) -> PreparedImage:
        """Prepare ``image`` (a path, or PNG/JPEG/... bytes). Raises :class:`ImageError`."""
        if isinstance(image, bytes | bytearray | memoryview):
            known = self.prepared(image)
            if known is not None:
                return known
            with _DECODING:
                prepared = self._prepare(bytes(image), where="<image bytes>")
            if type(image) is bytes:  # immutable: the same object is the same image
                self._hold(image, prepared)
            return prepared
        if not isinstance(image, str | os.PathLike):
            raise ImageError(f"an image must be a path or encoded bytes, got {type(image).__name__}")
        path, relative = self._resolved(image)
        try:
            key = self._file_key(path)  # the same key as sha256() makes for this file
        except OSError as error:
            raise ImageError(f"image '{image}' cannot be read: {error.strerror or error}") from None
        with self._lock:
            known = self._known.get(key)  # read through a checked descriptor when it was prepared
            if known is not None:
                self._known.move_to_end(key)
                return known
        with _DECODING:  # the file's bytes and its decoded pixels: a bounded number at once
            try:
                fd, stat = self._open(image, path, relative)
                try:
                    data = _read_all(fd)
                finally:
                    os.close(fd)
            except OSError as error:
                raise ImageError(f"image '{image}' cannot be read: {error.strerror or error}") from None
            key = self._stat_key(path, stat)  # of the file read, which may differ from the one stat() saw
            with self._lock:
                digest = self._digests.pop(key, None)  # hashed already by sha256()
            prepared = self._prepare(data, where=f"image '{image}'", digest=digest)
        with self._lock:
            self._known[key] = prepared
            while len(self._known) > self._remember:
                self._known.popitem(last=False)
        return prepared

    def prepared(self, image: Path | str | bytes) -> PreparedImage | None:
        """The image as :meth:`load` prepared it, when that needs no reading, hashing or decoding (a
        ``bytes`` object prepared before: cheap enough to ask on the event loop); None otherwise."""
        if type(image) is not bytes:
            return None
        with self._lock:
            held = self._objects.get(id(image))
            if held is None or held[0] is not image:
                return None
            self._objects.move_to_end(id(image))
            return held[1]

    def _hold(self, image: bytes, prepared: PreparedImage) -> None:
        """Remember ``prepared`` for the object ``image``, within ``remember`` objects and
        :data:`HELD_BYTES` bytes held (the oldest let go first)."""
        with self._lock:
            if id(image) in self._objects:
                return
            self._objects[id(image)] = (image, prepared)
            self._objects_bytes += len(image) + len(prepared.data) * prepared.reencoded
            while len(self._objects) > self._remember or self._objects_bytes > HELD_BYTES:
                old, old_prepared = self._objects.popitem(last=False)[1]
                self._objects_bytes -= len(old) + len(old_prepared.data) * old_prepared.reencoded

    def sha256(self, image: Path | str | bytes) -> str:
        """The sha256 of an image's original bytes (what :class:`PreparedImage` ``.sha256`` will be),
        without decoding it: enough for a cache key, so a cached answer never pays for the decoding
        and re-encoding. Raises :class:`ImageError` where :meth:`load` would fail to read it."""
        if isinstance(image, bytes | bytearray | memoryview):
            return sha256_hex(bytes(image))
        if not isinstance(image, str | os.PathLike):
            raise ImageError(f"an image must be a path or encoded bytes, got {type(image).__name__}")
        path, relative = self._resolved(image)
        try:
            known_digest = self._known_digest(self._file_key(path))  # warm: one stat, nothing opened
            if known_digest is not None:
                return known_digest  # of bytes read through a checked descriptor when first hashed
            # one checked descriptor for the key and the bytes: a file swapped in between cannot mix
            # the two, and a link re-pointed since the path was checked cannot lead out of the root
            fd, stat = self._open(image, path, relative)
            try:
                key = self._stat_key(path, stat)
                digest = self._known_digest(key) or sha256_hex(_read_all(fd))
            finally:
                os.close(fd)
        except OSError as error:
            raise ImageError(f"image '{image}' cannot be read: {error.strerror or error}") from None
        with self._lock:  # load() of this file, as it is now, hashes it no more
            self._digests[key] = digest
            while len(self._digests) > self._remember:
                self._digests.popitem(last=False)
        return digest

    def _known_digest(self, key: tuple) -> str | None:
        with self._lock:
            known = self._known.get(key)
            return known.sha256 if known is not None else self._digests.get(key)

    def _file_key(self, path: Path | str) -> tuple:
        """What a remembered file is known by: a changed file (size or modification time) is new."""
        return self._stat_key(os.fspath(path), os.stat(path))

    def _stat_key(self, path: str, stat: os.stat_result) -> tuple:
        return (path, stat.st_size, stat.st_mtime_ns, self.max_side, self.jpeg_quality, self.upright)

    def _prepare(self, data: bytes, where: str, digest: str | None = None) -> PreparedImage:
        if not data:
            raise ImageError(f"{where} is empty (0 bytes)")
        try:
            with pillow().open(io.BytesIO(data)) as probe:
                original_size = probe.size
                check_pixels(*original_size, where)  # from the header: nothing decoded yet
                probe.verify()  # catches truncated/corrupt files without a full decode
            # decoded at a reduced scale when it is larger than what is sent (JPEG)
            image = open_image(data, max_side=self.max_side, where=where)
        except ImageReadError as error:
            raise ImageError(str(error)) from None
        except Exception as error:  # verify() raises whatever the format's parser raises
            raise ImageError(f"{where} is not a readable image ({error})") from None
        digest = digest or sha256_hex(data)
        fmt = image.format or ""
        # the original bytes when they are already fit to send (decoded at full size, within max_side)
        # and no re-encoding is asked for (jpeg_quality: the official DCScore layout)
        if (
            self.jpeg_quality is None
            and fmt in _MIME
            and image.size == original_size
            and max(image.size) <= self.max_side
        ):
            return PreparedImage(digest, _MIME[fmt], data, image.width, image.height, reencoded=False)
        return self._reencode(image, fmt, digest)

    def _reencode(self, image: Image.Image, fmt: str, digest: str) -> PreparedImage:
        """A re-encoding of ``image`` (already no longer than ``max_side``), upright per its EXIF
        (unless :attr:`upright` is off)."""
        if self.upright:
            image = ImageOps.exif_transpose(image)
        if max(image.size) > self.max_side:
            image.thumbnail((self.max_side, self.max_side), Image.Resampling.LANCZOS)
        has_alpha = image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info
        buffer = io.BytesIO()
        if (fmt == "PNG" or has_alpha) and self.jpeg_quality is None:
            image.save(buffer, format="PNG", optimize=False)
            mime = "image/png"
        else:
            image.convert("RGB").save(buffer, format="JPEG", quality=self.jpeg_quality or 90)
            mime = "image/jpeg"
        return PreparedImage(digest, mime, buffer.getvalue(), image.width, image.height, reencoded=True)
