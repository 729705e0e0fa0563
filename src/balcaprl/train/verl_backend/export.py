"""A balcaprl dataset folder -> verl's multimodal RL parquet rows (``balcaprl verl export``).

Reads the pinned on-disk format (docs/data.md: train.parquet / eval.parquet, images/, dataset.json) and
writes, per split, one verl row per image:

    data_source   "balcaprl/<dataset name>"   (verl groups metrics by it)
    prompt        [{"role": "user", "content": "<image>" + prompt}]   verl's RLHFDataset turns the
                  placeholder into an image part before the text, as TRL does
    images        [{"image": "/abs/path.png"}], or [{"bytes": ...}] with embed_images (a self-contained
                  parquet; the judge still reads the image files, so they must be reachable anyway)
    ability       "captioning"
    reward_model  {"style": "model", "ground_truth": <the reference caption the judge compares against>}
    extra_info    {"index", "id", "split", "image" (relative), "image_path" (absolute), "image_sha256",
                   "reference_tokens", "tokenizer", "source"}

``reference_tokens`` is the reference's length for the length mask, in the tokenizer named next to it:
recounted with ``tokenizer`` when one is given (pass the policy checkpoint), else the dataset's column
with the card's tokenizer. The reward function reuses it only when that tokenizer is the policy's, and
recounts otherwise, so a mismatch costs time, never correctness.

Output: ``OUT/train.parquet``, ``OUT/eval.parquet`` and ``OUT/export.json`` (what was exported, from
where, with which settings); ``export.json`` last, so its presence means done. Every input is checked
first (the dataset card and splits, the tokenizer, each row's caption and prompt, and with
``embed_images`` each image file), before anything is written. An ``OUT`` that already holds an
export (any of the three files) is refused unless ``overwrite``; then the new export is written in a
sibling folder and swapped in at the end (``balcaprl.outputs``), so a failed export leaves the old
one as it was, manifest included. Needs pyarrow only (no verl), so it also runs where verl is not
installed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.parquet as pq

from balcaprl.data.format import SPLITS, read_card, read_split_rows
from balcaprl.errors import InputError, MissingInputError
from balcaprl.files import atomic_write_text, temporary_sibling
from balcaprl.outputs import claim_output_dir, present, remove

EXPORT_FILE = "export.json"
SPLIT_FILES = {"train": "train.parquet", "eval": "eval.parquet"}
IMAGE_PLACEHOLDER = "<image>"
_OTHER_PLACEHOLDERS = ("<video>", "<audio>")

_PROMPT = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
_REWARD_MODEL = pa.struct([("style", pa.string()), ("ground_truth", pa.string())])
_EXTRA_INFO = pa.struct(
    [
        ("index", pa.int64()),
        ("id", pa.string()),
        ("split", pa.string()),
        ("image", pa.string()),
        ("image_path", pa.string()),
        ("image_sha256", pa.string()),
        ("reference_tokens", pa.int64()),
        ("tokenizer", pa.string()),
        ("source", pa.string()),
    ]
)


def _schema(embed_images: bool) -> pa.Schema:
    image = pa.struct([("bytes", pa.binary())]) if embed_images else pa.struct([("image", pa.string())])
    return pa.schema(
        [
            ("data_source", pa.string()),
            ("prompt", _PROMPT),
            ("images", pa.list_(image)),
            ("ability", pa.string()),
            ("reward_model", _REWARD_MODEL),
            ("extra_info", _EXTRA_INFO),
        ]
    )


@dataclass(frozen=True)
class ExportResult:
    out_dir: Path
    counts: dict[str, int]
    manifest: dict[str, Any]

    def path(self, split: str) -> Path:
        return self.out_dir / SPLIT_FILES[split]


def _user_content(prompt: str, row_id: str) -> str:
    for tag in _OTHER_PLACEHOLDERS:
        if tag in prompt:
            raise InputError(
                f"row {row_id!r}: the prompt contains {tag!r}, which verl's RLHFDataset would read as a "
                "media placeholder; remove it from the dataset"
            )
    text = prompt.replace(IMAGE_PLACEHOLDER, "").strip()
    if not text:
        raise InputError(f"row {row_id!r}: empty prompt")
    return IMAGE_PLACEHOLDER + text


def _image_unreadable(split: str, row_id: str, image_path: str, error: OSError) -> InputError:
    return InputError(f"{split} row {row_id!r}: image {image_path} cannot be read ({error.strerror})")


def _check_row(row: Mapping[str, Any], *, split: str, reference: str, embed_images: bool) -> str:
    """What :func:`verl_row` needs of a dataset row, checked without writing anything: a caption, a
    usable prompt and (``embed_images``) a readable image file; returns the prompt's user content."""
    row_id = str(row["id"])
    caption = row[reference]
    if caption is None or not str(caption).strip():
        raise InputError(f"{split} row {row_id!r} has no {reference!r} caption; the judge needs one")
    content = _user_content(str(row["prompt"]), row_id)
    if embed_images:
        image_path = str(Path(row["image_path"]).resolve())
        try:
            with open(image_path, "rb"):
                pass
        except OSError as error:
            raise _image_unreadable(split, row_id, image_path, error) from None
    return content


def verl_row(
    row: Mapping[str, Any],
    index: int,
    *,
    split: str,
    data_source: str,
    reference: str,
    reference_tokens: int | None,
    tokenizer: str | None,
    embed_images: bool,
) -> dict[str, Any]:
    """One verl row from one dataset row (``read_split_rows`` shape, with ``image_path``)."""
    row_id = str(row["id"])
    content = _check_row(row, split=split, reference=reference, embed_images=False)
    caption = row[reference]
    image_path = str(Path(row["image_path"]).resolve())
    try:
        image = {"bytes": Path(image_path).read_bytes()} if embed_images else {"image": image_path}
    except OSError as error:
        raise _image_unreadable(split, row_id, image_path, error) from None
    return {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": content}],
        "images": [image],
        "ability": "captioning",
        "reward_model": {"style": "model", "ground_truth": str(caption)},
        "extra_info": {
            "index": index,
            "id": row_id,
            "split": split,
            "image": str(row["image"]),
            "image_path": image_path,
            "image_sha256": row.get("image_sha256"),
            "reference_tokens": None if reference_tokens is None else int(reference_tokens),
            "tokenizer": tokenizer,
            "source": row.get("source"),
        },
    }


def _count_with(tokenizer: str) -> Any:
    from balcaprl.data.format import TokenCounter

    return TokenCounter.load(tokenizer)


ROWS_PER_GROUP = 1024  # bounded memory when images are embedded


def _write_parquet(path: Path, rows: Iterable[dict[str, Any]], schema: pa.Schema) -> int:
    """Stream ``rows`` into ``path`` (temporary name, then an atomic rename); returns the row count."""
    fd, tmp = temporary_sibling(path)
    os.close(fd)
    written = 0
    try:
        with pq.ParquetWriter(tmp, schema) as writer:
            group: list[dict[str, Any]] = []
            for row in rows:
                group.append(row)
                if len(group) >= ROWS_PER_GROUP:
                    writer.write_table(pa.Table.from_pylist(group, schema=schema))
                    written += len(group)
                    group = []
            if group or written == 0:
                writer.write_table(pa.Table.from_pylist(group, schema=schema))
                written += len(group)
        os.replace(tmp, path)
        return written
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def export_results(folder: Path | str) -> list[str]:
    """What in ``folder`` is an export (finished or not): what a new export there would replace."""
    return present(Path(folder), [EXPORT_FILE, *SPLIT_FILES.values()])


@dataclass(frozen=True)
class _Split:
    rows: list[dict[str, Any]]
    lengths: list[int | None]
    tokenizers: list[str | None]


def export_verl(
    data_dir: Path | str,
    out_dir: Path | str,
    *,
    reference: Literal["reference", "reference_original"] = "reference",
    tokenizer: str | None = None,
    embed_images: bool = False,
    splits: Sequence[str] = SPLITS,
    max_samples: int | None = None,
    overwrite: bool = False,
    what: str = "--out",
) -> ExportResult:
    """Write verl parquet files for ``data_dir`` into ``out_dir``; see the module docstring.

    Raises :class:`~balcaprl.errors.InputError` for an input that cannot be exported (before anything
    is written), and :class:`~balcaprl.errors.UserError` naming ``what`` when ``out_dir`` already
    holds an export and ``overwrite`` is not set."""
    root = Path(data_dir).expanduser().resolve()
    card = read_card(root)
    out = Path(out_dir).expanduser().resolve()
    if out == root or out in root.parents:  # --overwrite would replace the dataset itself
        raise InputError("the export folder must differ from the dataset folder (both have train.parquet) "
                         "and must not contain it")  # fmt: skip
    if reference not in ("reference", "reference_original"):
        raise InputError(f"reference must be 'reference' or 'reference_original', got {reference!r}")
    unknown = [s for s in splits if s not in SPLIT_FILES]
    if unknown:
        raise InputError(f"unknown splits {unknown}; choose from {sorted(SPLIT_FILES)}")

    # Every input is read and checked before the output place is touched.
    counter = _count_with(tokenizer) if tokenizer is not None else None
    # The dataset's column counts the re-captioned `reference` with the card's tokenizer.
    column_tokenizer = card.get("tokenizer") if reference == "reference" else None
    data_source = f"balcaprl/{card.get('name', root.name)}"
    planned: dict[str, _Split] = {}
    for split in splits:
        rows = read_split_rows(root, split)
        if max_samples is not None:
            rows = rows[:max_samples]
        for row in rows:
            _check_row(row, split=split, reference=reference, embed_images=embed_images)
        references = [r[reference] for r in rows]
        if counter is not None:
            lengths: list[int | None] = list(counter.count([str(t or "") for t in references]))
            names: list[str | None] = [tokenizer] * len(rows)
        else:
            lengths = [r["reference_tokens"] if column_tokenizer else None for r in rows]
            names = [column_tokenizer if n is not None else None for n in lengths]
        planned[split] = _Split(rows, lengths, names)

    target = claim_output_dir(
        out, what=what, results=export_results, overwrite=overwrite, offers_resume=False
    )
    schema = _schema(embed_images)
    counts: dict[str, int] = {}
    try:
        with target.committing():
            for split, plan in planned.items():
                verl_rows = (
                    verl_row(
                        row,
                        i,
                        split=split,
                        data_source=data_source,
                        reference=reference,
                        reference_tokens=n,
                        tokenizer=name,
                        embed_images=embed_images,
                    )
                    for i, (row, n, name) in enumerate(
                        zip(plan.rows, plan.lengths, plan.tokenizers, strict=True)
                    )
                )
                counts[split] = _write_parquet(target.work / SPLIT_FILES[split], verl_rows, schema)
            manifest = {
                "format": "verl-rlhf-multimodal",
                "dataset": str(root),
                "dataset_name": card.get("name"),
                "dataset_version": card.get("version"),
                "data_source": data_source,
                "reference": reference,
                "reference_tokens_tokenizer": tokenizer if tokenizer is not None else column_tokenizer,
                "embed_images": embed_images,
                "counts": counts,
                "files": {s: SPLIT_FILES[s] for s in splits},
            }
            atomic_write_text(
                target.work / EXPORT_FILE, json.dumps(manifest, indent=2, sort_keys=True) + "\n"
            )
    except BaseException:
        if not target.replacing:  # the folder held no export: what this one wrote is only half of one
            remove(target.work, SPLIT_FILES.values())
        raise
    return ExportResult(target.final, counts, manifest)


def read_export(out_dir: Path | str) -> dict[str, Any]:
    """The manifest of a finished export; raises FileNotFoundError with what to run otherwise."""
    path = Path(out_dir) / EXPORT_FILE
    if not path.is_file():
        raise MissingInputError(
            f"{path} not found: {out_dir} is not a finished verl export (run `balcaprl verl export --data "
            "DATASET --out DIR`)"
        )
    return json.loads(path.read_text())
