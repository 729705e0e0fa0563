"""`balcaprl score`: b-CapScore and its three components for a caption file (evaluation rubric).

Inputs: an image folder, a caption file and a reference file, each either JSONL
(``{"image": ..., "caption": ...}`` per line; references may say ``"reference"`` instead of
``"caption"``) or one JSON object ``{image: caption}`` (the CapArena/CaptionQA convention). Image
names are paths relative to the image folder and may not leave it.

Outputs (both written atomically: temp file, then rename): ``scores.jsonl`` (one line per caption,
in input order) and ``summary.json`` (means with 95% bootstrap intervals, failure counts, judge
accounting). Resumable: every verdict goes to the judge cache as it arrives, so re-running after an
interruption only judges what is missing.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from balcaprl.errors import InputError
from balcaprl.files import atomic_write_text
from balcaprl.judge.client import OpenAICompatibleJudge
from balcaprl.judge.protocol import JudgeFailure, JudgeOutcome, JudgeRequest
from balcaprl.judge.summary import summarise_scores
from balcaprl.rewards import BCAPSCORE_REWARDS, b_capscore, score_rollout

__all__ = ["CaptionFileError", "ScoreRun", "read_caption_file", "score_captions"]


class CaptionFileError(InputError):
    """A caption or reference file that cannot be read as JSONL or as a JSON object."""


def read_caption_file(path: Path, keys: tuple[str, ...] = ("caption",)) -> list[tuple[str, str]]:
    """``[(image, text), ...]`` in file order. ``keys``: the accepted names of the text field."""
    try:
        raw = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError as error:
        raise CaptionFileError(f"{path}: cannot read it ({error.strerror})") from None
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
    for number, line in enumerate(raw.splitlines(), 1):
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


def score_captions(
    judge: OpenAICompatibleJudge,
    captions: Path,
    references: Path,
    out: Path,
    *,
    resamples: int = 1000,
    seed: int = 0,
    on_start: Callable[[int], None] | None = None,
    on_outcome: Callable[[int, JudgeOutcome], None] | None = None,
) -> ScoreRun:
    """Judge every caption against its image's reference with the evaluation rubric; write the files.

    A caption whose image has no reference is a ``bad_input`` row, not an error for the whole run.
    """
    caption_rows = read_caption_file(captions, keys=("caption",))
    reference_rows = read_caption_file(references, keys=("reference", "caption"))
    by_image: dict[str, str] = {}
    for image, text in reference_rows:
        if image in by_image and by_image[image] != text:
            raise CaptionFileError(f"{references}: image {image!r} has two different references")
        by_image[image] = text
    requests = [
        JudgeRequest(image=image, caption=caption, reference=by_image.get(image, ""), rubric="evaluation")
        for image, caption in caption_rows
    ]
    if on_start is not None:
        on_start(len(requests))
    result = asyncio.run(_judge_all(judge, requests, on_outcome))
    rows = []
    for (image, _), outcome in zip(caption_rows, result.outcomes, strict=True):
        if isinstance(outcome, JudgeFailure) and image not in by_image:
            outcome = JudgeFailure("bad_input", f"no reference for image {image!r} in {references.name}")
        rows.append(_row(image, outcome))
    summary = summarise_scores(rows, resamples=resamples, seed=seed)
    summary["judge"] = {
        "model": judge.config.model,
        "rubric_version": judge.rubric_version("evaluation"),
        "reference_mode": judge.config.reference_mode,
    }
    summary["accounting"] = result.stats.as_dict(judge.config.price_per_million_tokens)
    summary["image_root"] = None if judge.images.root is None else str(judge.images.root)
    out = Path(out)
    scores_path, summary_path = out / "scores.jsonl", out / "summary.json"
    atomic_write_text(scores_path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    atomic_write_text(summary_path, json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    # Also verdicts.jsonl: each row's caption, reference and verdict (null where the judge failed), in
    # the same order, so `balcaprl inspect` can show the assertions behind the scores.
    verdicts = [
        {"image": image, "caption": caption, "reference": by_image.get(image),
         "verdict": None if isinstance(outcome, JudgeFailure) else outcome.verdict.model_dump(mode="json")}
        for (image, caption), outcome in zip(caption_rows, result.outcomes, strict=True)
    ]  # fmt: skip
    atomic_write_text(
        out / "verdicts.jsonl", "".join(json.dumps(v, ensure_ascii=False) + "\n" for v in verdicts)
    )
    return ScoreRun(rows, summary, scores_path, summary_path)


async def _judge_all(judge: OpenAICompatibleJudge, requests: list[JudgeRequest], on_outcome):
    try:
        return await judge.judge_batch_with_stats(requests, on_outcome=on_outcome)
    finally:
        await judge.aclose()
