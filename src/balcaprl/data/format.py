"""The on-disk dataset format: one folder that the synthetic world, the
ShareGPT4V preparation and re-captioning write, and that the TRL trainer and the verl exporter read.

    DIR/train.parquet, DIR/eval.parquet   columns: id, image, image_sha256, prompt, reference,
                                          reference_original (nullable), reference_tokens (nullable),
                                          source
    DIR/images/...                        image files; `image` is the path relative to DIR
    DIR/dataset.json                      the card: name, version, counts, tokenizer, rejections

It loads with ``datasets.load_dataset("parquet", data_files=...)`` (see :func:`load_split`).
Every file is written to a temporary name and renamed, so an interrupted write never leaves a
half-written dataset that looks complete.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from balcaprl.errors import InputError, MissingInputError
from balcaprl.files import atomic_write_bytes, atomic_write_text, temporary_sibling
from balcaprl.images import path_in_root
from balcaprl.model_paths import check_model_path, hub_unreachable, names_local_path

SPLITS = ("train", "eval")
SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("image", pa.string()),
        ("image_sha256", pa.string()),
        ("prompt", pa.string()),
        ("reference", pa.string()),
        ("reference_original", pa.string()),
        ("reference_tokens", pa.int64()),
        ("source", pa.string()),
    ]
)
COLUMNS = tuple(SCHEMA.names)


@dataclass(frozen=True)
class DatasetSample:
    """One training/evaluation sample before it is written.

    ``image`` is either the encoded image bytes (PNG/JPEG; written to ``images/<image_name>``) or the
    path of an image file already inside the dataset folder (kept where it is).
    """

    id: str
    image: bytes | Path
    prompt: str
    reference: str
    reference_original: str | None = None
    source: str = "unknown"
    image_name: str | None = None  # file name under images/ for bytes; default "<id>.png"
    # sha256 of the image file when the producer already knows it (ShareGPT4V preparation hashes
    # every image while validating it); with a path image this spares reading the file again.
    image_sha256: str | None = None


@dataclass(frozen=True)
class TokenCounter:
    """Counts reference tokens with a named tokenizer (the name goes into the dataset card)."""

    name: str
    count: Callable[[Sequence[str]], list[int]]

    @classmethod
    def from_hf(cls, tokenizer: Any, name: str | None = None) -> TokenCounter:
        """Wrap a Hugging Face tokenizer or processor (its ``tokenizer`` is used if it has one)."""
        tok = getattr(tokenizer, "tokenizer", tokenizer)
        label = name or getattr(tok, "name_or_path", None) or type(tok).__name__

        def count(texts: Sequence[str]) -> list[int]:
            return [len(ids) for ids in tok(list(texts), add_special_tokens=False)["input_ids"]]

        return cls(name=str(label), count=count)

    @classmethod
    def load(cls, name_or_path: str, what: str = "--tokenizer") -> TokenCounter:
        """Load a tokenizer by hub name or local folder (``AutoTokenizer``, else ``AutoProcessor``).

        The card records ``name_or_path`` exactly as given, so pass the policy's model name: the
        trainer reuses the stored lengths only when the names match (``balcaprl.train.data``).
        A local path that does not exist, or one that holds no tokenizer, is an
        :class:`~balcaprl.errors.InputError` naming ``what`` (the flag).
        """
        from balcaprl.synthetic.tokenizer import TOKENIZER_NAME, build_tokenizer  # (imported late: no cycle)

        if name_or_path == TOKENIZER_NAME:  # the synthetic world's own: built here, never downloaded
            return cls.from_hf(build_tokenizer(), name=TOKENIZER_NAME)
        check_model_path(name_or_path, what)  # a mistyped local path is not sent to the hub
        from transformers import AutoProcessor, AutoTokenizer

        offline = None if names_local_path(name_or_path) else hub_unreachable()
        local = {"local_files_only": True} if offline else {}  # the cache only: no retries on a dead hub
        try:
            tokenizer = AutoTokenizer.from_pretrained(name_or_path, **local)
        except Exception as first:  # some multimodal checkpoints only ship a processor
            try:
                tokenizer = AutoProcessor.from_pretrained(name_or_path, **local)
            except Exception:
                if offline:
                    raise InputError(
                        f"{what} {name_or_path}: not in the local Hugging Face cache, and the hub cannot be "
                        f"used ({offline}); give a local folder holding tokenizer files"
                    ) from None
                raise InputError(
                    f"{what} {name_or_path}: cannot load a tokenizer from it "
                    f"({str(first).splitlines()[0] if str(first) else type(first).__name__}); pass a hub "
                    "name or a local folder holding tokenizer files"
                ) from None
        return cls.from_hf(tokenizer, name=name_or_path)


def _image_row(root: Path, sample: DatasetSample) -> tuple[str, str]:
    if isinstance(sample.image, bytes):
        rel = Path("images") / (sample.image_name or f"{sample.id}.png")
        target = root / rel
        if not target.exists():
            atomic_write_bytes(target, sample.image)
        data = sample.image
    else:
        target = Path(sample.image)
        target = target if target.is_absolute() else root / target
        rel = path_in_root(root, target)  # an images/ folder linked to shared storage is inside
        if rel is None:
            raise ValueError(
                f"sample {sample.id!r}: image {sample.image} is outside the dataset folder {root}; "
                "pass its bytes instead so it is copied under images/"
            )
        if sample.image_sha256 is not None:
            if not target.is_file():
                raise FileNotFoundError(f"sample {sample.id!r}: image {target} does not exist")
            return rel.as_posix(), sample.image_sha256
        data = target.read_bytes()
    return rel.as_posix(), hashlib.sha256(data).hexdigest()


WRITE_BATCH_ROWS = 8192  # rows per parquet row group: bounded memory for the 1.2M-entry ShareCaptioner file


def _write_split(
    root: Path,
    split: str,
    samples: Iterable[DatasetSample],
    counter: TokenCounter | None,
    other_ids: set[str],
) -> tuple[int, set[str]]:
    """Stream ``samples`` into ``<split>.parquet`` in row groups; returns (rows, ids).

    Written to a temporary file and renamed, so a failure (duplicate id, id also in the other
    split, unreadable image) leaves the previous file, if any, untouched.
    """
    seen: set[str] = set()
    target = root / f"{split}.parquet"
    fd, tmp = temporary_sibling(target)
    os.close(fd)
    rows = 0
    try:
        # through a Python file: Arrow's own file system takes only paths that are UTF-8 (a folder
        # named with the byte 0xff is not), Python's takes them as the OS gives them
        with open(tmp, "wb") as sink, pq.ParquetWriter(sink, SCHEMA) as writer:
            batch: list[DatasetSample] = []

            def flush() -> None:
                columns: dict[str, list[Any]] = {name: [] for name in COLUMNS}
                overlap = sorted(s.id for s in batch if s.id in other_ids)
                if overlap:
                    raise ValueError(f"ids in both train and eval: {overlap[:5]}")
                for sample in batch:
                    image, digest = _image_row(root, sample)
                    for name, value in (
                        ("id", sample.id),
                        ("image", image),
                        ("image_sha256", digest),
                        ("prompt", sample.prompt),
                        ("reference", sample.reference),
                        ("reference_original", sample.reference_original),
                        ("source", sample.source),
                    ):
                        columns[name].append(value)
                references = columns["reference"]
                columns["reference_tokens"] = (
                    counter.count(references) if counter and references else [None] * len(references)
                )
                writer.write_table(pa.Table.from_pydict(columns, schema=SCHEMA))

            for sample in samples:
                if sample.id in seen:
                    raise ValueError(
                        f"{split}: duplicate sample id {sample.id!r}; ids must be unique per dataset"
                    )
                seen.add(sample.id)
                batch.append(sample)
                if len(batch) >= WRITE_BATCH_ROWS:
                    flush()
                    rows += len(batch)
                    batch = []
            if batch or rows == 0:
                flush()  # an empty split still gets a file with the schema
                rows += len(batch)
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return rows, seen


def write_dataset(
    out_dir: Path | str,
    train: Iterable[DatasetSample],
    eval: Iterable[DatasetSample],
    *,
    name: str,
    version: str = "1",
    token_counter: TokenCounter | None = None,
    rejections: dict[str, int] | None = None,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write a dataset folder; the card (``dataset.json``) is written last, so its presence means done.

    ``train`` and ``eval`` may be lazy iterables: rows are written in row groups of
    ``WRITE_BATCH_ROWS``, so a million-row split never sits in memory as one Arrow table.
    """
    root = Path(out_dir)
    root.mkdir(parents=True, exist_ok=True)
    (root / "dataset.json").unlink(missing_ok=True)  # an old card must not vouch for new, partial files
    ids: set[str] = set()
    counts = {}
    for split, samples in (("train", train), ("eval", eval)):
        counts[split], split_ids = _write_split(root, split, samples, token_counter, ids)
        ids |= split_ids
    card = {
        "name": name,
        "version": version,
        "counts": counts,
        "tokenizer": token_counter.name if token_counter else None,
        "rejections": dict(rejections or {}),
        **(extra or {}),
    }
    atomic_write_text(root / "dataset.json", json.dumps(card, indent=2, sort_keys=True) + "\n")
    return root


def read_card(dataset_dir: Path | str) -> dict[str, Any]:
    """The dataset's card; :class:`~balcaprl.errors.MissingInputError` when ``dataset_dir`` is not a
    finished dataset, :class:`~balcaprl.errors.InputError` when the card is not readable JSON."""
    card = Path(dataset_dir) / "dataset.json"
    if not card.is_file():
        raise MissingInputError(
            f"{card} not found: {dataset_dir} is not a finished balcaprl dataset "
            "(build one with `balcaprl synthetic build` or `balcaprl data prepare sharegpt4v`)"
        )
    try:
        data = json.loads(card.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:  # ValueError: bad JSON or bytes that are not UTF-8
        raise InputError(f"{card}: cannot read the dataset card ({error}); rebuild the dataset") from None
    if not isinstance(data, dict):
        raise InputError(f"{card}: the dataset card is not a JSON object; rebuild the dataset")
    return data


def _split_path(dataset_dir: Path | str, split: str) -> Path:
    if split not in SPLITS:  # the --split of `caption`, `synthetic show` and `synthetic caption`
        raise InputError(f"--split {split}: unknown split; choose {' or '.join(SPLITS)}")
    read_card(dataset_dir)
    return Path(dataset_dir) / f"{split}.parquet"


def read_split_table(dataset_dir: Path | str, split: str) -> pa.Table:
    """One split as an Arrow table; a missing or corrupt parquet file is an
    :class:`~balcaprl.errors.InputError` naming it."""
    path = _split_path(dataset_dir, split)
    try:
        with open(path, "rb") as source:  # a Python file: any path the OS allows (see _write_split)
            return pq.read_table(source)
    except FileNotFoundError:
        raise MissingInputError(f"{path} not found: the dataset is incomplete; rebuild it") from None
    except (OSError, pa.ArrowException) as error:
        raise InputError(f"{path}: not a readable parquet file ({error}); rebuild the dataset") from None


def read_split_rows(dataset_dir: Path | str, split: str) -> list[dict[str, Any]]:
    """The rows of one split as dicts, with ``image_path`` (absolute) added for convenience."""
    root = Path(dataset_dir)
    rows = read_split_table(root, split).to_pylist()
    for row in rows:
        row["image_path"] = str(root / row["image"])
    return rows


def load_split(dataset_dir: Path | str, split: str):  # -> datasets.Dataset
    """Load one split through Hugging Face ``datasets`` (the path trainers use)."""
    import datasets

    path = _split_path(dataset_dir, split)
    return datasets.load_dataset("parquet", data_files={split: str(path)}, split=split)
