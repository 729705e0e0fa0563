"""The preparation's resume file: every image check, appended as soon as it is known.

``OUT/.prepare/image-checks.jsonl`` holds one :class:`~balcaprl.data.validation.ImageFacts` per line.
Checking an image (read, hash, full decode) is the expensive step of a preparation; with this file
an interrupted run continues where it stopped, and a re-run after changing a threshold checks
nothing again. A fact is reused only while its file's size, mtime and inode are unchanged.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from balcaprl.data.validation import ImageFacts, stat_key


class CheckCheckpoint:
    """Append-only JSONL of :class:`ImageFacts`, keyed by image path, for resuming a preparation.

    The first line names the image root; a checkpoint for another root is set aside (renamed to
    ``*.stale``), never mixed in. Each fact is flushed as soon as it is written, so a killed run
    loses at most the line being written, which is cut off when the file is next opened.
    """

    KIND = "balcaprl.prepare.image-checks"

    def __init__(self, path: Path, image_root: str) -> None:
        self.path = Path(path)
        self.image_root = image_root
        self.facts: dict[str, ImageFacts] = {}
        self._handle: Any = None
        self._since_sync = 0
        self._load()

    def _load(self) -> None:
        if not self.path.exists():
            return
        with self.path.open("r", encoding="utf-8") as handle:
            try:
                header = json.loads(handle.readline() or "{}")
            except json.JSONDecodeError:
                header = {}
            if header.get("kind") == self.KIND and header.get("image_root") == self.image_root:
                for line in handle:  # line by line: 1.2M facts are ~400 MB of JSON
                    try:
                        record = json.loads(line)
                        self.facts[record["image"]] = ImageFacts(**record)
                    except (json.JSONDecodeError, KeyError, TypeError):
                        continue  # a line cut short by an interruption
                return
        os.replace(self.path, self.path.with_suffix(self.path.suffix + ".stale"))

    def reusable(self, image: str) -> ImageFacts | None:
        """The stored facts for ``image`` if its file is unchanged since it was checked."""
        facts = self.facts.get(image)
        if facts is None or facts.stat is None:
            return None  # missing / unsafe files are cheap to check again, and may have appeared
        try:
            current = stat_key(os.stat(os.path.join(self.image_root, image)))
        except OSError:
            return None
        return facts if current == facts.stat else None

    def __enter__(self) -> CheckCheckpoint:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            self._drop_partial_line()
        fresh = not self.path.exists() or self.path.stat().st_size == 0
        self._handle = self.path.open("a", encoding="utf-8")
        if fresh:
            self._handle.write(json.dumps({"kind": self.KIND, "image_root": self.image_root}) + "\n")
            self._handle.flush()
        return self

    def _drop_partial_line(self) -> None:
        """Cut a last line left unfinished by an interruption, so the file stays valid JSONL."""
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            with self.path.open("r+b") as handle:
                handle.truncate(data.rfind(b"\n") + 1)

    def add(self, facts: ImageFacts) -> None:
        self.facts[facts.image] = facts
        self._handle.write(facts.to_json() + "\n")
        self._handle.flush()
        self._since_sync += 1
        if self._since_sync >= 1000:
            os.fsync(self._handle.fileno())
            self._since_sync = 0

    def extend(self, many: Iterable[ImageFacts]) -> Iterator[ImageFacts]:
        for facts in many:
            self.add(facts)
            yield facts

    def __exit__(self, *exc: object) -> None:
        if self._handle is not None:
            self._handle.flush()
            os.fsync(self._handle.fileno())
            self._handle.close()
            self._handle = None
