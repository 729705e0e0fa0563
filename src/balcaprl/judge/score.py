"""`balcaprl score`: b-CapScore and its three components for a caption file (evaluation rubric).

Inputs: an image folder, a caption file and a reference file, each either JSONL
(``{"image": ..., "caption": ...}`` per line; references may say ``"reference"`` instead of
``"caption"``) or one JSON object ``{image: caption}`` (the CapArena/CaptionQA convention), in
UTF-8 (other bytes are an error naming the byte offset, never replaced). Image names are paths
relative to the image folder and may not leave it.

Outputs: ``scores.jsonl`` (one line per caption, in input order), ``summary.json`` (means with
95% bootstrap intervals, failure and empty-caption counts, judge accounting) and ``verdicts.jsonl``
(each caption's reference and verdict, for ``balcaprl inspect``), written atomically at the end
(temp file, then rename).

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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from balcaprl.errors import InputError, OutputError
from balcaprl.files import JsonlLog, atomic_write_text, invalid_unicode, jsonl_lines, read_utf8_text
from balcaprl.judge.cache import endpoint_identity
from balcaprl.judge.client import OpenAICompatibleJudge
from balcaprl.judge.images import ImageError
from balcaprl.judge.prompt import clean_caption
from balcaprl.judge.protocol import JudgeFailure, JudgeOutcome, JudgeRequest
from balcaprl.judge.summary import summarise_scores
from balcaprl.outputs import ensure_writable_dir
from balcaprl.rewards import BCAPSCORE_REWARDS, b_capscore, score_rollout

__all__ = [
    "RECORD_FILE",
    "SCORES_FILE",
    "SUMMARY_FILE",
    "VERDICTS_FILE",
    "CaptionFileError",
    "ScoreRun",
    "read_caption_file",
    "score_captions",
    "score_results",
]

SCORES_FILE = "scores.jsonl"
SUMMARY_FILE = "summary.json"
VERDICTS_FILE = "verdicts.jsonl"
RECORD_FILE = ".score/record.jsonl"


def score_results(folder: Path) -> list[str]:
    """What in ``folder`` is the results of a ``score`` run (finished or not)."""
    names = (SCORES_FILE, SUMMARY_FILE, VERDICTS_FILE, RECORD_FILE)
    return [name for name in names if (Path(folder) / name).exists()]


class CaptionFileError(InputError):
    """A caption or reference file that cannot be read as JSONL or as a JSON object."""


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
                raise CaptionFileError(f"{path}: values must be strings; not for {bad[:3]}")
            return list(whole.items())
    rows: list[tuple[str, str]] = []
    for number, line in enumerate(jsonl_lines(raw), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as error:
            raise CaptionFileError(f"{path}:{number}: not JSON ({error.msg})") from None
        if not isinstance(item, dict) or not isinstance(item.get("image"), str):
            raise CaptionFileError(f"{path}:{number}: expected an object with a string 'image'")
        text = next((item[k] for k in keys if k in item), None)
        if not isinstance(text, str):
            raise CaptionFileError(
                f"{path}:{number}: expected a string field {' or '.join(repr(k) for k in keys)}"
            )
        rows.append((item["image"], text))
    return rows


def _row(image: str, outcome: JudgeOutcome) -> dict[str, Any]:
    if isinstance(outcome, JudgeFailure):
        return {"image": image, "precision": None, "recall": None, "linguistic": None, "b_capscore": None,
                "failure": outcome.reason, "detail": outcome.detail}  # fmt: skip
    r = score_rollout(outcome.verdict, BCAPSCORE_REWARDS)  # the metric's rule, never a training recipe's
    return {
        "image": image,
        "precision": r.precision,
        "recall": r.recall,
        "linguistic": r.linguistic,
        "b_capscore": float(b_capscore(r.precision, r.recall, r.linguistic)),
        "failure": None,
        "truncated_input": outcome.truncated_input,
    }


@dataclass(frozen=True)
class ScoreRun:
    rows: list[dict[str, Any]]
    summary: dict[str, Any]
    scores_path: Path
    summary_path: Path
    resumed: int = 0  # rows taken from the record of an earlier run into the same folder


def _row_key(judge: OpenAICompatibleJudge, image: str, caption: str, reference: str) -> str:
    """Everything that decides one row's verdict: the image file as it is now, the texts, the judge."""
    try:
        stat = judge.images.resolve(image).stat()
        file = [stat.st_size, stat.st_mtime_ns]
    except (ImageError, OSError):
        file = None  # such a row fails as bad_input and is never recorded
    cfg = judge.config
    identity = {
        "image": image, "file": file, "caption": caption, "reference": reference,
        "endpoint": endpoint_identity(cfg.base_url), "model": cfg.model,
        "temperature": cfg.temperature, "max_tokens": cfg.max_tokens, "rubric_options": cfg.rubric.model_dump(),
        "reference_mode": cfg.reference_mode, "max_image_side": cfg.max_image_side,
        "caption_char_cap": cfg.caption_char_cap, "rubric_version": judge.rubric_version("evaluation"),
    }  # fmt: skip
    canonical = json.dumps(identity, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _usable_unicode(rows: list[tuple[str, str]], what: str) -> tuple[list[tuple[str, str]], dict[int, str]]:
    """``rows`` with every text writable (a lone surrogate shown as its escape), and why each row
    that held one is refused (``bad_input``): it is never sent to the judge."""
    usable, refused = [], {}
    for i, (image, text) in enumerate(rows):
        reason = invalid_unicode(image) or invalid_unicode(text)
        if reason is not None:
            refused[i] = f"the {what} of this row is {reason}"
            image, text = (t.encode("utf-8", "backslashreplace").decode("utf-8") for t in (image, text))
        usable.append((image, text))
    return usable, refused


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
    """
    caption_rows, unusable = _usable_unicode(read_caption_file(captions, keys=("caption",)), "caption")
    reference_rows, bad_references = _usable_unicode(
        read_caption_file(references, keys=("reference", "caption")), "reference"
    )
    for j, reason in bad_references.items():  # a reference that cannot be sent fails its captions' rows
        unusable.update(
            {i: reason for i, (image, _) in enumerate(caption_rows) if image == reference_rows[j][0]}
        )
    by_image: dict[str, str] = {}
    for image, text in reference_rows:
        if image in by_image and by_image[image] != text:
            raise CaptionFileError(f"{references}: image {image!r} has two different references")
        by_image[image] = text
    out = ensure_writable_dir(out, "--out")
    scores_path, summary_path = out / SCORES_FILE, out / SUMMARY_FILE
    for target in (scores_path, summary_path):
        if target.is_dir():
            raise OutputError(f"--out {out}: {target.name} is a folder; remove it or choose another --out")
    keys = [_row_key(judge, image, caption, by_image.get(image, "")) for image, caption in caption_rows]
    rows: list[dict[str, Any] | None] = [None] * len(caption_rows)
    with JsonlLog(out / RECORD_FILE) as record:
        known = {r["key"]: r for r in record.read() if isinstance(r.get("row"), dict) and "key" in r}
        verdicts: list[dict[str, Any] | None] = [None] * len(caption_rows)
        for i, key in enumerate(keys):
            if key in known:
                rows[i], verdicts[i] = known[key]["row"], known[key].get("verdict")
        refused = {i: JudgeFailure("bad_input", reason) for i, reason in unusable.items()}
        for i, failure in refused.items():
            rows[i] = _row(caption_rows[i][0], failure)
        todo = [i for i, row in enumerate(rows) if row is None]
        resumed = len(rows) - len(todo) - len(refused)
        record.append({"run": "started", "captions": len(rows), "resumed": resumed})  # proves it is writable
        if on_start is not None:
            on_start(len(rows), resumed)
        for i, failure in refused.items():
            if on_outcome is not None:
                on_outcome(i, failure)

        def finished(j: int, outcome: JudgeOutcome) -> None:
            i = todo[j]
            image = caption_rows[i][0]
            if isinstance(outcome, JudgeFailure) and image not in by_image:
                outcome = JudgeFailure("bad_input", f"no reference for image {image!r} in {references.name}")
            rows[i] = row = _row(image, outcome)
            if row["failure"] is None:  # failures are retried by the next run, so never recorded
                verdicts[i] = outcome.verdict.model_dump(mode="json")
                record.append({"key": keys[i], "row": row, "verdict": verdicts[i]})
            if on_outcome is not None:
                on_outcome(i, outcome)

        requests = [
            JudgeRequest(image=caption_rows[i][0], caption=caption_rows[i][1],
                         reference=by_image.get(caption_rows[i][0], ""), rubric="evaluation")
            for i in todo
        ]  # fmt: skip
        result = asyncio.run(_judge_all(judge, requests, finished))
    final = [row for row in rows if row is not None]
    empty = sum(not clean_caption(caption, judge.config.caption_char_cap).text for _, caption in caption_rows)
    summary = summarise_scores(final, resamples=resamples, seed=seed, n_empty=empty)
    summary["judge"] = {
        "model": judge.config.model,
        "rubric_version": judge.rubric_version("evaluation"),
        "reference_mode": judge.config.reference_mode,
    }
    summary["accounting"] = {
        **result.stats.as_dict(judge.config.price_per_million_tokens),
        "resumed_from_record": resumed,
    }
    summary["image_root"] = None if judge.images.root is None else str(judge.images.root)
    atomic_write_text(scores_path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in final))
    atomic_write_text(summary_path, json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    # verdicts.jsonl: each row's caption, reference and verdict (null where the judge failed), in the
    # same order, so `balcaprl inspect` can show the assertions behind the scores.
    lines = [
        {"image": image, "caption": caption, "reference": by_image.get(image), "verdict": verdicts[i]}
        for i, (image, caption) in enumerate(caption_rows)
    ]
    atomic_write_text(out / VERDICTS_FILE, "".join(json.dumps(v, ensure_ascii=False) + "\n" for v in lines))
    return ScoreRun(final, summary, scores_path, summary_path, resumed=resumed)


async def _judge_all(judge: OpenAICompatibleJudge, requests: list[JudgeRequest], on_outcome):
    try:
        return await judge.judge_batch_with_stats(requests, on_outcome=on_outcome)
    finally:
        await judge.aclose()
