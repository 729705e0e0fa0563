"""Checking entries and images: the reasons a sample is rejected, and the per-image checks.

Shared by the producers of dataset folders. Work is split so that the expensive part is done once:

* :func:`inspect_image` (run in worker processes) resolves the path, reads the file once, hashes it,
  and decodes it fully (truncation only shows up when the last bytes are decoded). It returns raw
  :class:`ImageFacts`, not a verdict. An image above the pixel limit that the judge, the trainer and
  ``caption`` also apply (:data:`balcaprl.images.MAX_PIXELS`) is refused from its header.
* :func:`image_rejection` applies the thresholds (aspect ratio, smallest side) to those facts in the
  parent, so changing a threshold never forces a re-check.

Facts are plain data (:meth:`ImageFacts.to_json`), so a producer can keep them in a resume file
(the ShareGPT4V preparation: :class:`~balcaprl.data.sharegpt4v.checkpoint.CheckCheckpoint`); the
size, mtime and inode in ``ImageFacts.stat`` say whether the file is still the one that was checked.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
from dataclasses import asdict, dataclass, field

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
    "image_too_large": "more pixels than the limit every balcaprl command applies (89.5 MP)",
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


def stat_key(st: os.stat_result) -> list[int]:
    """``[size, mtime_ns, inode]``: while these are unchanged, the file is the one that was checked."""
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def inspect_image(root: str, image: str, allow_symlinks_out: bool = False) -> ImageFacts:
    """Resolve, read, hash and fully decode one image. Never raises for a bad file.

    ``root`` must be an absolute, resolved path (``os.path.realpath``); ``image`` relative to it.
    """
    from balcaprl.images import ImageTooLarge, check_pixels, pillow

    Image = pillow()
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
    facts.stat = stat_key(st)
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
        with Image.open(io.BytesIO(data)) as img:
            facts.width, facts.height = img.size
            facts.format = img.format
            check_pixels(img.width, img.height, image)  # the limit every reader applies
            if img.format == "JPEG":
                # Decode at reduced scale: every byte is still entropy-decoded (truncation
                # still shows), the inverse DCT and colour conversion get cheaper.
                img.draft("RGB", (max(1, img.width // 8), max(1, img.height // 8)))
            img.load()
    except (ImageTooLarge, Image.DecompressionBombError) as exc:
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
