"""The benchmarks' own files, read and written exactly as their official code does (no download here:
every path comes from the user).

Every row is read as published: texts are kept as they are (DeCapBench's oracle facts and captions
are not stripped, and its one blank fact, ``" "`` at the end of ``aar_test_04840.jpg``, counts like any
other, as the official scorer counts it). A row that cannot be used is *refused*: it is left out and
named, with the reason, in the reader's ``refused`` list (:class:`BenchmarkRows`); one bad row never
refuses the whole file. Only a file that is not in the format at all (unreadable, empty, the wrong
top-level shape) is an error.

- **DeCapBench** (DCScore; also b-CapScore's images and human references): the annotation file
  (``IIW_400_data.jsonl``: one object per image with ``image_name``, ``oracle_caption`` and
  ``oracle_facts``, a list of human-written atomic facts) and caption files in JSONL with the image
  (``image_path`` or ``image_name``) and ``caption`` (``oracle_caption`` may ride along).
- **CaptionQA**: the question set of ``Borise/CaptionQA`` as saved from the hub (parquet, JSON or
  JSONL rows with ``id`` and ``questions``: ``question``, ``choices``, ``answer`` (the text of the
  right choice), ``category`` (a string or a list whose first item counts); images, when present,
  as ``images``/``image`` structs with ``bytes``), or the legacy ``{image_key: [question, ...]}``
  JSON; caption files are ``{id: caption}``.
- **CapArena-Auto**: ``caparena_auto_600.json``, ``{"test_XXXXX.jpg": {"ref_model": baseline,
  "captions": {model: caption, ..., "human": reference}}}``; caption files are
  ``{"test_XXXXX.jpg": caption}``.

Our own caption file (what ``balcaprl caption`` writes): JSONL, one object per image with ``key``
(the benchmark's own key for the image), ``image``, ``caption`` and ``benchmark``; it can hold
captions for several benchmarks at once.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from balcaprl.errors import InputError
from balcaprl.files import jsonl_lines, read_utf8_text

BENCHMARKS = ("decapbench", "captionqa", "caparena")


def _read_text(path: Path) -> str:
    """The UTF-8 text of a benchmark or caption file, read in bounded chunks (:func:`read_utf8_text`)."""
    try:
        return read_utf8_text(path)
    except InputError as error:
        raise InputError(str(error)) from None


def read_json_or_jsonl(path: Path) -> Any:
    """A JSON document, or the list of objects of a JSONL file."""
    path = Path(path)
    text = _read_text(path)
    stripped = text.strip()
    if not stripped:
        raise InputError(f"{path}: the file is empty")
    try:
        return json.loads(stripped)
    except json.JSONDecodeError:
        pass
    rows = []
    for number, line in enumerate(jsonl_lines(text), 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as error:
            raise InputError(f"{path}:{number}: neither a JSON document nor JSONL ({error.msg})") from None
    return rows


@dataclass(frozen=True)
class RefusedRow:
    """A benchmark row left out: where it is (file and line, or its key) and why."""

    where: str
    reason: str

    def __str__(self) -> str:
        return f"{self.where}: {self.reason}"

    def as_dict(self) -> dict[str, str]:
        return {"where": self.where, "reason": self.reason}


class BenchmarkRows(list):
    """The usable rows of a benchmark file (a list), and ``refused``: the rows left out, with reasons."""

    def __init__(self, items: Iterable[Any] = (), refused: Iterable[RefusedRow] = ()):
        super().__init__(items)
        self.refused: list[RefusedRow] = list(refused)


def _rows(path: Path) -> tuple[list[tuple[str, Any]], list[RefusedRow]]:
    """``(where, value)`` per row of a JSON list/object or a JSONL file; a JSONL line that is not JSON
    is refused (named by its line), never the whole file."""
    path = Path(path)
    text = _read_text(path)
    if not text.strip():
        raise InputError(f"{path}: the file is empty")
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = None
    else:
        if isinstance(data, list):
            return [(f"{path}: row {n}", row) for n, row in enumerate(data, 1)], []
        return [(f"{path}: row 1", data)], []
    rows, refused = [], []
    for number, line in enumerate(jsonl_lines(text), 1):
        if not line.strip():
            continue
        try:
            rows.append((f"{path}:{number}", json.loads(line)))
        except json.JSONDecodeError as error:
            refused.append(RefusedRow(f"{path}:{number}", f"not JSON ({error.msg})"))
    if not rows:
        raise InputError(f"{path}: neither a JSON document nor JSONL (no line is JSON)")
    return rows, refused


def _image_key(row: dict[str, Any]) -> str | None:
    for name in ("image_name", "image_path", "image", "img", "key", "id"):
        value = row.get(name)
        if isinstance(value, str) and value:
            return value
    return None


# ------------------------------------------------------------------------------------------- DeCapBench


@dataclass(frozen=True)
class DeCapBenchItem:
    """One DeCapBench image: its key (the annotation's image name), reference and oracle facts."""

    key: str
    oracle_caption: str
    oracle_facts: tuple[str, ...]


def read_decapbench(path: Path) -> BenchmarkRows:
    """The annotation file (JSONL of ``image_name``, ``oracle_caption``, ``oracle_facts``), as published.

    Texts are kept exactly (no stripping; a blank fact is a fact). Refused rows: not an object, no image
    name, an ``oracle_caption`` that is not a string, ``oracle_facts`` that is not a non-empty list of
    strings (with no oracle fact, DCScore's recall is undefined). An image listed twice: the official
    scorer keeps the last row (it builds ``{image_name: row}``), so the earlier one is refused."""
    rows, refused = _rows(path)
    items: dict[str, DeCapBenchItem] = {}
    where_of: dict[str, str] = {}
    for where, row in rows:
        if not isinstance(row, dict):
            refused.append(RefusedRow(where, "expected a JSON object"))
            continue
        key = _image_key(row)
        caption = row.get("oracle_caption")
        facts = row.get("oracle_facts")
        if key is None:
            refused.append(RefusedRow(where, "no image name (image_name or image_path)"))
        elif not isinstance(caption, str):
            refused.append(RefusedRow(where, f"{key}: 'oracle_caption' must be a string"))
        elif not isinstance(facts, list) or not facts:
            refused.append(RefusedRow(where, f"{key}: 'oracle_facts' must be a non-empty list"))
        elif not all(isinstance(f, str) for f in facts):
            bad = next(i for i, f in enumerate(facts) if not isinstance(f, str))
            refused.append(RefusedRow(where, f"{key}: oracle fact {bad} is not a string"))
        else:
            if key in items:
                refused.append(
                    RefusedRow(
                        where_of[key], f"{key}: superseded by {where} (the official scorer keeps the last)"
                    )
                )
                del items[key]  # re-inserted below, in the position of the row that counts
            items[key] = DeCapBenchItem(key, caption, tuple(facts))
            where_of[key] = where
    return BenchmarkRows(items.values(), refused)


# ------------------------------------------------------------------------------------------- CaptionQA


@dataclass(frozen=True)
class Question:
    question: str
    choices: tuple[str, ...]
    answer: Any  # the right choice's text (anything else: the question cannot be scored)
    category: str


@dataclass(frozen=True)
class CaptionQAEntry:
    """One CaptionQA entry: its id, questions in file order, and its images (one or several views of
    one scene; each encoded bytes, or a path as the file gives it)."""

    id: str
    questions: tuple[Question, ...]
    images: tuple[bytes | str, ...] = ()
    domain: str | None = None

    @property
    def image(self) -> bytes | str | None:
        """The first image (None when the file embeds none)."""
        return self.images[0] if self.images else None


def _category(value: Any) -> str:
    if isinstance(value, list | tuple):
        value = value[0] if value else ""
    return "" if value is None else str(value)


def _question(q: dict[str, Any]) -> Question:
    choices = q.get("choices") or []
    choices = [c.get("text") if isinstance(c, dict) else c for c in choices]
    return Question(
        question=str(q.get("question", "")),
        choices=tuple(str(c) for c in choices),
        answer=q.get("answer"),
        category=_category(q.get("category")),
    )


def _one_image(value: Any) -> bytes | str | None:
    if isinstance(value, dict):
        if value.get("bytes"):
            return bytes(value["bytes"])
        return value.get("path")
    if isinstance(value, bytes | str):
        return value
    return None


def _embedded_images(row: dict[str, Any]) -> tuple[bytes | str, ...]:
    """Every image of a row, in order: ``images`` (a list, as the hub stores them), else ``image``."""
    value = row.get("images")
    values = list(value) if isinstance(value, list | tuple) else ([value] if value is not None else [])
    if not values and row.get("image") is not None:
        values = [row["image"]]
    return tuple(image for image in map(_one_image, values) if image is not None)


def read_captionqa(path: Path) -> BenchmarkRows:
    """The question set: parquet/JSON/JSONL rows with ``id`` and ``questions`` (or the single-question
    row form with ``question``/``choices``/``answer``), or the legacy ``{key: [questions]}`` JSON.
    Refused rows: not an object, no ``id`` (the official ``qa.py`` skips those too), ``questions``
    not a list."""
    path = Path(path)
    refused: list[RefusedRow] = []
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path).to_pylist()
        except Exception as error:  # pyarrow raises several types for a bad file
            raise InputError(f"{path}: not a readable parquet file ({error})") from None
        rows: list[tuple[str, Any]] = [(f"{path}: row {n}", row) for n, row in enumerate(table, 1)]
    else:
        rows, refused = _rows(path)
        if len(rows) == 1 and isinstance(rows[0][1], dict) and "id" not in rows[0][1]:
            data = rows[0][1]
            if all(isinstance(v, list) for v in data.values()):  # the legacy {key: [question, ...]} form
                rows = [(f"{path}: {k!r}", {"id": k, "questions": v}) for k, v in data.items()]
    entries = []
    for where, row in rows:
        if not isinstance(row, dict):
            refused.append(RefusedRow(where, "expected a JSON object"))
            continue
        if row.get("id") is None:
            refused.append(RefusedRow(where, "no 'id'"))
            continue
        questions = row.get("questions") or []
        if not questions and "question" in row:
            questions = [{k: row.get(k) for k in ("question", "choices", "answer", "category")}]
        if not isinstance(questions, list):
            refused.append(RefusedRow(where, f"{row['id']}: 'questions' must be a list"))
            continue
        entries.append(
            CaptionQAEntry(
                id=str(row["id"]),
                questions=tuple(_question(q) for q in questions if isinstance(q, dict)),
                images=_embedded_images(row),
                domain=row.get("domain"),
            )
        )
    return BenchmarkRows(entries, refused)


# ------------------------------------------------------------------------------------------- CapArena


@dataclass(frozen=True)
class CapArenaItem:
    """One CapArena-Auto image: the baseline it is compared with, that baseline's caption, and the
    human reference shown to the judge."""

    image: str
    ref_model: str
    baseline_caption: str
    human: str


def read_caparena(path: Path) -> BenchmarkRows:
    """``caparena_auto_600.json``: ``{image: {"ref_model": ..., "captions": {..., "human": ...}}}``.
    Refused entries: no ``captions`` mapping, a ``ref_model`` that names none of its captions, no
    ``human`` reference."""
    data = read_json_or_jsonl(path)
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected one JSON object keyed by image file name")
    items, refused = [], []
    for image, entry in data.items():
        where = f"{path}: {image!r}"
        if not isinstance(entry, dict) or not isinstance(entry.get("captions"), dict):
            refused.append(RefusedRow(where, "expected {'ref_model': ..., 'captions': {...}}"))
            continue
        ref_model = entry.get("ref_model")
        captions = entry["captions"]
        if not isinstance(ref_model, str) or not isinstance(captions.get(ref_model), str):
            refused.append(RefusedRow(where, "'ref_model' must name one of its captions"))
        elif not isinstance(captions.get("human"), str):
            refused.append(RefusedRow(where, "no 'human' reference caption"))
        else:
            items.append(CapArenaItem(image, ref_model, captions[ref_model], captions["human"]))
    return BenchmarkRows(items, refused)


# ------------------------------------------------------------------------------------------- captions


@dataclass
class CaptionSet:
    """Captions of one model for one benchmark: key -> caption, and where they came from."""

    benchmark: str | None  # None: not said (a plain {key: caption} file)
    captions: dict[str, str] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)
    model: str | None = None

    def lookup(self, key: str) -> str | None:
        """The caption of ``key``, matching a path by its file name when the full path differs."""
        if key in self.captions:
            return self.captions[key]
        name = PurePosixPath(key.replace("\\", "/")).name
        by_name = self._by_name()
        return by_name.get(name)

    def _by_name(self) -> dict[str, str]:
        names: dict[str, str] = {}
        for k, v in self.captions.items():
            names.setdefault(PurePosixPath(k.replace("\\", "/")).name, v)
        return names


def _add(sets: dict[str | None, CaptionSet], benchmark: str | None, key: str, caption: str, source: str,
         model: str | None = None) -> None:  # fmt: skip
    target = sets.setdefault(benchmark, CaptionSet(benchmark))
    if key in target.captions and target.captions[key] != caption:
        raise InputError(f"{source}: two different captions for {key!r} ({benchmark or 'unnamed'})")
    target.captions[key] = caption
    if source not in target.sources:
        target.sources.append(source)
    if model and not target.model:
        target.model = model


def read_caption_sets(specs: Iterable[str | Path]) -> dict[str | None, CaptionSet]:
    """Caption files -> one :class:`CaptionSet` per benchmark.

    Each spec is a path, or ``BENCHMARK=PATH`` to say which benchmark a file's captions are for.
    Accepted: our JSONL (``key``, ``caption``, ``benchmark``), DeCapBench JSONL (``image_path`` or
    ``image_name``, ``caption``), ``{key: caption}`` JSON, and ``score``'s ``{"image", "caption"}``
    JSONL. Captions without a benchmark go to the ``None`` set, which every protocol may use.
    """
    sets: dict[str | None, CaptionSet] = {}
    for spec in specs:
        text = str(spec)
        benchmark, _, rest = text.partition("=")
        if rest and benchmark in BENCHMARKS:
            forced: str | None = benchmark
            path = Path(rest)
        else:
            forced, path = None, Path(text)
        data = read_json_or_jsonl(path)
        source = str(path)
        if isinstance(data, dict) and all(isinstance(v, str) for v in data.values()):
            for key, caption in data.items():
                _add(sets, forced, key, caption, source)
            continue
        if isinstance(data, dict):
            data = [data]
        if not isinstance(data, list):
            raise InputError(f"{path}: expected {{key: caption}} JSON or JSONL caption rows")
        for number, row in enumerate(data, 1):
            if not isinstance(row, dict) or not isinstance(row.get("caption"), str):
                raise InputError(f"{path}: row {number}: expected an object with a string 'caption'")
            key = row.get("key") if isinstance(row.get("key"), str) else _image_key(row)
            if key is None:
                raise InputError(f"{path}: row {number}: no key (key, image_name, image_path or image)")
            benchmark_of_row = forced or row.get("benchmark")
            if benchmark_of_row is None and ("image_path" in row or "image_name" in row):
                benchmark_of_row = "decapbench"  # DeCapBench's own caption format
            _add(sets, benchmark_of_row, key, row["caption"], source, row.get("model"))
    return sets
