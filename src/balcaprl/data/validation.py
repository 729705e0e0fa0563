"""Checking real images: the reasons a sample is rejected, the per-image facts, and their checkpoint.

Work is split so that the expensive part is done once and can be resumed:

* :func:`inspect_image` (run in worker processes) resolves the path, reads the file once, hashes it,
  and decodes it fully (truncation only shows up when the last bytes are decoded). It returns raw
  :class:`ImageFacts`, not a verdict.
* :func:`image_rejection` applies the thresholds (aspect ratio, smallest side) to those facts in the
  parent, so changing a threshold never forces a re-check.
* :class:`CheckCheckpoint` appends every fact to a JSONL file as soon as it is known, so an
  interrupted run continues where it stopped; a fact is reused only while the file's size, mtime
  and inode are unchanged.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "REASONS",
    "CheckCheckpoint",
    "ImageFacts",
    "ImageLimits",
    "Rejection",
    "image_rejection",
    "inspect_image",
    "lexical_path_problem",
    "normalise_path",
]

# Every reason a ShareGPT4V entry can be rejected for, with what it means (printed by `data info`).
REASONS: dict[str, str] = {
    "malformed_entry": "the entry is not an object, or its id / image / turn values are missing or not text",
    "missing_conversations": "no `conversations` list, or an empty one",
    "no_human_turn": "no human turn to take the prompt from",
    "no_gpt_turn": "no gpt turn after the human turn, so no reference caption",
    "empty_prompt": "the human turn is only the <image> tag",
    "empty_caption": "the gpt turn is empty or whitespace",
    "unsafe_path": "the image path is absolute, contains '..', or resolves (symlink) outside the image root",
    "missing_image": "no file at the image path (or not a regular file)",
    "zero_size_image": "the image file is empty (0 bytes)",
    "unreadable_image": "the file is not an image Pillow can decode, or cannot be read",
    "truncated_image": "the image file ends before its data does (partial download)",
    "image_too_large": "more pixels than Pillow's decompression-bomb limit",
    "image_too_small": "the shortest side is below --min-side (vision encoders reject such images)",
    "absurd_aspect_ratio": "long side / short side is above --max-aspect-ratio",
    "duplicate_image": "same image content (sha256) as an earlier, kept entry",
}


@dataclass(frozen=True)
class Rejection:
    """One rejected entry: where it was in the JSON, what it was, and why it was left out."""

    index: int
    id: str | None
    image: str | None
    reason: str
    detail: str

    def __post_init__(self) -> None:
        if self.reason not in REASONS:
            raise ValueError(f"unknown rejection reason {self.reason!r}")

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False)


@dataclass(frozen=True)
class ImageLimits:
    """Thresholds applied to decoded images.

    ``min_side=28``: Qwen2.5-VL's processor refuses images whose side is below its 28-pixel patch
    merge; smaller images carry nothing to caption anyway. ``max_aspect_ratio=10``: LLaVA pads to a
    square, so a 10:1 banner keeps a tenth of its pixels; Qwen refuses ratios above 200.
    """

    min_side: int = 28
    max_aspect_ratio: float = 10.0


@dataclass
class ImageFacts:
    """What inspecting one image file found (raw facts; thresholds are applied later)."""

    image: str  # the path relative to the image root, as it appears in the JSON (normalised)
    stat: list[int] | None = None  # [size, mtime_ns, inode] of the resolved file
    sha256: str | None = None
    width: int | None = None
    height: int | None = None
    format: str | None = None
    error: list[str] | None = field(default=None)  # [reason, detail] when the file itself is bad

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False)


def lexical_path_problem(image: str) -> str | None:
    """Why ``image`` (a path from the JSON) may not be used, judged from the text alone; else None."""
    if "\x00" in image:
        return "the path contains a NUL byte"
    if image.startswith(("/", "\\")) or (len(image) > 1 and image[1] == ":"):
        return f"absolute path {image!r}; ShareGPT4V paths are relative to --image-root"
    if ".." in image.replace("\\", "/").split("/"):
        return f"path {image!r} climbs out of the image root with '..'"
    return None


def normalise_path(image: str) -> str:
    """One spelling per file: ``./coco//a.jpg`` -> ``coco/a.jpg`` (call after :func:`lexical_path_problem`)."""
    return "/".join(part for part in image.strip().split("/") if part not in ("", "."))


def _stat_key(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def inspect_image(root: str, image: str, allow_symlinks_out: bool = False) -> ImageFacts:
    """Resolve, read, hash and fully decode one image. Never raises for a bad file.

    ``root`` must be an absolute, resolved path (``os.path.realpath``); ``image`` relative to it.
    """
    from PIL import Image

    facts = ImageFacts(image=image)
    problem = lexical_path_problem(image)
    if problem:
        facts.error = ["unsafe_path", problem]
        return facts
    real = os.path.realpath(os.path.join(root, image))
    if not allow_symlinks_out and os.path.commonpath([root, real]) != root:
        facts.error = [
            "unsafe_path",
            f"{image} resolves to {real}, outside the image root {root}; pass --allow-symlinks-out "
            "if the root links to other disks on purpose",
        ]
        return facts
    try:
        st = os.stat(real)
    except FileNotFoundError:
        facts.error = ["missing_image", f"no file {real}"]
        return facts
    except OSError as exc:
        facts.error = ["unreadable_image", f"cannot stat {real}: {exc.strerror or exc}"]
        return facts
    if not stat.S_ISREG(st.st_mode):
        facts.error = ["missing_image", f"{real} is not a regular file"]
        return facts
    facts.stat = _stat_key(st)
    if st.st_size == 0:
        facts.error = ["zero_size_image", f"{real} is empty (0 bytes)"]
        return facts
    try:
        with open(real, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        facts.error = ["unreadable_image", f"cannot read {real}: {exc.strerror or exc}"]
        return facts
    facts.sha256 = hashlib.sha256(data).hexdigest()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as img:
                facts.width, facts.height = img.size
                facts.format = img.format
                if img.format == "JPEG":
                    # Decode at reduced scale: every byte is still entropy-decoded (truncation
                    # still shows), the inverse DCT and colour conversion get cheaper.
                    img.draft("RGB", (max(1, img.width // 8), max(1, img.height // 8)))
                img.load()
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        facts.error = ["image_too_large", str(exc)]
    except Image.UnidentifiedImageError:
        facts.error = ["unreadable_image", "not an image format Pillow recognises"]
    except OSError as exc:
        reason = "truncated_image" if "truncated" in str(exc) else "unreadable_image"
        facts.error = [reason, f"decoding failed: {exc}"]
    except Exception as exc:  # Pillow raises SyntaxError, ValueError, ... for corrupt files
        facts.error = ["unreadable_image", f"decoding failed: {type(exc).__name__}: {exc}"]
    return facts


def image_rejection(facts: ImageFacts, limits: ImageLimits) -> tuple[str, str] | None:
    """The (reason, detail) for which these facts reject the image, or None when it is usable."""
    if facts.error:
        return facts.error[0], facts.error[1]
    assert facts.width is not None and facts.height is not None
    short, long = sorted((facts.width, facts.height))
    if short < limits.min_side:
        return "image_too_small", f"{facts.width}x{facts.height}: shortest side {short} < {limits.min_side}"
    if long / short > limits.max_aspect_ratio:
        return (
            "absurd_aspect_ratio",
            f"{facts.width}x{facts.height}: aspect ratio {long / short:.1f} > {limits.max_aspect_ratio:g}",
        )
    return None


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
            current = _stat_key(os.stat(os.path.join(self.image_root, image)))
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
