"""CapArena-Auto (Cheng et al. 2025): pairwise battles against baseline models' captions.

As the official ``caparena_auto_eval.py`` / ``caparena_auto_scores.py`` do it: each of the 600 DOCCI
images has one baseline (GPT-4o-0806, CogVLM2-llama3-chat-19B or MiniCPM-V2.6-8B, 200 images each);
the judge sees the image, the two captions in random order and the human reference caption, and
answers "Caption 1 is better", "Caption 2 is better" or "Tie" (GPT-4o-2024-08-06 at temperature 0.1,
top_p 0.9, in the benchmark). Per baseline, score = (wins - losses) / 2 — on the full benchmark's
200 battles per baseline that spans -100..100 — and the CapArena score is the mean over the
baselines. Length is the mean caption length in words (``len(caption.split(' '))``, as the official
script counts it) over the compared captions. Images whose baseline is the evaluated model itself
are skipped, as in the official script.

Positions are drawn per image from ``random.Random(f"{seed}:{image}")`` (the official script draws
from an unseeded global RNG): reproducible, and independent of the order and subset of images.

A battle whose judge call failed is reported (``failures``) and counts neither as a win, a loss nor a
tie — the official script skips it too; ``normalised`` (100 x (wins - losses) / judged battles, per
baseline, then the mean) is given alongside, since the official formula assumes 200 battles per
baseline and reads small on subsets.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from balcaprl.evaluate.formats import CapArenaItem, CaptionSet
from balcaprl.evaluate.results import ProtocolResult, mean, write_items
from balcaprl.judge.calls import JudgeCaller
from balcaprl.judge.images import ImageError
from balcaprl.judge.prompt import clean_text
from balcaprl.judge.protocol import JudgeFailure
from balcaprl.rewards.rubrics import load_rubric

__all__ = [
    "BASELINES",
    "CapArenaSettings",
    "PairVerdict",
    "arena_scores",
    "caption_words",
    "positions",
    "run_caparena",
]

BASELINES = ("GPT-4o-0806", "CogVLM2-llama3-chat-19B", "MiniCPM-V2.6-8B")
JUDGMENTS = ("Caption 1 is better", "Caption 2 is better", "Tie")


class CapArenaSettings(BaseModel):
    """How CapArena-Auto is run; the defaults are the official protocol's."""

    model_config = ConfigDict(extra="forbid")

    seed: int = Field(0, description="Seed of the position draw.")
    temperature: float | None = Field(0.1, description="Judge temperature (official: 0.1).")
    top_p: float | None = Field(0.9, description="Judge top_p (official: 0.9); null omits it.")
    max_tokens: int = Field(1500, ge=16, description="Most judge tokens (official: 1500).")


class PairVerdict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    reason: str
    judgment: Literal["Caption 1 is better", "Caption 2 is better", "Tie"]


def caption_words(caption: str) -> int:
    """Caption length in words, counted as the official script counts it."""
    return len(caption.split(" "))


def positions(image: str, seed: int = 0) -> bool:
    """True when the evaluated model's caption is shown first (as Caption 1) for this image."""
    return random.Random(f"{seed}:{image}").randint(0, 1) == 1


@dataclass(frozen=True)
class Battle:
    image: str
    baseline: str
    model_first: bool
    judgment: str | None  # None: the call failed


def arena_scores(battles: Sequence[Battle], baselines: Sequence[str] = BASELINES) -> dict[str, Any]:
    """Per baseline: wins, losses, ties, failed, ``score`` = (wins - losses) / 2 and ``normalised`` =
    100 x (wins - losses) / judged; ``score`` / ``normalised`` overall: their means over ``baselines``."""
    per: dict[str, dict[str, Any]] = {
        b: {"wins": 0, "losses": 0, "ties": 0, "failed": 0, "battles": 0} for b in baselines
    }
    for battle in battles:
        row = per.setdefault(battle.baseline, {"wins": 0, "losses": 0, "ties": 0, "failed": 0, "battles": 0})
        row["battles"] += 1
        if battle.judgment is None:
            row["failed"] += 1
        elif battle.judgment == "Tie":
            row["ties"] += 1
        elif (battle.judgment == "Caption 1 is better") == battle.model_first:
            row["wins"] += 1
        else:
            row["losses"] += 1
    for row in per.values():
        judged = row["wins"] + row["losses"] + row["ties"]
        row["score"] = (row["wins"] - row["losses"]) / 2
        row["normalised"] = 100 * (row["wins"] - row["losses"]) / judged if judged else None
    normalised = [row["normalised"] for row in per.values() if row["normalised"] is not None]
    return {
        "score": mean([row["score"] for row in per.values()]),
        "normalised": mean(normalised) if normalised else None,
        "per_baseline": per,
    }


def _messages(image_url: str, first: str, second: str, human: str) -> list[dict[str, Any]]:
    text = (
        f"<caption_1>\n{first}\n</caption_1>\n\n<caption_2>\n{second}\n</caption_2>\n\n"
        f"<reference_caption>\n{human}\n</reference_caption>\n\n"
        "Which caption is better? Answer in the required format; mark a tie only if it is truly hard to decide."
    )
    return [
        {"role": "system", "content": load_rubric("caparena_compare").text},
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": image_url}},
                {"type": "text", "text": text},
            ],
        },
    ]


def run_caparena(
    caller: JudgeCaller,
    items: Sequence[CapArenaItem],
    captions: CaptionSet,
    image_root: Path,
    out_dir: Path,
    settings: CapArenaSettings | None = None,
    model_name: str | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> ProtocolResult:
    """Battle every image that has a caption against its baseline; write ``items.jsonl``; summarise."""
    settings = settings or CapArenaSettings()
    extra = {"top_p": settings.top_p} if settings.top_p is not None else None
    skipped = [i.image for i in items if model_name is not None and i.ref_model == model_name]
    todo = [(i, captions.lookup(i.image)) for i in items if i.image not in skipped]
    missing = [i.image for i, c in todo if c is None]
    todo = [(i, c) for i, c in todo if c is not None]

    async def one(item: CapArenaItem, caption: str) -> tuple[bool, str | None, JudgeFailure | None]:
        first = positions(item.image, settings.seed)
        try:
            image = await asyncio.to_thread(caller.images.load, Path(image_root) / item.image)
        except ImageError as error:
            return first, None, JudgeFailure("bad_input", str(error))
        ours, theirs = clean_text(caption).strip(), clean_text(item.baseline_caption).strip()
        pair = (ours, theirs) if first else (theirs, ours)
        result = await caller.call_json(
            _messages(image.data_url, *pair, clean_text(item.human).strip()), PairVerdict,
            kind="caparena_compare", temperature=settings.temperature, max_tokens=settings.max_tokens,
            extra_body=extra,
        )  # fmt: skip
        if result.failure is not None:
            return first, None, result.failure
        return first, result.value.judgment, None

    async def run_all():
        done = 0

        async def tracked(item, caption):
            nonlocal done
            out = await one(item, caption)
            done += 1
            if on_progress is not None:
                on_progress(done, len(todo))
            return out

        try:
            return await asyncio.gather(*[tracked(i, c) for i, c in todo])
        finally:
            await caller.aclose()

    outcomes = asyncio.run(run_all())
    rows, battles = [], []
    for (item, caption), (first, judgment, failure) in zip(todo, outcomes, strict=True):
        battles.append(Battle(item.image, item.ref_model, first, judgment))
        winner = None
        if judgment is not None:
            winner = (
                "tie"
                if judgment == "Tie"
                else ("model" if (judgment == JUDGMENTS[0]) == first else "baseline")
            )
        rows.append({
            "image": item.image, "baseline": item.ref_model, "model_position": 1 if first else 2,
            "judgment": judgment, "winner": winner, "words": caption_words(caption),
            "failure": None if failure is None else failure.reason,
            **({} if failure is None else {"detail": failure.detail}),
        })  # fmt: skip
    write_items(Path(out_dir) / "items.jsonl", rows)
    baselines = list(dict.fromkeys([*BASELINES, *(i.ref_model for i in items)]))
    scores = arena_scores(battles, baselines) if battles else None
    metrics = {
        "score": None if scores is None else scores["score"],
        "normalised": None if scores is None else scores["normalised"],
        "length_words": mean([r["words"] for r in rows]) if rows else None,
        "per_baseline": None if scores is None else scores["per_baseline"],
        "skipped_own_baseline": skipped,
    }
    failures = dict(Counter(r["failure"] for r in rows if r["failure"] is not None))
    return ProtocolResult(
        protocol="caparena",
        score=metrics["score"],
        metrics=metrics,
        n_items=len(items) - len(skipped),
        n_scored=len([r for r in rows if r["failure"] is None]),
        failures=failures,
        missing=missing,
        settings=settings.model_dump(),
        judge=caller.config.model,
        stats=caller.stats.as_dict(caller.config.price_per_million_tokens),
        notes="score = mean over baselines of (wins - losses) / 2 (-100..100 on the full 600 images); "
        "length_words = mean words per caption",
    )
