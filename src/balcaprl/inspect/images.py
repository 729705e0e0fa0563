"""The page's images: each distinct image once, embedded as a small data URL or linked relative to the page.

Embedding keeps the page one file that opens anywhere; linking keeps a page of thousands of distinct
photographs small and fast to write. ``auto`` embeds up to ``embed_limit`` distinct images and links
beyond that. Embedded images go through the judge's image loader
(:class:`balcaprl.judge.images.ImageLoader`): it checks that a path stays inside its root (image
paths in caption files are untrusted), that the file is an image, and downscales only what is larger
than the thumbnail side (a small PNG travels as its own bytes).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Literal
from urllib.parse import quote

from balcaprl.judge.images import ImageError, ImageLoader

ImageMode = Literal["auto", "embed", "link", "none"]
IMAGE_MODES: tuple[ImageMode, ...] = ("auto", "embed", "link", "none")


class ImageTable:
    """Distinct images, in the order first added; a card refers to one by its index."""

    def __init__(self) -> None:
        self._index: dict[tuple[str | None, str], int] = {}
        self._entries: list[tuple[Path | None, str]] = []

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, path: str | Path | None, root: Path | None = None) -> int | None:
        """The index of ``path`` (relative to ``root`` when given, and not allowed to leave it)."""
        if path is None or str(path) == "":
            return None
        key = (None if root is None else str(root), str(path))
        index = self._index.get(key)
        if index is None:
            index = self._index[key] = len(self._entries)
            self._entries.append((root, str(path)))
        return index

    def sources(
        self,
        page: Path,
        mode: ImageMode = "auto",
        *,
        max_side: int = 192,
        embed_limit: int = 2000,
        on_image: Callable[[], None] | None = None,
    ) -> list[str | None]:
        """Each image's ``src`` for a page written to ``page``: a data URL, a relative URL, or None
        (unreadable, outside its root, or ``mode="none"``)."""
        if mode not in IMAGE_MODES:
            raise ValueError(f"image mode {mode!r}; choose from {', '.join(IMAGE_MODES)}")
        if mode == "auto":
            mode = "embed" if len(self._entries) <= embed_limit else "link"
        loaders: dict[Path | None, ImageLoader] = {}
        out: list[str | None] = []
        for root, path in self._entries:
            loader = loaders.get(root)
            if loader is None:
                loader = loaders[root] = ImageLoader(max_side, root=root, remember=0)
            out.append(None if mode == "none" else self._source(loader, path, page, mode))
            if on_image is not None:
                on_image()
        return out

    @staticmethod
    def _source(loader: ImageLoader, path: str, page: Path, mode: ImageMode) -> str | None:
        try:
            if mode == "embed":
                return loader.load(path).data_url
            full = loader.resolve(path)
        except ImageError:
            return None
        if not full.is_file():
            return None
        full = full.resolve()
        try:
            relative = os.path.relpath(full, Path(page).resolve().parent)
        except ValueError:  # another drive (Windows): no relative path exists
            return full.as_uri()
        return quote(Path(relative).as_posix())
