"""`balcaprl score`: b-CapScore and its three components for a caption file (evaluation rubric).

Inputs: an image folder, a caption file and a reference file, each either JSONL
(``{"image": ..., "caption": ...}`` per line; references may say ``"reference"`` instead of
``"caption"``) or one JSON object ``{image: caption}`` (the CapArena/CaptionQA convention), in
UTF-8 (other bytes are an error naming the byte offset, never replaced). Image names are paths
relative to the image folder and may not leave it; an absolute path, or one relative to the working
folder, that names a file in the image folder is taken relative to it (:func:`image_key`: how
``balcaprl caption`` writes them, so its output is scored as it is).

Outputs: ``scores.jsonl`` (one line per caption, in input order), ``summary.json`` (means with
95% bootstrap intervals, failure and empty-caption counts, judge accounting) and ``verdicts.jsonl``
(each caption's reference and verdict, for ``balcaprl inspect``). The rows stream to
``.score/*.part`` as spans of captions finish, in input order, and take their final names at the end
(a rename), so memory holds the verdicts of a few spans, never the run's.

Nothing paid for is lost: the output folder is checked for writability before the first call,
and every caption the judge scored is appended at once to ``OUT/.score/record.jsonl``, keyed by
everything that decides its verdict (image file, caption, reference, the judge's endpoint, model and
settings, rubric version). A re-run into the same folder takes those rows from the record and judges only
the rest, with or without the judge cache (``--no-cache``); failures are not recorded, so a re-run
retries them. The record is kept after a run, so the final files of a resumed run are byte for byte
those of an uninterrupted one (``summary.json``'s ``accounting`` describes the run that wrote it).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic_core import PydanticSerializationError

from balcaprl.errors import InputError, OutputError
from balcaprl.evaluate.results import RowsFile, in_spans
from balcaprl.evaluate.summary import ScoreTally
from balcaprl.files import JsonlLog, atomic_write_text, jsonl_values, read_utf8_text, usable_unicode
from balcaprl.judge.accounting import JudgeStats
from balcaprl.judge.cache import endpoint_identity
from balcaprl.judge.client import OpenAICompatibleJudge
from balcaprl.judge.prompt import clean_caption
from balcaprl.judge.protocol import JudgeFailure, JudgeOutcome, JudgeRequest
from balcaprl.judge.throughput import announce, span_rows
from balcaprl.outputs import ensure_writable_dir
from balcaprl.rewards import BCAPSCORE_REWARDS, Verdict, failed_rollout, score_rollout

SCORES_FILE = "scores.jsonl"
SUMMARY_FILE = "summary.json"
VERDICTS_FILE = "verdicts.jsonl"
PART_DIR = ".score"  # the run's own files: its record, and the rows written so far
RECORD_FILE = f"{PART_DIR}/record.jsonl"
_WORD = re.compile(r"\w")


def _json(value: Any) -> str:
    """``value``'s JSON text as every JSONL file here writes it (``json.dumps``, UTF-8 as it is)."""
    return json.dumps(value, ensure_ascii=False)


def _compact(value: Any) -> str:
    """``value``'s JSON text with no spaces: how pydantic spells a model (:func:`verdict_json`)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def verdict_json(verdict: Verdict) -> str:
    """``verdict``'s JSON text, made by pydantic's own serialiser (a third of the cost of dumping and
    encoding it in Python), spelt as :func:`_compact` spells the same object (a test holds the two
    equal), so a resumed row's verdict, read back from the record, is written byte for byte the same.
    A text pydantic cannot encode (a lone surrogate, sent by a judge as a JSON escape) takes
    ``json.dumps``."""
    try:
        return verdict.model_dump_json()
    except PydanticSerializationError:
        return _compact(verdict.model_dump(mode="json"))


def score_results(folder: Path) -> list[str]:
    """What in ``folder`` is the results of a ``score`` run (finished or not)."""
    names = (SCORES_FILE, SUMMARY_FILE, VERDICTS_FILE, RECORD_FILE)
    return [name for name in names if (Path(folder) / name).exists()]


def read_caption_file(path: Path, keys: tuple[str, ...] = ("caption",)) -> list[tuple[str, str]]:
    """``[(image, text), ...]`` in file order. ``keys``: the accepted names of the text field."""
    raw = read_utf8_text(path)  # InputError naming the file (and the byte offset of non-UTF-8)
    stripped = raw.lstrip()
    if stripped.startswith("{"):
        try:
            whole = json.loads(raw)
        except json.JSONDecodeError:
            whole = None  # JSONL whose first line is an object: fall through
        if isinstance(whole, dict) and not ({"image"} & set(whole)):
            bad = [k for k, v in whole.items() if not isinstance(v, str)]
            if bad:
                raise InputError(f"{path}: values must be strings; not for {bad[:3]}")
            return list(whole.items())
    rows: list[tuple[str, str]] = []
    for number, item in jsonl_values(raw, str(path)):
        if not isinstance(item, dict) or not isinstance(item.get("image"), str):
            raise InputError(f"{path}:{number}: expected an object with a string 'image'")
        text = next((item[k] for k in keys if k in item), None)
        if not isinstance(text, str):
            raise InputError(f"{path}:{number}: expected a string field {' or '.join(repr(k) for k in keys)}")
        rows.append((item["image"], text))
    return rows


def _row(image: str, outcome: JudgeOutcome) -> dict[str, Any]:
    """A caption's line of ``scores.jsonl``: its rollout record under the metric's rule (never a
    training recipe's), in the file's columns (null scores, the reason and its detail for a failure)."""
    if isinstance(outcome, JudgeFailure):
        record = failed_rollout(outcome.reason, outcome.detail, BCAPSCORE_REWARDS)
        return {"image": image, "precision": None, "recall": None, "linguistic": None, "b_capscore": None,
                "failure": record.failure, "detail": record.failure_detail}  # fmt: skip
    record = score_rollout(outcome.verdict, BCAPSCORE_REWARDS, truncated_input=outcome.truncated_input)
    return {"image": image, "precision": record.precision, "recall": record.recall,
            "linguistic": record.linguistic, "b_capscore": record.b_capscore, "failure": None,
            "truncated_input": record.truncated_input}  # fmt: skip


@dataclass(frozen=True)
class ScoreRun:
    summary: dict[str, Any]
    scores_path: Path
    summary_path: Path
    resumed: int = 0  # rows taken from the record of an earlier run into the same folder


def _row_keys(
    judge: OpenAICompatibleJudge, rows: list[tuple[str, str]], by_image: dict[str, str]
) -> list[str]:
    """Each row's record key: everything that decides its verdict (the image file as it is now, the
    texts, the judge), the judge's part built once."""
    root = judge.images.root  # the file as the judge will find it (one that escapes the root fails)
    cfg = judge.config
    judge_part = {
        "endpoint": endpoint_identity(cfg.base_url), "model": cfg.model,
        "temperature": cfg.temperature, "max_tokens": cfg.max_tokens, "rubric_options": cfg.rubric.model_dump(),
        "reference_mode": cfg.reference_mode, "max_image_side": cfg.max_image_side,
        "caption_char_cap": cfg.caption_char_cap, "rubric_version": judge.rubric_version("evaluation"),
    }  # fmt: skip
    keys = []
    for image, caption in rows:
        try:
            stat = os.stat(image if root is None else os.path.join(root, image))
            file = [stat.st_size, stat.st_mtime_ns]
        except OSError:
            file = None  # such a row fails as bad_input and is never recorded
        identity = {"image": image, "file": file, "caption": caption, "reference": by_image.get(image, ""),
                    **judge_part}  # fmt: skip
        canonical = json.dumps(identity, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
        keys.append(hashlib.sha256(canonical.encode("utf-8")).hexdigest())
    return keys


def image_key(image: str, root: Path | None) -> str:
    """``image`` as a path relative to the image root, so that a caption and its reference meet under
    one key however each file names the image: as given when the root holds it; an absolute path, or
    one relative to the working folder (as ``balcaprl caption`` writes them), that lies under the
    root, relative to the root; anything else as given (it fails as ``bad_input``, named)."""
    if root is None or (not os.path.isabs(image) and os.path.isfile(os.path.join(root, image))):
        return image  # the common case, in a stat (Path's own parsing cost more than the stat)
    try:
        return Path(image).resolve().relative_to(root).as_posix()
    except (ValueError, OSError):  # outside the root, or not a path at all
        return image


def score_captions(
    judge: OpenAICompatibleJudge,
    captions: Path,
    references: Path,
    out: Path,
    *,
    resamples: int = 1000,
    seed: int = 0,
    on_start: Callable[[int, int], None] | None = None,
    on_outcome: Callable[[int, JudgeOutcome], None] | None = None,
) -> ScoreRun:
    """Judge every caption against its image's reference with the evaluation rubric; write the files.

    A caption whose image has no reference is a ``bad_input`` row, not an error for the whole run.
    Rows already in ``out``'s record are not judged again (module docstring). ``on_start(total,
    resumed)`` is called before the first call; ``on_outcome(i, outcome)`` as each caption is judged.
    Raises :class:`~balcaprl.errors.OutputError` before any call when ``out`` cannot be written.

    Rows stream to disk: the captions are judged in spans of twice the judge's calls in flight (``span_rows``), at most two
    at a time (:func:`~balcaprl.evaluate.results.in_spans`), and a span's rows and verdicts are written,
    in input order, as soon as it and the spans before it are done.
    """
    caption_rows, unusable = usable_unicode(read_caption_file(captions, keys=("caption",)), "caption")
    reference_rows, bad_references = usable_unicode(
        read_caption_file(references, keys=("reference", "caption")), "reference"
    )
    root = judge.images.root  # captions and references meet under the image's path in it
    caption_rows = [(image_key(image, root), caption) for image, caption in caption_rows]
    reference_rows = [(image_key(image, root), reference) for image, reference in reference_rows]
    for j, reason in bad_references.items():  # a reference that cannot be sent fails its captions' rows
        unusable.update(
            {i: reason for i, (image, _) in enumerate(caption_rows) if image == reference_rows[j][0]}
        )
    by_image: dict[str, str] = {}
    for image, text in reference_rows:
        if image in by_image and by_image[image] != text:
            raise InputError(f"{references}: image {image!r} has two different references")
        by_image[image] = text
    del reference_rows
    out = ensure_writable_dir(out, "--out")
    scores_path, summary_path = out / SCORES_FILE, out / SUMMARY_FILE
    for target in (scores_path, summary_path):
        if target.is_dir():
            raise OutputError(f"--out {out}: {target.name} is a folder; remove it or choose another --out")
    keys = _row_keys(judge, caption_rows, by_image)
    span = span_rows(judge.config)
    with (
        JsonlLog(out / RECORD_FILE, sync_every=1 << 62) as record,  # fsynced once a second (below)
        RowsFile(scores_path, out / PART_DIR) as scores,
        RowsFile(out / VERDICTS_FILE, out / PART_DIR) as verdict_lines,
    ):
        wanted = set(keys)
        known = {
            r["key"]: at
            for at, r in record.scan()
            if r.get("key") in wanted and isinstance(r.get("row"), dict)
        }
        del wanted
        refused = {i: JudgeFailure("bad_input", reason) for i, reason in unusable.items()}
        resumed = sum(key in known for i, key in enumerate(keys) if i not in refused)
        record.append({"run": "started", "captions": len(keys), "resumed": resumed})  # proves it is writable
        if on_start is not None:
            on_start(len(keys), resumed)
        announce(judge.config, len(keys) - resumed - len(refused))
        for i, failure in refused.items():
            if on_outcome is not None:
                on_outcome(i, failure)
        synced = time.monotonic()

        async def judge_span(part: range) -> dict[int, tuple[dict[str, Any], str]]:
            """Rows and verdicts (JSON text) of the span's captions that the record does not hold."""
            done: dict[int, tuple[dict[str, Any], str]] = {}
            todo = [i for i in part if keys[i] not in known and i not in refused]

            def finished(j: int, outcome: JudgeOutcome) -> None:
                i = todo[j]
                image = caption_rows[i][0]
                if isinstance(outcome, JudgeFailure) and image not in by_image:
                    outcome = JudgeFailure(
                        "bad_input", f"no reference for image {image!r} in {references.name}"
                    )
                row = _row(image, outcome)
                verdict = "null"
                if row["failure"] is None:  # failures are retried by the next run, so never recorded
                    verdict = verdict_json(outcome.verdict)  # once, for two files
                    record.append(f'{{"key": {_json(keys[i])}, "row": {_json(row)}, "verdict": {verdict}}}')
                done[i] = (row, verdict)
                if on_outcome is not None:
                    on_outcome(i, outcome)

            requests = [
                JudgeRequest(image=caption_rows[i][0], caption=caption_rows[i][1],
                             reference=by_image.get(caption_rows[i][0], ""), rubric="evaluation")
                for i in todo
            ]  # fmt: skip
            if requests:
                stats.merge((await judge.judge_batch_with_stats(requests, on_outcome=finished)).stats)
            return done

        def write(part: range, done: dict[int, tuple[dict[str, Any], str]]) -> None:
            nonlocal synced
            for i in part:
                if i in done:
                    row, verdict = done[i]
                elif i in refused:  # never sent to the judge
                    row, verdict = _row(caption_rows[i][0], refused[i]), "null"
                else:
                    recorded = record.at(known[keys[i]])
                    row, verdict = recorded["row"], _compact(recorded.get("verdict"))
                image, caption = caption_rows[i]
                scores.write(row)
                tally.add(row)
                # each row's caption, reference and verdict (null where the judge failed), in the same
                # order, so `balcaprl inspect` can show the assertions behind the scores (the text
                # json.dumps would make of the object, the verdict's part made once)
                verdict_lines.write(f'{{"image": {_json(image)}, "caption": {_json(caption)}, '
                                    f'"reference": {_json(by_image.get(image))}, "verdict": {verdict}}}')  # fmt: skip
            if time.monotonic() - synced > 1.0:  # a power cut loses at most a second of paid answers
                record.sync()
                synced = time.monotonic()

        async def judge_all() -> None:
            try:
                await in_spans(len(keys), span, judge_span, write)
            finally:
                await judge.aclose()

        stats = JudgeStats()
        tally = ScoreTally()  # the summary's numbers, taken as the rows are written
        asyncio.run(judge_all())
        scores.commit()
        verdict_lines.commit()
    cap = judge.config.caption_char_cap
    # a word character survives cleaning: only the rest need it to tell
    empty = sum(
        not _WORD.search(caption) and not clean_caption(caption, cap).text for _, caption in caption_rows
    )
    summary = tally.summary(resamples, seed, n_empty=empty)
    summary["judge"] = {
        "model": judge.config.model,
        "rubric_version": judge.rubric_version("evaluation"),
        "reference_mode": judge.config.reference_mode,
    }
    summary["accounting"] = {
        **stats.as_dict(judge.config.price_per_million_tokens),
        "resumed_from_record": resumed,
    }
    summary["image_root"] = None if judge.images.root is None else str(judge.images.root)
    atomic_write_text(summary_path, json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    return ScoreRun(summary, scores_path, summary_path, resumed=resumed)
