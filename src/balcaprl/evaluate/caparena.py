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

**Prompts.** By default our own wording (rubric ``caparena_compare``, a strict JSON answer). With
``official.caparena`` set, the official system message and pairwise template read from the user's
checkout (:func:`~balcaprl.evaluate.official.load_caparena_prompts`), sent as the official script
sends them (the system message as a list of one text part; the image, then the filled template with
the three captions as they are; ``max_tokens``), answered in free text and read as
the script reads it: a ``Reason: ... Judgment:`` part and the rest of the ``Judgment:`` line are both
needed, else the battle is sampled again (up to ``max_attempts``, official 5); a judgment other than
the six forms the official scorer accepts ("Caption 1 is better", "Caption 2 is better", "Tie", each
with or without a final period) counts neither way (``unrecognised``, as the scorer skips it). A call
that fails (an HTTP error, a dropped connection) is one of those tries too, as in the official script,
where it answers "" (``http_errors: try``, sent once, no client retry); ``http_errors: retry``, ours,
retries it in the client and leaves the tries to answers. The image is the file's own bytes at its
own size with ``detail: "high"``, labelled ``image/png`` whatever its type, as the official script
labels every image (``image_mode: official``; ``auto`` follows the prompts).
With our prompts, every caption is cleaned and an escaped data block, so one caption cannot close its
block and speak about the other; with the official ones, only when the ``guard`` option is on.
"""

from __future__ import annotations

import asyncio
import base64
import random
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from balcaprl.evaluate.formats import CapArenaItem, CaptionSet, read_caparena
from balcaprl.evaluate.official import (
    CAPARENA_BODY,
    OFFICIAL_IMAGE_SIDE,
    CapArenaPrompts,
    load_caparena_prompts,
    official_text,
    paraphrase_source,
    unicode_failure,
)
from balcaprl.evaluate.protocols import OfficialPromptSection, Protocol
from balcaprl.evaluate.results import ProtocolResult, judge_in_spans, mean, read_items
from balcaprl.judge.calls import JudgeCaller, backoff_s
from balcaprl.judge.images import ImageError, ImageLoader
from balcaprl.judge.prompt import clean_text, data_block
from balcaprl.judge.protocol import JudgeFailure
from balcaprl.judge.rubrics import load_rubric
from balcaprl.judge.throughput import span_rows

BASELINES = ("GPT-4o-0806", "CogVLM2-llama3-chat-19B", "MiniCPM-V2.6-8B")
JUDGMENTS = ("Caption 1 is better", "Caption 2 is better", "Tie")
_REASON = re.compile(r"Reason:\s*(.+?)\s*Judgment:", re.DOTALL)
_JUDGMENT = re.compile(r"Judgment:\s*(.+)")


class CapArenaSection(OfficialPromptSection):
    """CapArena-Auto's files and options; the defaults are the official protocol's."""

    INPUTS = {
        "annotations": ("caparena_auto_600.json", "--caparena"),
        "images": ("the CapArena image folder", "--caparena-images"),
    }
    annotations: Path | None = Field(None, description="caparena_auto_600.json.")
    images: Path | None = Field(None, description="CapArena-Auto (DOCCI) image folder.")
    seed: int = Field(0, description="Seed of the position draw.")
    temperature: float | None = Field(0.1, description="Judge temperature (official: 0.1).")
    top_p: float | None = Field(0.9, description="Judge top_p (official: 0.9); null omits it.")
    max_tokens: int = Field(1500, ge=16, description="Most judge tokens (official: 1500).")
    max_attempts: int = Field(
        5,
        ge=1,
        description="Samples drawn for an answer without a Reason/Judgment (official prompts; official: 5).",
    )
    image_mode: Literal["auto", "official", "judge"] = Field(
        "auto",
        description="Images: 'official' (the file's own bytes, labelled image/png whatever their type, "
        "detail high, as the official script sends them), 'judge' (the judge config's max_image_side, its "
        "real type, no detail), 'auto' (official with official prompts).",
    )
    http_errors: Literal["try", "retry"] = Field(
        "try",
        description="A failed call with the official prompts: 'try' (official: it is one of the "
        "max_attempts tries, sent once, never retried by the client) or 'retry' (ours: the client "
        "retries it per the judge config's max_retries, then the battle is a failure, asked again by a "
        "re-run; the tries count only answers).",
    )


# The official protocol's options (the position seed is not one: the official draw is unseeded).
OFFICIAL_OPTIONS: dict[str, tuple[Any, ...]] = {
    "temperature": (0.1,), "top_p": (0.9,), "max_tokens": (1500,), "max_attempts": (5,),
    "images_sent": ("official",), "guard": (False,), "http_errors": ("try",),
}  # fmt: skip


class PairVerdict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    reason: str
    judgment: Literal["Caption 1 is better", "Caption 2 is better", "Tie"]


def official_image_url(data: bytes) -> str:
    """An image file's bytes as the official script sends them: base64, labelled ``image/png`` whatever
    their type (a JPEG file goes as a JPEG labelled PNG)."""
    return f"data:image/png;base64,{base64.b64encode(data).decode('utf-8')}"


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
    judgment: str | None  # one of JUDGMENTS, "unrecognised", or None: the call failed


def arena_scores(battles: Sequence[Battle], baselines: Sequence[str] = BASELINES) -> dict[str, Any]:
    """Per baseline: wins, losses, ties, failed, unrecognised (both count neither way, as the official
    scorer skips them), ``score`` = (wins - losses) / 2 and ``normalised`` =
    100 x (wins - losses) / judged; ``score`` / ``normalised`` overall: their means over ``baselines``."""
    per: dict[str, dict[str, Any]] = {
        b: dict.fromkeys(("wins", "losses", "ties", "failed", "unrecognised", "battles"), 0)
        for b in baselines
    }
    for battle in battles:
        row = per.setdefault(
            battle.baseline, dict.fromkeys(("wins", "losses", "ties", "failed", "unrecognised", "battles"), 0)
        )
        row["battles"] += 1
        if battle.judgment is None:
            row["failed"] += 1
        elif battle.judgment not in JUDGMENTS:
            row["unrecognised"] += 1
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


def read_official_judgment(answer: str) -> str | None:
    """The judgment of a free-text answer as the official script reads it, normalised to one of
    :data:`JUDGMENTS`; ``"unrecognised"`` for a judgment outside the six accepted forms; ``ValueError``
    when the answer lacks the ``Reason: ... Judgment:`` part or the judgment (another sample is due)."""
    reason, judgment = _REASON.search(answer), _JUDGMENT.search(answer)
    if reason is None or not reason.group(1).strip() or judgment is None or not judgment.group(1).strip():
        raise ValueError("the answer needs a 'Reason: ...' and a 'Judgment: ...' line")
    text = judgment.group(1).strip()
    return text.removesuffix(".") if text.removesuffix(".") in JUDGMENTS else "unrecognised"


def compare_messages(
    image_url: str, first: str, second: str, human: str, prompts: CapArenaPrompts | None = None,
    detail: str | None = None, guard: bool = False,
) -> list[dict[str, Any]]:  # fmt: skip
    """The pairwise request: the image, then both captions and the human reference; our wording (each
    caption cleaned, an escaped data block), or the official one (``prompts``: the captions as they
    are, or as ours with ``guard``)."""
    image_url_part: dict[str, Any] = {"url": image_url}
    if detail is not None:
        image_url_part["detail"] = detail
    if prompts is None:
        system: str | list[dict[str, str]] = load_rubric("caparena_compare").text
        first, second, human = (clean_text(t).strip() for t in (first, second, human))
        text = "\n\n".join(
            [data_block("caption_1", first), data_block("caption_2", second), data_block("reference_caption", human),
             "Which caption is better? Answer in the required format; mark a tie only if it is truly hard to decide."]
        )  # fmt: skip
    else:
        system = [{"type": "text", "text": prompts.system}]  # the official request's shape
        first, second, human = (official_text(t, guard) for t in (first, second, human))
        text = prompts.compare.fill(caption_1=first, caption_2=second, caption_ref=human, guard=guard)
    return [
        {"role": "system", "content": system},
        {
            "role": "user",
            "content": [{"type": "image_url", "image_url": image_url_part}, {"type": "text", "text": text}],
        },
    ]


def run_caparena(
    caller: JudgeCaller,
    items: Sequence[CapArenaItem],
    captions: CaptionSet,
    out_dir: Path,
    settings: CapArenaSection | None = None,
    *,
    on_progress: Callable[[int, int], None] | None = None,
    prompts: CapArenaPrompts | None = None,
    label: str | None = None,
) -> ProtocolResult:
    """Battle every image that has a caption against its baseline; write ``items.jsonl``; summarise.
    ``prompts``: the official prompts (:func:`~balcaprl.evaluate.official.load_caparena_prompts`);
    None runs our paraphrase."""
    settings = settings or CapArenaSection()
    extra = {"top_p": settings.top_p} if settings.top_p is not None else None
    official_images = settings.image_mode == "official" or (
        settings.image_mode == "auto" and prompts is not None
    )
    images = (
        ImageLoader(OFFICIAL_IMAGE_SIDE, root=settings.images)
        if official_images
        else ImageLoader(caller.config.max_image_side, root=settings.images)
    )
    detail = "high" if official_images else None
    skipped = [i.image for i in items if label is not None and i.ref_model == label]
    todo = [(i, captions.lookup(i.image)) for i in items if i.image not in skipped]
    missing = [i.image for i, c in todo if c is None]
    todo = [(i, c) for i, c in todo if c is not None]

    async def judge(messages: list[dict[str, Any]]) -> tuple[str | None, JudgeFailure | None]:
        if prompts is None:
            result = await caller.call_json(
                messages, PairVerdict, kind="caparena_compare", temperature=settings.temperature,
                max_tokens=settings.max_tokens, extra_body=extra,
            )  # fmt: skip
            return (None, result.failure) if result.failure is not None else (result.value.judgment, None)
        last: JudgeFailure | None = None
        as_try = settings.http_errors == "try"
        for attempt in range(settings.max_attempts):  # the official script's 5 tries, each a new sample
            result = await caller.call_text(
                messages, kind="caparena_compare", trial=attempt or None, temperature=settings.temperature,
                max_tokens=settings.max_tokens, extra_body=extra, truncated_ok=True, token_field="max_tokens",
                max_retries=0 if as_try else None, encode=CAPARENA_BODY,
            )  # fmt: skip
            if result.failure is not None and result.failure.reason != "invalid_json":
                if not as_try:
                    return None, result.failure
                # the official script: a failed call answers "" (or raises), one try spent, a pause
                last = result.failure
                if attempt + 1 < settings.max_attempts:
                    await asyncio.sleep(backoff_s(attempt, None))
                continue
            if result.failure is None:
                try:
                    return read_official_judgment(result.value), None
                except ValueError as error:
                    last = JudgeFailure("schema_violation", str(error))
            else:
                last = result.failure
        assert last is not None
        return None, JudgeFailure(
            last.reason, f"no usable answer in {settings.max_attempts} samples: {last.detail}"
        )

    async def battle(item: CapArenaItem, caption: str) -> tuple[bool, str | None, JudgeFailure | None]:
        first = positions(item.image, settings.seed)
        texts = [("image name", item.image), ("caption", caption),
                 ("baseline caption", item.baseline_caption), ("human reference", item.human)]  # fmt: skip
        refusal = unicode_failure(
            texts, f"image {item.image!r}", official=prompts is not None, guard=settings.guard
        )
        if refusal is not None:  # never sent
            return first, None, refusal
        try:
            image = await asyncio.to_thread(images.load, item.image)
        except ImageError as error:
            return first, None, JudgeFailure("bad_input", str(error))
        pair = (caption, item.baseline_caption) if first else (item.baseline_caption, caption)
        url = image.data_url
        if official_images:  # the file's bytes as they are, labelled PNG whatever they are, as the script
            raw = await asyncio.to_thread(images.resolve(item.image).read_bytes)
            url = official_image_url(raw)
        messages = compare_messages(url, *pair, item.human, prompts, detail, settings.guard)
        judgment, failure = await judge(messages)
        return first, judgment, failure

    done = 0

    async def one(pair: tuple[CapArenaItem, str]) -> dict[str, Any]:
        nonlocal done
        item, caption = pair
        first, judgment, failure = await battle(item, caption)
        done += 1
        if on_progress is not None:
            on_progress(done, len(todo))
        winner = None
        if judgment == "unrecognised":
            winner = "unrecognised"
        elif judgment is not None:
            winner = (
                "tie"
                if judgment == "Tie"
                else ("model" if (judgment == JUDGMENTS[0]) == first else "baseline")
            )
        return {
            "image": item.image, "baseline": item.ref_model, "model_position": 1 if first else 2,
            "judgment": judgment, "winner": winner, "words": caption_words(caption),
            "failure": None if failure is None else failure.reason,
            **({} if failure is None else {"detail": failure.detail}),
        }  # fmt: skip

    path = Path(out_dir) / "items.jsonl"
    judge_in_spans(path, todo, one, span=span_rows(caller.config), close=caller.aclose)
    rows = [{k: v for k, v in row.items() if k != "detail"} for row in read_items(path)]
    battles = [Battle(r["image"], r["baseline"], r["model_position"] == 1, r["judgment"]) for r in rows]
    baselines = list(dict.fromkeys([*BASELINES, *(i.ref_model for i in items)]))
    scores = arena_scores(battles, baselines) if battles else None
    metrics = {
        "score": None if scores is None else scores["score"],
        "normalised": None if scores is None else scores["normalised"],
        "length_words": mean([r["words"] for r in rows]) if rows else None,
        "per_baseline": None if scores is None else scores["per_baseline"],
        "skipped_own_baseline": skipped,
        "unrecognised_judgments": sum(r["judgment"] == "unrecognised" for r in rows),
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
        settings={
            **settings.options(),
            "images_sent": "official" if official_images else "judge",
            "prompts": (
                prompts.source.ran(settings.guard)
                if prompts is not None
                else paraphrase_source("caparena", ("caparena_compare",))
            ).as_dict(),
        },  # fmt: skip
        judge=caller.config.model,
        stats=caller.stats.as_dict(caller.config.price_per_million_tokens),
        notes="score = mean over baselines of (wins - losses) / 2 (-100..100 on the full 600 images); "
        "length_words = mean words per caption; a failed battle or an unrecognised judgment counts neither way",
    )


PROTOCOL = Protocol(
    name="caparena", benchmark="caparena", title="CapArena-Auto.", section=CapArenaSection,
    read=lambda section: read_caparena(section.annotations), run=run_caparena,
    official_prompts=lambda o: None if o.caparena is None else load_caparena_prompts(o.caparena),
    official_options=OFFICIAL_OPTIONS,
)  # fmt: skip
