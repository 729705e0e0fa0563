"""Putting existing image files into a dataset folder: hard link, copy, or re-encode.

The dataset format needs every image inside the dataset folder (so a folder can be moved or
uploaded as one), while a published dataset's images stay where they were downloaded. Used by
the ShareGPT4V preparation for every kept image; each placement is idempotent, so a resumed run
skips what is already in place.
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from balcaprl.files import atomic_write_bytes

ImageMode = Literal["auto", "hardlink", "copy", "reencode"]


def placed_name(image: str, mode: ImageMode) -> str:
    """The path under ``images/`` for the source path ``image`` (re-encoded files end in .jpg)."""
    if mode != "reencode" or image.lower().endswith((".jpg", ".jpeg")):
        return image
    return image + ".jpg"


def place_image(src: str, dst: str, mode: ImageMode, max_side: int = 1024) -> tuple[str, str | None]:
    """Put the image ``src`` at ``dst`` inside the dataset; returns (how, sha256 of dst or None).

    The dataset format needs every image inside the dataset folder (so a folder can be moved or
    uploaded as one). ShareGPT4V's images are ~100 GB, so they are not copied when avoidable:

    * ``hardlink`` (what ``auto`` tries first): a second name for the same file, no extra disk and
      no dangling risk (deleting the original name keeps the data). Works when the dataset is on the
      image root's filesystem. Nothing in balcaprl writes images in place, so sharing is safe.
      Symlinks are not used: they break when the folder is moved and can point anywhere.
    * ``copy`` (``auto``'s fallback across filesystems, or when linking is not permitted): doubles
      the disk use of the kept images, which ``auto`` reports.
    * ``reencode``: RGB JPEG (quality 95) with the long side at most ``max_side``; for a dataset on
      another disk: SAM's 2250-pixel images shrink ~5x, and judges and policies downscale anyway.

    Idempotent, so a resumed run skips images already placed: a link is recognised by its inode, a
    copy or re-encoding by carrying the source's mtime (and, for a copy, size); both are written
    under a temporary name and renamed, so a file that is present is whole.
    """
    source = os.stat(src)
    if mode == "reencode":
        if os.path.exists(dst) and os.stat(dst).st_mtime_ns == source.st_mtime_ns:
            with open(dst, "rb") as handle:
                return "already_present", hashlib.sha256(handle.read()).hexdigest()
        from PIL import Image

        with Image.open(src) as img:
            rgb = img.convert("RGB")
        rgb.thumbnail((max_side, max_side), Image.Resampling.LANCZOS)
        buffer = io.BytesIO()
        rgb.save(buffer, "JPEG", quality=95)
        data = buffer.getvalue()
        atomic_write_bytes(Path(dst), data)
        os.utime(dst, ns=(source.st_atime_ns, source.st_mtime_ns))  # marks which source version it is
        return "reencoded", hashlib.sha256(data).hexdigest()

    if os.path.exists(dst):
        target = os.stat(dst)
        if os.path.samefile(src, dst) or (
            mode != "hardlink"
            and (target.st_size, target.st_mtime_ns) == (source.st_size, source.st_mtime_ns)
        ):
            return "already_present", None
        os.unlink(dst)  # another file under this name (an older run, a changed source): replace it
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    if mode in ("auto", "hardlink"):
        try:
            os.link(src, dst)
            return "hardlinked", None
        except OSError as exc:
            unlinkable = exc.errno in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EACCES)
            if mode == "hardlink" or not unlinkable:
                raise
    tmp = f"{dst}.{os.getpid()}.tmp"
    try:
        shutil.copy2(src, tmp)  # with the source's mtime: how a later run recognises a current copy
        os.replace(tmp, dst)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return "copied", None


def prune_images(images_dir: Path, keep: Iterable[Path]) -> int:
    """Remove files under ``images/`` that the dataset no longer uses (an earlier run's leftovers);
    returns how many."""
    if not images_dir.is_dir():
        return 0
    wanted = {str(p) for p in keep}
    removed = 0
    for dirpath, _dirnames, filenames in os.walk(images_dir, topdown=False):
        for name in filenames:
            path = os.path.join(dirpath, name)
            if path not in wanted:
                os.unlink(path)
                removed += 1
        if dirpath != str(images_dir) and not os.listdir(dirpath):
            os.rmdir(dirpath)
    return removed
