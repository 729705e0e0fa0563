"""ShareGPT4V -> a balcaprl dataset folder (`balcaprl prepare sharegpt4v`).

Input, exactly as published on the Hugging Face dataset ``Lin-Chen/ShareGPT4V``: a JSON list of::

    {"id": "000000000009", "image": "coco/train2017/000000000009.jpg",
     "conversations": [{"from": "human", "value": "<image>\\nDescribe this image in detail."},
                       {"from": "gpt", "value": "The image shows ..."}]}

(``sharegpt4v_instruct_gpt4-vision_cap100k.json``, ~102K GPT-4V captions, and
``share-captioner_coco_lcs_sam_1246k_1107.json``, ~1.2M ShareCaptioner captions), with the images
under one root: ``coco/``, ``sam/``, ``llava/``, ``wikiart/``, ``web-celebrity/``, ``web-landmark/``,
``share_textvqa/``.

Output: the pinned dataset format (:mod:`balcaprl.data.format`). ``prompt`` is the human turn without
the ``<image>`` tag; ``reference`` and ``reference_original`` are both the gpt turn until
``balcaprl recaption`` replaces ``reference``.

The steps, each safe to interrupt:

1. stream the JSON (never loaded whole) and check each entry's text fields and path;
2. inspect every distinct image in a process pool (:func:`~balcaprl.data.validation.inspect_image`),
   appending each result to ``OUT/.prepare/image-checks.jsonl`` so a re-run skips what is done;
3. apply the image thresholds and de-duplicate by content hash, first entry in file order wins;
4. place the kept images under ``OUT/images/`` (see :func:`place_image` for how and why);
5. split by seeded hash, count reference tokens, write the parquet files, the rejection report
   (``rejections.jsonl``, ``rejections.json``) and, last, the card.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import multiprocessing
import os
import re
import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Literal

from balcaprl.data.format import (
    DatasetSample,
    TokenCounter,
    write_dataset,
)
from balcaprl.data.split import eval_ids
from balcaprl.data.validation import (
    REASONS,
    CheckCheckpoint,
    ImageFacts,
    ImageLimits,
    Rejection,
    image_rejection,
    inspect_image,
    lexical_path_problem,
    normalise_path,
)
from balcaprl.errors import InputError
from balcaprl.files import atomic_write_bytes, atomic_write_text

__all__ = [
    "JsonArrayStream",
    "JsonFileError",
    "ParsedEntry",
    "PrepareOptions",
    "PrepareReport",
    "default_workers",
    "parse_entry",
    "place_image",
    "prepare_sharegpt4v",
]

ImageMode = Literal["auto", "hardlink", "copy", "reencode"]
CHECKPOINT_DIR = ".prepare"
CHECKPOINT_FILE = "image-checks.jsonl"
REJECTIONS_FILE = "rejections.jsonl"
REJECTION_SUMMARY_FILE = "rejections.json"
RENAMES_FILE = "renamed_ids.jsonl"


# --------------------------------------------------------------------------------------------------
# 1. Streaming the JSON


class JsonFileError(InputError):
    """The JSON file itself is broken (not a list, cut short, a syntax error): nothing to resume."""


class _HashingReader(io.RawIOBase):
    """A raw binary reader that hashes what passes through, so the card can name the exact file."""

    def __init__(self, raw: io.BufferedReader) -> None:
        self._raw = raw
        self.sha256 = hashlib.sha256()
        self.bytes_read = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = self._raw.readinto(buffer)
        if n:
            view = memoryview(buffer)[:n]
            self.sha256.update(view)
            self.bytes_read += n
        return n or 0


class JsonArrayStream:
    """Iterate the elements of a top-level JSON array without loading the file.

    The standard library's C decoder (``raw_decode``) parses one element at a time out of a text
    buffer refilled in 1 MiB chunks; no extra dependency, and as fast as the whole-file ``json.load``
    per element. After iteration, ``sha256`` is the file's digest and ``size`` its byte count.
    """

    CHUNK = 1 << 20
    MAX_ELEMENT = 64 << 20  # an element larger than this means a syntax error, not a long caption

    def __init__(self, path: Path | str, on_bytes: Callable[[int], None] | None = None) -> None:
        self.path = Path(path)
        self.size = self.path.stat().st_size
        self.sha256: str | None = None
        self._on_bytes = on_bytes
        self._ws = re.compile(r"[ \t\n\r]*")

    def __iter__(self) -> Iterator[Any]:
        decoder = json.JSONDecoder()
        with self.path.open("rb") as raw:
            hashing = _HashingReader(raw)
            text = io.TextIOWrapper(io.BufferedReader(hashing, self.CHUNK), encoding="utf-8-sig")
            buf, pos, eof, seen = "", 0, False, 0
            consumed = 0  # characters dropped from the front of buf, for error offsets

            def fill() -> None:
                nonlocal buf, pos, eof, consumed
                before = hashing.bytes_read
                chunk = text.read(self.CHUNK)
                if self._on_bytes is not None:
                    self._on_bytes(hashing.bytes_read - before)
                consumed += pos
                buf, pos = buf[pos:] + chunk, 0
                eof = eof or not chunk

            def skip_ws() -> None:
                nonlocal pos
                while True:
                    pos = self._ws.match(buf, pos).end()
                    if pos < len(buf) or eof:
                        return
                    fill()

            def fail(message: str) -> JsonFileError:
                return JsonFileError(
                    f"{self.path}: {message} (element {seen}, character {consumed + pos}); the file is not "
                    "a complete ShareGPT4V JSON list, download it again"
                )

            try:
                skip_ws()
                if buf[pos : pos + 1] != "[":
                    raise fail("expected a JSON list '['")
                pos += 1
                while True:
                    skip_ws()
                    if pos >= len(buf):
                        raise fail("the file ends inside the list")
                    if buf[pos] == "]":
                        pos += 1
                        skip_ws()
                        if pos < len(buf):
                            raise fail("text after the closing ']'")
                        break
                    if seen:
                        if buf[pos] != ",":
                            raise fail(f"expected ',' or ']', found {buf[pos]!r}")
                        pos += 1
                        skip_ws()
                    while True:
                        try:
                            value, end = decoder.raw_decode(buf, pos)
                        except json.JSONDecodeError as exc:
                            if eof or len(buf) - pos > self.MAX_ELEMENT:
                                raise fail(f"JSON syntax error: {exc.msg}") from None
                            fill()
                            continue
                        if end == len(buf) and not eof:  # a number may go on in the next chunk
                            fill()
                            continue
                        break
                    pos = end
                    seen += 1
                    yield value
            except UnicodeDecodeError as exc:
                raise fail(f"not UTF-8 text: {exc}") from None
            self.sha256 = hashing.sha256.hexdigest()


# --------------------------------------------------------------------------------------------------
# Entry fields


@dataclass(slots=True)
class ParsedEntry:
    """An entry whose text fields are usable; the image is still to be checked."""

    index: int
    id: str
    image: str  # normalised path relative to the image root
    prompt: str
    caption: str


_IMAGE_TAG = re.compile(r"\s*<image>\s*")
_HUMAN = {"human", "user"}
_GPT = {"gpt", "assistant"}


def _prompt_from(value: str) -> str:
    """The human turn without its ``<image>`` tag(s) and the newlines around them."""
    parts = [p.strip() for p in _IMAGE_TAG.split(value)]
    return "\n".join(p for p in parts if p)


def parse_entry(index: int, entry: Any) -> ParsedEntry | Rejection:
    """Read one ShareGPT4V entry; a :class:`Rejection` says what is wrong with it."""

    def reject(reason: str, detail: str, sample_id: Any = None, image: Any = None) -> Rejection:
        return Rejection(
            index=index,
            id=None if sample_id is None else str(sample_id),
            image=image if isinstance(image, str) else None,
            reason=reason,
            detail=detail,
        )

    if not isinstance(entry, dict):
        return reject("malformed_entry", f"expected an object, got {type(entry).__name__}")
    sample_id, image = entry.get("id"), entry.get("image")
    if not isinstance(sample_id, str | int) or isinstance(sample_id, bool) or str(sample_id).strip() == "":
        return reject("malformed_entry", "no `id`", image=image)
    sample_id = str(sample_id).strip()
    if not isinstance(image, str) or not image.strip():
        return reject(
            "malformed_entry", "no `image` path (text-only entries have no image to caption)", sample_id
        )
    problem = lexical_path_problem(image)
    if problem:
        return reject("unsafe_path", problem, sample_id, image)
    image = normalise_path(image)
    turns = entry.get("conversations")
    if not isinstance(turns, list) or not turns:
        return reject("missing_conversations", "no `conversations` list, or an empty one", sample_id, image)
    if not all(isinstance(t, dict) for t in turns):
        return reject("malformed_entry", "a conversation turn is not an object", sample_id, image)
    human = next((i for i, t in enumerate(turns) if t.get("from") in _HUMAN), None)
    if human is None:
        return reject("no_human_turn", "no turn from 'human'", sample_id, image)
    gpt = next((i for i, t in enumerate(turns) if i > human and t.get("from") in _GPT), None)
    if gpt is None:
        return reject("no_gpt_turn", "no turn from 'gpt' after the human turn", sample_id, image)
    prompt_value, caption_value = turns[human].get("value"), turns[gpt].get("value")
    if not isinstance(prompt_value, str) or not isinstance(caption_value, str):
        return reject("malformed_entry", "a turn's `value` is not text", sample_id, image)
    prompt = _prompt_from(prompt_value)
    if not prompt:
        return reject("empty_prompt", "the human turn holds only the <image> tag", sample_id, image)
    caption = caption_value.strip()
    if not caption:
        return reject("empty_caption", "the gpt turn is empty", sample_id, image)
    return ParsedEntry(index=index, id=sample_id, image=image, prompt=prompt, caption=caption)


# --------------------------------------------------------------------------------------------------
# 4. Placing images


def _reencoded_name(image: str) -> str:
    return image if image.lower().endswith((".jpg", ".jpeg")) else image + ".jpg"


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


def _place(job: tuple[str, str, str, str, int]) -> tuple[str, str, str | None, str | None]:
    image, src, dst, mode, max_side = job
    try:
        how, digest = place_image(src, dst, mode, max_side)  # type: ignore[arg-type]
        return image, how, digest, None
    except OSError as exc:
        return image, "failed", None, f"{type(exc).__name__}: {exc}"


# --------------------------------------------------------------------------------------------------
# The whole preparation


@dataclass(frozen=True)
class PrepareOptions:
    """Everything `balcaprl prepare sharegpt4v` can be told, with its defaults."""

    eval_size: int = 1000  # samples held out for evaluation (at most half of the kept samples)
    seed: int = 0  # seeds the train/eval split
    limits: ImageLimits = field(default_factory=ImageLimits)
    image_mode: ImageMode = "auto"
    reencode_max_side: int = 1024
    allow_symlinks_out: bool = False
    workers: int | None = None  # None: one per available core; 0 or 1: no pool (in this process)
    limit: int | None = None  # read only the first N entries (trial runs)
    name: str | None = None  # dataset name in the card; default "sharegpt4v-<json file stem>"


@dataclass
class PrepareReport:
    out: Path
    entries: int = 0
    kept: int = 0
    train: int = 0
    eval: int = 0
    rejections: Counter = field(default_factory=Counter)
    images_checked: int = 0  # inspected in this run
    images_reused: int = 0  # taken from the checkpoint of an earlier, interrupted run
    placement: Counter = field(default_factory=Counter)
    renamed_ids: int = 0
    pruned_images: int = 0
    seconds: dict[str, float] = field(default_factory=dict)

    def images_per_second(self) -> float:
        spent = self.seconds.get("check_images", 0.0)
        return self.images_checked / spent if spent > 0 else float("nan")


def default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def _pool_map(fn: Callable[[Any], Any], items: list[Any], workers: int, chunksize: int) -> Iterator[Any]:
    """``map`` in a process pool (results in completion order), or in this process for workers <= 1."""
    if workers <= 1 or len(items) <= 1:
        yield from map(fn, items)
        return
    with multiprocessing.get_context().Pool(min(workers, len(items))) as pool:
        yield from pool.imap_unordered(fn, items, chunksize=chunksize)


class _NoProgress:
    def add_task(self, *args: Any, **kwargs: Any) -> int:
        return 0

    def update(self, *args: Any, **kwargs: Any) -> None:
        pass

    def advance(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __enter__(self) -> _NoProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def make_progress(enabled: bool) -> Any:
    """A rich progress display on stderr (or a silent stand-in)."""
    if not enabled:
        return _NoProgress()
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TaskProgressColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TaskProgressColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
    )


def prepare_sharegpt4v(
    json_path: Path | str,
    image_root: Path | str,
    out_dir: Path | str,
    *,
    options: PrepareOptions | None = None,
    token_counter: TokenCounter | None = None,
    progress: bool = False,
    inspect: Callable[..., ImageFacts] = inspect_image,
) -> PrepareReport:
    """Prepare ShareGPT4V (or any file in its layout) as a dataset folder; see the module docstring.

    Bad entries never stop the run: each is recorded with its reason. Only a broken JSON file
    (:class:`JsonFileError`) or an unusable ``out_dir`` raises. ``inspect`` is replaceable for tests.
    """
    opts = options or PrepareOptions()
    json_path = Path(json_path)
    root = os.path.realpath(Path(image_root).expanduser())
    if not os.path.isdir(root):
        raise FileNotFoundError(f"--image-root {image_root} is not a folder")
    out = Path(out_dir).expanduser().resolve()
    out.mkdir(parents=True, exist_ok=True)
    if out == Path(root):
        raise ValueError("--out must not be the image root itself; use a new folder (e.g. next to it)")
    workers = default_workers() if opts.workers is None else opts.workers
    report = PrepareReport(out=out)
    rejections: list[Rejection] = []

    with make_progress(progress) as bars:
        with _timed(report, "read_json"):
            parsed, json_sha256 = _read_entries(json_path, opts.limit, rejections, report, bars)
        with _timed(report, "check_images"):
            facts = _check_images(parsed, root, out, opts, workers, inspect, report, bars)
        kept = _select(parsed, facts, opts.limits, rejections)
        del parsed
        renames = _unique_ids(kept)  # ids must be unique: a repeated id on another image is renamed
        report.renamed_ids = len(renames)
        with _timed(report, "place_images"):
            placed = _place_images(kept, root, out, opts, workers, report, bars)

    with _timed(report, "write"):
        ids = [entry.id for entry, _ in kept]
        eval_size = min(opts.eval_size, len(ids) // 2)
        held_out = eval_ids(ids, eval_size, opts.seed)
        report.kept, report.eval = len(kept), len(held_out)
        report.train = report.kept - report.eval
        _write_reports(out, rejections, renames, report)

        def samples(want_eval: bool) -> Iterator[DatasetSample]:
            for entry, image_facts in kept:
                if (entry.id in held_out) == want_eval:
                    placed_name, placed_sha256 = placed[entry.image]
                    yield DatasetSample(
                        id=entry.id,
                        image=out / "images" / placed_name,
                        prompt=entry.prompt,
                        reference=entry.caption,
                        reference_original=entry.caption,
                        source="sharegpt4v/" + entry.image.split("/", 1)[0],
                        image_sha256=placed_sha256 or image_facts.sha256,
                    )

        from balcaprl import __version__

        write_dataset(
            out,
            samples(False),
            samples(True),
            name=opts.name or f"sharegpt4v-{json_path.stem}",
            version="1",
            token_counter=token_counter,
            rejections=dict(report.rejections.most_common()),
            extra={
                "created_by": f"balcaprl {__version__} prepare sharegpt4v",
                "source": {
                    "dataset": "ShareGPT4V (Lin-Chen/ShareGPT4V)",
                    "json": json_path.name,
                    "json_sha256": json_sha256,
                    "entries_read": report.entries,
                    "limit": opts.limit,
                    "image_root": root,
                },
                "split": {
                    "method": "eval = the eval_size ids with the smallest sha256(f'{seed}:{id}')",
                    "seed": opts.seed,
                    "eval_size": eval_size,
                    "eval_size_requested": opts.eval_size,
                },
                "checks": {**asdict(opts.limits), "allow_symlinks_out": opts.allow_symlinks_out},
                "images": {
                    "mode": opts.image_mode,
                    **({"max_side": opts.reencode_max_side} if opts.image_mode == "reencode" else {}),
                    **dict(report.placement),
                },
                "rejections_file": REJECTIONS_FILE,
                "renamed_ids": report.renamed_ids,
                "recaption": None,
            },
        )
    return report


@contextmanager
def _timed(report: PrepareReport, step: str) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        report.seconds[step] = time.perf_counter() - start


def _read_entries(
    json_path: Path, limit: int | None, rejections: list[Rejection], report: PrepareReport, bars: Any
) -> tuple[list[ParsedEntry], str | None]:
    """Step 1: stream the JSON; usable entries, and the file's sha256 (None when cut by ``limit``)."""
    size = json_path.stat().st_size
    reading = bars.add_task("reading JSON (bytes)", total=size)
    stream = JsonArrayStream(json_path, on_bytes=lambda n: bars.advance(reading, n))
    parsed: list[ParsedEntry] = []
    prompts: dict[str, str] = {}  # ShareGPT4V has a dozen distinct prompts: store each once
    for index, entry in enumerate(stream):
        if limit is not None and index >= limit:
            break
        result = parse_entry(index, entry)
        if isinstance(result, Rejection):
            rejections.append(result)
        else:
            result.prompt = prompts.setdefault(result.prompt, result.prompt)
            parsed.append(result)
        report.entries += 1
    bars.update(reading, completed=size)
    return parsed, stream.sha256


def _check_images(
    parsed: list[ParsedEntry],
    root: str,
    out: Path,
    opts: PrepareOptions,
    workers: int,
    inspect: Callable[..., ImageFacts],
    report: PrepareReport,
    bars: Any,
) -> dict[str, ImageFacts]:
    """Step 2: inspect each distinct image once, in a process pool, resuming from the checkpoint."""
    facts: dict[str, ImageFacts] = {}
    with CheckCheckpoint(out / CHECKPOINT_DIR / CHECKPOINT_FILE, root) as checkpoint:
        todo = []
        for image in dict.fromkeys(entry.image for entry in parsed):
            known = checkpoint.reusable(image)
            if known is None:
                todo.append(image)
            else:
                facts[image] = known
        report.images_reused = len(facts)
        checking = bars.add_task("checking images", total=len(todo))
        check = partial(inspect, root, allow_symlinks_out=opts.allow_symlinks_out)
        for result in checkpoint.extend(_pool_map(check, todo, workers, chunksize=8)):
            facts[result.image] = result
            report.images_checked += 1
            bars.advance(checking)
    return facts


def _select(
    parsed: list[ParsedEntry], facts: dict[str, ImageFacts], limits: ImageLimits, rejections: list[Rejection]
) -> list[tuple[ParsedEntry, ImageFacts]]:
    """Step 3: the image thresholds, then de-duplication by content; the first entry in file order wins."""
    kept: list[tuple[ParsedEntry, ImageFacts]] = []
    first_by_hash: dict[str | None, ParsedEntry] = {}
    for entry in parsed:
        image_facts = facts[entry.image]
        problem = image_rejection(image_facts, limits)
        if problem is None and image_facts.sha256 in first_by_hash:
            first = first_by_hash[image_facts.sha256]
            problem = ("duplicate_image", f"same image content as id {first.id!r} ({first.image})")
        if problem is not None:
            rejections.append(Rejection(entry.index, entry.id, entry.image, *problem))
            continue
        first_by_hash[image_facts.sha256] = entry
        kept.append((entry, image_facts))
    return kept


def _place_images(
    kept: list[tuple[ParsedEntry, ImageFacts]],
    root: str,
    out: Path,
    opts: PrepareOptions,
    workers: int,
    report: PrepareReport,
    bars: Any,
) -> dict[str, tuple[str, str | None]]:
    """Step 4: every kept image under ``out/images/`` (see :func:`place_image`); leftovers of earlier
    runs are removed. Returns image -> (name under images/, sha256 if the file was re-encoded)."""
    images_dir = out / "images"
    names = {f.image: _reencoded_name(f.image) if opts.image_mode == "reencode" else f.image for _, f in kept}
    jobs = [
        (
            image,
            os.path.realpath(os.path.join(root, image)),
            str(images_dir / name),
            opts.image_mode,
            opts.reencode_max_side,
        )
        for image, name in names.items()
    ]
    placing = bars.add_task(f"placing images ({opts.image_mode})", total=len(jobs))
    placed: dict[str, tuple[str, str | None]] = {}
    failed: dict[str, str] = {}
    for image, how, digest, error in _pool_map(_place, jobs, workers, chunksize=32):
        report.placement[how] += 1
        if error:
            failed[image] = error
        else:
            placed[image] = (names[image], digest)
        bars.advance(placing)
    if failed:
        # Disk full or permissions on the *output*: a problem with this machine, not with the data.
        image, error = next(iter(failed.items()))
        raise OSError(
            f"could not place {len(failed)} image(s) under {images_dir}, e.g. {image}: {error}; "
            "fix the output folder (space, permissions) and run the same command again to resume"
        )
    report.pruned_images = _prune(images_dir, {images_dir / name for name in names.values()})
    return placed


def _write_reports(
    out: Path, rejections: list[Rejection], renames: list[dict[str, Any]], report: PrepareReport
) -> None:
    """Step 5a: ``rejections.jsonl`` (one line per rejected entry), ``rejections.json`` (counts and
    meanings) and ``renamed_ids.jsonl``; the card, written last by ``write_dataset``, has the counts."""
    rejections.sort(key=lambda r: r.index)
    report.rejections = Counter(r.reason for r in rejections)
    atomic_write_text(out / REJECTIONS_FILE, "".join(r.to_json() + "\n" for r in rejections))
    summary = {
        "entries": report.entries,
        "kept": report.kept,
        "rejected": len(rejections),
        "by_reason": {
            reason: {"count": n, "meaning": REASONS[reason]} for reason, n in report.rejections.most_common()
        },
    }
    atomic_write_text(out / REJECTION_SUMMARY_FILE, json.dumps(summary, indent=2) + "\n")
    if renames:
        atomic_write_text(out / RENAMES_FILE, "".join(json.dumps(r) + "\n" for r in renames))
    else:
        (out / RENAMES_FILE).unlink(missing_ok=True)


def _unique_ids(kept: list[tuple[ParsedEntry, ImageFacts]]) -> list[dict[str, Any]]:
    """Give a repeated id a ``#2``, ``#3``... suffix (first occurrence keeps its id); returns renames."""
    taken = Counter(e.id for e, _ in kept)
    renames = []
    seen: set[str] = set()
    for entry, _ in kept:
        if entry.id not in seen:
            seen.add(entry.id)
            continue
        k = 2
        while f"{entry.id}#{k}" in taken or f"{entry.id}#{k}" in seen:
            k += 1
        new = f"{entry.id}#{k}"
        renames.append({"index": entry.index, "id": new, "original_id": entry.id, "image": entry.image})
        entry.id = new
        seen.add(new)
    return renames


def _prune(images_dir: Path, keep: Iterable[Path]) -> int:
    """Remove files under ``images/`` that the dataset no longer uses (an earlier run's leftovers)."""
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
