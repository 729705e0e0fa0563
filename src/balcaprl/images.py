"""Opening images with bounded memory: one pixel limit and one bounded decode for every reader.

Preparation (``data prepare``), the judge (``score``, ``evaluate``, training rewards), the trainer's
data loader and ``caption`` all open images through :func:`open_image` (or check sizes with
:func:`check_pixels`), so an image is either usable everywhere or refused everywhere, with the same
reason:

* :data:`MAX_PIXELS` is the one pixel limit: Pillow's own decompression-bomb threshold
  (89,478,485 pixels, ~ 9,459 x 9,459), which preparation always applied. An image above it is
  refused from its header alone, before any pixel is decoded (:class:`ImageTooLarge`).
* With ``max_side``, a JPEG is decoded at a reduced scale (``draft``: the decoder's inverse DCT
  at 1/2, 1/4 or 1/8 size, the largest reduction whose long side is still at least ``max_side``):
  a 48 MP photo for a 1024-pixel judge is decoded at 2000 x 1500 (9 MB) instead of 8000 x 6000
  (144 MB); then it is resized to ``max_side``. Other formats (PNG has no reduced decode) are
  decoded at full size, then resized.
* :data:`DECODE_SLOTS` bounds how many images the judge's loader reads and decodes at once (its
  threads share one semaphore), so 128 calls in flight never hold 128 decoded photos.
"""

from __future__ import annotations

import functools
import io
import math
import os
import re
import warnings
from pathlib import Path
from typing import IO, Any

from balcaprl.errors import InputError

MAX_PIXELS = 89_478_485  # = PIL.Image.MAX_IMAGE_PIXELS by default; fixed here so all readers agree
# Images read and decoded at once by the judge's loader: with draft decoding a large JPEG costs
# ~10-40 MB while it is prepared; only formats without a reduced decode (a 90 MP PNG: ~360 MB) are
# expensive, and then at most this many at a time.
DECODE_SLOTS = 4


class ImageReadError(InputError):
    """A file that is not an image Pillow can decode (corrupt, truncated, unknown format, empty)."""


class ImageTooLarge(ImageReadError):
    """An image with more pixels than :data:`MAX_PIXELS`."""


@functools.cache
def pillow() -> Any:
    """``PIL.Image``, imported on first use. Pillow's own bomb *warning* is silenced: every reader
    refuses such an image outright with :func:`check_pixels` (same threshold), and a warning printed
    from a worker thread in the middle of a progress bar says nothing the refusal does not."""
    from PIL import Image

    warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning)
    return Image


def check_pixels(width: int, height: int, where: str, max_pixels: int = MAX_PIXELS) -> None:
    """Raise :class:`ImageTooLarge` when ``width x height`` is above ``max_pixels``."""
    if width * height > max_pixels:
        raise ImageTooLarge(
            f"{where} is {width}x{height} = {width * height / 1e6:.1f} MP, above the limit of "
            f"{max_pixels / 1e6:.1f} MP that every balcaprl command applies; downscale it first"
        )


def open_image(
    source: Path | str | bytes | IO[bytes],
    *,
    max_side: int | None = None,
    max_pixels: int = MAX_PIXELS,
    mode: str | None = None,
    where: str | None = None,
) -> Any:  # PIL.Image.Image
    """A decoded image (module docstring): refused above ``max_pixels`` before decoding, decoded at
    a reduced scale when ``max_side`` allows it (JPEG), and no longer than ``max_side`` on its long
    side when given; converted to ``mode`` (e.g. ``"RGB"``) when given. ``where`` names the image in
    errors (default: the path). Raises :class:`ImageTooLarge` or :class:`ImageReadError`.

    The returned image keeps ``format`` (the file's) and ``info``; its ``size`` is what was decoded.
    """
    from PIL import UnidentifiedImageError

    Image = pillow()
    label = where or (f"image '{source}'" if isinstance(source, str | os.PathLike) else "<image bytes>")
    stream = io.BytesIO(source) if isinstance(source, bytes | bytearray | memoryview) else source
    try:
        image = Image.open(stream)  # reads the header only
    except FileNotFoundError:
        raise ImageReadError(f"{label}: no such file") from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as error:
        raise ImageReadError(f"{label} is not a readable image ({error})") from None
    except Image.DecompressionBombError:
        raise ImageTooLarge(f"{label}: more than twice Pillow's pixel limit; downscale it first") from None
    try:
        check_pixels(image.width, image.height, label, max_pixels)
        if max_side is not None and image.format == "JPEG" and max(image.size) > max_side:
            scale = max_side / max(image.size)
            target = (max(1, math.ceil(image.width * scale)), max(1, math.ceil(image.height * scale)))
            image.draft(image.mode if image.mode in ("L", "RGB", "CMYK") else "RGB", target)
        image.load()
    except ImageTooLarge:
        image.close()
        raise
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as error:
        image.close()
        raise ImageReadError(f"{label} is not a readable image ({error})") from None
    if max_side is not None and max(image.size) > max_side:
        fmt, info = image.format, image.info
        image.thumbnail((max_side, max_side), Image.Resampling.LANCZOS)
        image.format, image.info = fmt, info  # thumbnail keeps them; said here because it matters
    if mode is not None and image.mode != mode:
        fmt = image.format
        image = image.convert(mode)
        image.format = fmt
    return image


def path_in_root(root: Path | str, path: Path | str) -> Path | None:
    """``path`` relative to the image root ``root`` (relative paths are read under it), or None when
    it leaves the root (:class:`ImageRoot`'s rules). A caller that checks many paths under one root
    keeps an :class:`ImageRoot`: it resolves the root and the folders inside it once."""
    relative = ImageRoot(root).relative(path)
    return None if relative is None else Path(relative)


# A relative path whose parts are all plain names (no "", "." or ".."), e.g. "images/a.png"
_PLAIN = re.compile(r"(?:(?!\.\.?(?:/|$))[^/]+(?:/|$))+(?<!/)")


def _opened_path(fd: int) -> str | None:
    """The path of the file open at ``fd`` as the kernel resolved it when it was opened (Linux:
    ``/proc/self/fd``; macOS: ``F_GETPATH``); None for a file deleted since, or where neither works."""
    try:
        path = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        import fcntl

        if not hasattr(fcntl, "F_GETPATH"):
            return None
        try:
            path = os.fsdecode(fcntl.fcntl(fd, fcntl.F_GETPATH, bytes(1024)).rstrip(b"\0"))
        except OSError:
            return None
    return None if path.endswith(" (deleted)") or not os.path.isabs(path) else path


def _within(path: str, folder: str) -> bool:
    """``path`` is ``folder`` or lies under it (both absolute and normalised)."""
    return path == folder or path.startswith(folder if folder.endswith(os.sep) else folder + os.sep)


class ImageRoot:
    """An image root, resolved once, that tells whether a path stays inside it.

    Inside means two things. As written, with ``..`` collapsed, the path stays under the root (as
    given, or resolved through its own symlinks): no ``..`` or absolute path leads out. And the file
    it names resolves under the resolved root or under a folder symlink met on the way inside it: a
    dataset whose ``images/`` links to shared storage is the dataset owner's choice, and works; a
    file symlink, or a path through no linked folder, that leads out is refused. Image paths of
    caption files are untrusted input: they reach only what the root's owner placed in it.

    Each folder met inside the root is resolved once and remembered (at most ``remember`` of them),
    so checking a file costs one ``lstat`` (is the file itself a symlink?) instead of resolving
    every component of its path: on a warm judge cache that resolution was most of ``score``'s time.
    A folder re-linked while a run reads it keeps the target it had when first met.

    A path checked is not yet a file read: a link changed between the check and the ``open`` (a
    folder symlink re-pointed mid-run) would lead the ``open`` elsewhere. So a reader opens the file
    first and asks :meth:`holds` whether the file the descriptor holds (its path as the kernel
    resolved it, ``/proc/self/fd``) lies where the check admitted it; no change of links during a run
    can make a file outside the root readable.
    """

    def __init__(self, root: Path | str, remember: int = 65536):
        self.given = os.path.abspath(root)
        self.real = os.path.realpath(self.given)
        self._remember = remember
        # folder inside -> (its real path, inside?, the real folders a file under it may lie in)
        self._folders: dict[str, tuple[str, bool, tuple[str, ...]]] = {}

    def relative(self, path: Path | str) -> str | None:
        """``path`` relative to the root (``/``-separated, ``.`` for the root), or None when it leaves it."""
        text = os.fspath(path)
        if _PLAIN.fullmatch(text):  # relative, no empty, "." or ".." part: already what normpath makes
            relative = text
        else:
            full = os.path.normpath(text if os.path.isabs(text) else os.path.join(self.given, text))
            base = next((b for b in (self.given, self.real) if _within(full, b)), None)
            if base is None:
                return None
            relative = os.path.relpath(full, base)
        folder, name = os.path.split(relative)
        real_folder, inside, _ = self._folder(folder)
        target = os.path.join(real_folder, name) if name and name != "." else real_folder
        if name and name != "." and os.path.islink(target):  # a file symlink: where it really leads
            target = os.path.realpath(target)
            inside = any(_within(target, allowed) for allowed in self._allowed(folder))
        return relative.replace(os.sep, "/") if inside else None

    def _allowed(self, folder: str) -> list[str]:
        """The real root, and every folder symlink met on the way from it down ``folder``, resolved."""
        allowed, here = [self.real], self.real
        for part in Path(folder).parts:
            here = os.path.join(here, part)
            if os.path.islink(here):
                here = os.path.realpath(here)
                allowed.append(here)
        return allowed

    def holds(self, relative: str, fd: int) -> bool:
        """Whether the file open at ``fd``, opened through ``relative`` (what :meth:`relative` gave),
        lies under the real root or a folder symlink met on the way, as first met (class docstring)."""
        real = _opened_path(fd)
        if real is None:
            return False
        folder = os.path.dirname(relative) if relative != "." else ""
        return any(_within(real, allowed) for allowed in self._folder(folder)[2])

    def _folder(self, folder: str) -> tuple[str, bool, tuple[str, ...]]:
        """(``folder``'s real path, whether it resolves inside what :meth:`_allowed` admits, that)."""
        known = self._folders.get(folder)
        if known is None:
            real_folder = os.path.realpath(os.path.join(self.real, folder))
            allowed = tuple(self._allowed(folder))
            known = (real_folder, any(_within(real_folder, a) for a in allowed), allowed)
            if len(self._folders) >= self._remember:
                self._folders.clear()
            self._folders[folder] = known
        return known
