"""The preparation pipeline: ShareGPT4V JSON + image root -> a dataset folder, resumable.

The steps, each safe to interrupt:

1. stream the JSON (:mod:`.stream`) and check each entry's text fields and path (:mod:`.entries`);
2. inspect every distinct image in a process pool (:func:`~balcaprl.data.validation.inspect_image`),
   appending each result to the resume file ``OUT/.prepare/image-checks.jsonl`` (:mod:`.checkpoint`)
   so a re-run skips what is done;
3. apply the image thresholds and de-duplicate by content hash, first entry in file order wins;
4. place the kept images under ``OUT/images/`` (:func:`~balcaprl.data.placement.place_image`);
5. split by seeded hash (:mod:`balcaprl.data.split`), count reference tokens, write the parquet
   files, the rejection report (``rejections.jsonl``, ``rejections.json``) and, last, the card.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from balcaprl.data.format import DatasetSample, TokenCounter, write_dataset
from balcaprl.data.placement import ImageMode, place_image, placed_name, prune_images
from balcaprl.data.sharegpt4v.checkpoint import CheckCheckpoint
from balcaprl.data.sharegpt4v.entries import ParsedEntry, parse_entry
from balcaprl.data.sharegpt4v.stream import JsonArrayStream
from balcaprl.data.split import eval_ids
from balcaprl.data.validation import (
    REASONS,
    ImageFacts,
    ImageLimits,
    Rejection,
    image_rejection,
    inspect_image,
)
from balcaprl.errors import InputError, MissingInputError, OutputError
from balcaprl.files import atomic_write_text
from balcaprl.outputs import ensure_writable_dir
from balcaprl.progress import Progress

CHECKPOINT_DIR = ".prepare"
CHECKPOINT_FILE = "image-checks.jsonl"
REJECTIONS_FILE = "rejections.jsonl"
REJECTION_SUMMARY_FILE = "rejections.json"
RENAMES_FILE = "renamed_ids.jsonl"


def prepare_results(out: Path) -> list[str]:
    """What in ``out`` is the result of an earlier preparation (finished or not)."""
    names = ("dataset.json", "train.parquet", "eval.parquet", "images", REJECTIONS_FILE, CHECKPOINT_DIR)
    return [name for name in names if (Path(out) / name).exists()]


@dataclass(frozen=True)
class PrepareOptions:
    """Everything `balcaprl data prepare sharegpt4v` can be told, with its defaults."""

    eval_size: int = 1000  # samples held out for evaluation (at most half of the kept samples)
    seed: int = 0  # seeds the train/eval split
    limits: ImageLimits = field(default_factory=ImageLimits)  # image thresholds (smallest side, aspect)
    image_mode: ImageMode = "auto"  # how images enter the folder; see place_image
    reencode_max_side: int = 1024  # long side of re-encoded images (image_mode "reencode")
    allow_symlinks_out: bool = False  # accept image paths whose symlinks lead outside the image root
    workers: int | None = None  # None: one per available core; 0 or 1: no pool (in this process)
    limit: int | None = None  # read only the first N entries (trial runs)
    name: str | None = None  # dataset name in the card; default "sharegpt4v-<json file stem>"


@dataclass
class PrepareReport:
    """What a preparation did: counts, rejections by reason, image placement, and step times."""

    out: Path  # the dataset folder
    entries: int = 0  # entries read from the JSON
    kept: int = 0
    train: int = 0
    eval: int = 0
    rejections: Counter = field(default_factory=Counter)  # reason -> entries
    images_checked: int = 0  # inspected in this run
    images_reused: int = 0  # taken from the resume file of an earlier, interrupted run
    placement: Counter = field(default_factory=Counter)  # hardlinked / copied / reencoded / already_present
    renamed_ids: int = 0  # repeated ids given a "#2", "#3"... suffix
    pruned_images: int = 0  # files of an earlier run no longer used, removed from images/
    seconds: dict[str, float] = field(default_factory=dict)  # step -> wall seconds

    def images_per_second(self) -> float:
        spent = self.seconds.get("check_images", 0.0)
        return self.images_checked / spent if spent > 0 else float("nan")


def default_workers() -> int:
    """One worker process per core this process may run on."""
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
    (an :class:`~balcaprl.errors.InputError`, before any image is checked, so the
    resume file of an earlier run is kept as it was), a missing image root
    (:class:`~balcaprl.errors.MissingInputError`) or an unusable ``out_dir``
    (:class:`~balcaprl.errors.InputError`, :class:`~balcaprl.errors.OutputError`) raises.
    ``progress`` reports each step (:class:`balcaprl.progress.Progress`); ``inspect`` is
    replaceable for tests.
    """
    opts = options or PrepareOptions()
    json_path = Path(json_path)
    root = os.path.realpath(Path(image_root).expanduser())
    if not os.path.isdir(root):
        raise MissingInputError(f"--image-root {image_root} is not a folder")
    out = Path(out_dir).expanduser().resolve()
    if out == Path(root):
        raise InputError("--out must not be the image root itself; use a new folder (e.g. next to it)")
    ensure_writable_dir(out, "--out")
    workers = default_workers() if opts.workers is None else opts.workers
    report = PrepareReport(out=out)
    rejections: list[Rejection] = []

    with _timed(report, "read_json"):
        parsed, json_sha256 = _read_entries(json_path, opts.limit, rejections, report, progress)
    with _timed(report, "check_images"):
        facts = _check_images(parsed, root, out, opts, workers, inspect, report, progress)
    kept = _select(parsed, facts, opts.limits, rejections)
    del parsed
    renames = _unique_ids(kept)  # ids must be unique: a repeated id on another image is renamed
    report.renamed_ids = len(renames)
    with _timed(report, "place_images"):
        placed = _place_images(kept, root, out, opts, workers, report, progress)

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
                    placed_as, placed_sha256 = placed[entry.image]
                    yield DatasetSample(
                        id=entry.id,
                        image=out / "images" / placed_as,
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
    json_path: Path, limit: int | None, rejections: list[Rejection], report: PrepareReport, progress: bool
) -> tuple[list[ParsedEntry], str | None]:
    """Step 1: stream the JSON; usable entries, and the file's sha256 (None when cut by ``limit``)."""
    size = json_path.stat().st_size
    parsed: list[ParsedEntry] = []
    prompts: dict[str, str] = {}  # ShareGPT4V has a dozen distinct prompts: store each once
    with Progress(f"reading {json_path.name}", total=size, unit="B", enabled=progress) as reading:
        stream = JsonArrayStream(json_path, on_bytes=reading.advance)
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
        reading.status = f"{report.entries:,} entries"
    return parsed, stream.sha256


def _check_images(
    parsed: list[ParsedEntry],
    root: str,
    out: Path,
    opts: PrepareOptions,
    workers: int,
    inspect: Callable[..., ImageFacts],
    report: PrepareReport,
    progress: bool,
) -> dict[str, ImageFacts]:
    """Step 2: inspect each distinct image once, in a process pool, resuming from the resume file."""
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
        check = partial(inspect, root, allow_symlinks_out=opts.allow_symlinks_out)
        with Progress("checking images", total=len(todo), unit="images", enabled=progress) as checking:
            if report.images_reused:
                checking.status = f"{report.images_reused:,} known from an earlier run"
            for result in checkpoint.extend(_pool_map(check, todo, workers, chunksize=8)):
                facts[result.image] = result
                report.images_checked += 1
                checking.advance()
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


def _place(job: tuple[str, str, str, ImageMode, int]) -> tuple[str, str, str | None, str | None]:
    """One :func:`place_image` in a worker: (image, how, sha256 or None, error or None)."""
    image, src, dst, mode, max_side = job
    try:
        how, digest = place_image(src, dst, mode, max_side)
        return image, how, digest, None
    except OSError as exc:
        return image, "failed", None, f"{type(exc).__name__}: {exc}"


def _place_images(
    kept: list[tuple[ParsedEntry, ImageFacts]],
    root: str,
    out: Path,
    opts: PrepareOptions,
    workers: int,
    report: PrepareReport,
    progress: bool,
) -> dict[str, tuple[str, str | None]]:
    """Step 4: every kept image under ``out/images/``; leftovers of earlier runs are removed.
    Returns image -> (name under images/, sha256 if the file was re-encoded)."""
    images_dir = out / "images"
    names = {f.image: placed_name(f.image, opts.image_mode) for _, f in kept}
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
    placed: dict[str, tuple[str, str | None]] = {}
    failed: dict[str, str] = {}
    description = f"placing images ({opts.image_mode})"
    with Progress(description, total=len(jobs), unit="images", enabled=progress) as placing:
        for image, how, digest, error in _pool_map(_place, jobs, workers, chunksize=32):
            report.placement[how] += 1
            if error:
                failed[image] = error
            else:
                placed[image] = (names[image], digest)
            placing.advance()
    if failed:
        # Disk full or permissions on the *output*: a problem with this machine, not with the data.
        image, error = next(iter(failed.items()))
        raise OutputError(
            f"could not place {len(failed)} image(s) under {images_dir}, e.g. {image}: {error}; "
            "fix the output folder (space, permissions) and run the same command again to resume"
        )
    report.pruned_images = prune_images(images_dir, {images_dir / name for name in names.values()})
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
