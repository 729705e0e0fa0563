"""DCScore, the DeCapBench protocol (Ye et al., "Painting with Words", ICLR 2025), on our judge client.

Per caption, as the benchmark's official ``evaluation_decapbench.py`` does it:

1. **extract** the caption's atomic facts, each with an identifier and a relevance flag (is it about
   the image's content, or an inference/commentary?) — one call, text only;
2. **match** every predicted fact to the most similar human oracle fact, or none — ``n_match``
   calls (3), text only;
3. **verify** every predicted fact against the image and the human reference caption — ``n_verify``
   calls (3), with the image.

Every (verification, matching) pair is one trial (3 x 3 = 9), scored by :func:`score_trial`:

- precision = verified facts / predicted facts;
- recall: each verified fact matched to an oracle fact earns 1/k, where k is the number of predicted
  facts (verified or not) matched to that same oracle fact; each verified *unmatched* fact earns 1
  and also joins the denominator: recall = earned / (oracle facts + verified unmatched facts);
- F1 = 2PR / (P + R + 1e-8); the same three on the relevant facts only (all oracle facts count as
  relevant). As in the official code, the 1/k shares of the relevant-fact recall use k counted over
  all predicted facts.

A caption's precision, recall and F1s are the means over its trials; its DCScore is
(F1_all + F1_relevant) / 2, and the benchmark's DCScore is 100 x the mean over captions.

Where we differ from the official script, and why: a caption with no extractable fact (or no
relevant fact) scores 0 there instead of crashing the script; a caption whose calls fail is reported
as a failure (never scored 0) and left out of the mean, as the official script leaves out its
invalid evaluations — re-running asks only for the calls still missing (each trial is cached).
The sampling follows the official script (GPT-4o; extraction and matching at temperature 1,
verification at 0.3); the judge model is whatever the judge config names.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from balcaprl.evaluate.formats import CaptionSet, DeCapBenchItem
from balcaprl.evaluate.results import ProtocolResult, mean, write_items
from balcaprl.judge.calls import JudgeCaller
from balcaprl.judge.images import ImageError
from balcaprl.judge.prompt import clean_text
from balcaprl.judge.protocol import JudgeFailure
from balcaprl.rewards.rubrics import load_rubric

__all__ = [
    "DCScoreSettings",
    "ExtractedFacts",
    "FactMatches",
    "FactVerdicts",
    "TrialScores",
    "caption_scores",
    "run_dcscore",
    "score_trial",
]

F1_EPS = 1e-8  # the official script's F1 denominator guard


class DCScoreSettings(BaseModel):
    """How DCScore is run; the defaults are the official protocol's."""

    model_config = ConfigDict(extra="forbid")

    n_match: int = Field(3, ge=1, description="Matching trials per caption (official: 3).")
    n_verify: int = Field(3, ge=1, description="Verification trials per caption (official: 3).")
    extract_temperature: float | None = Field(1.0, description="Fact extraction sampling temperature.")
    match_temperature: float | None = Field(1.0, description="Matching sampling temperature.")
    verify_temperature: float | None = Field(0.3, description="Verification sampling temperature.")
    max_tokens: int = Field(2000, ge=16, description="Most tokens per answer (official: 2000).")


# ----------------------------------------------------------------------------------------- schemas


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class Fact(_Strict):
    fact: str = Field(min_length=1)
    identifier: str
    relevance: bool


class ExtractedFacts(_Strict):
    facts: list[Fact]


class Match(_Strict):
    id: int
    oracle_id: int | None


class FactMatches(_Strict):
    matches: list[Match]


class Verdict(_Strict):
    id: int
    correct: bool


class FactVerdicts(_Strict):
    verdicts: list[Verdict]


def _check_ids(ids: Sequence[int], n: int, what: str) -> None:
    if sorted(ids) != list(range(1, n + 1)):
        raise ValueError(
            f"{what} must have exactly one entry for each of the ids 1..{n}, got ids {list(ids)}"
        )


# ----------------------------------------------------------------------------------------- arithmetic


@dataclass(frozen=True)
class TrialScores:
    precision: float
    recall: float
    f1: float
    precision_relevant: float
    recall_relevant: float
    f1_relevant: float
    total_facts: float  # the recall denominator: oracle facts + verified unmatched
    total_facts_relevant: float


def _f1(p: float, r: float) -> float:
    return 2 * p * r / (p + r + F1_EPS)


def score_trial(
    relevance: Sequence[bool], matches: Sequence[int | None], verified: Sequence[bool], n_oracle: int
) -> TrialScores:
    """One trial: predicted facts' relevance flags, their matched oracle fact (or None) and their
    verification, against ``n_oracle`` oracle facts (all relevant). See the module docstring."""
    n = len(relevance)
    if not (len(matches) == len(verified) == n):
        raise ValueError("relevance, matches and verified must have one entry per predicted fact")
    k = Counter(m for m in matches if m is not None)  # predictions sharing each oracle fact

    def part(members: list[int]) -> tuple[float, float, float]:
        earned, correct, extra = 0.0, 0, 0
        for i in members:
            if not verified[i]:
                continue
            correct += 1
            if matches[i] is None:
                earned += 1
                extra += 1
            else:
                earned += 1 / k[matches[i]]
        precision = correct / len(members) if members else 0.0
        total = n_oracle + extra
        recall = earned / total if total else 0.0
        return precision, recall, float(total)

    p, r, total = part(list(range(n)))
    pr, rr, total_r = part([i for i in range(n) if relevance[i]])
    return TrialScores(p, r, _f1(p, r), pr, rr, _f1(pr, rr), total, total_r)


def caption_scores(trials: Sequence[TrialScores]) -> dict[str, float]:
    """A caption's figures: each mean over its trials, and DCScore = (F1 + F1_relevant) / 2."""
    if not trials:
        raise ValueError("a caption needs at least one trial")
    out = {name: mean([getattr(t, name) for t in trials]) for name in TrialScores.__dataclass_fields__}
    out["dcscore"] = (out["f1"] + out["f1_relevant"]) / 2
    return out


# ----------------------------------------------------------------------------------------- prompts


def _numbered(tag: str, texts: Sequence[str]) -> str:
    lines = "\n".join(f"{i}. {' '.join(t.split())}" for i, t in enumerate(texts, 1))
    return f"<{tag}>\n{lines}\n</{tag}>"


def _fact_line(fact: Fact) -> str:
    return f"{fact.fact} [{fact.identifier}]" if fact.identifier else fact.fact


def extract_messages(caption: str) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": load_rubric("dcscore_extract").text},
        {"role": "user", "content": f"<caption>\n{clean_text(caption).strip()}\n</caption>"},
    ]


def match_messages(facts: Sequence[Fact], oracle: Sequence[str]) -> list[dict[str, Any]]:
    text = (
        _numbered("predicted_facts", [_fact_line(f) for f in facts])
        + "\n\n"
        + _numbered("oracle_facts", oracle)
    )
    return [
        {"role": "system", "content": load_rubric("dcscore_match").text},
        {"role": "user", "content": text},
    ]


def verify_messages(image_data_url: str, reference: str, facts: Sequence[Fact]) -> list[dict[str, Any]]:
    text = f"<reference>\n{reference}\n</reference>\n\n" + _numbered("facts", [_fact_line(f) for f in facts])
    return [
        {"role": "system", "content": load_rubric("dcscore_verify").text},
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": image_data_url}},
                {"type": "text", "text": text},
            ],
        },
    ]


# ----------------------------------------------------------------------------------------- protocol


@dataclass
class _Item:
    key: str
    failure: str | None = None
    detail: str | None = None
    scores: dict[str, float] | None = None
    facts: list[dict[str, Any]] | None = None
    trials: list[dict[str, Any]] | None = None


async def _score_caption(
    caller: JudgeCaller, settings: DCScoreSettings, item: DeCapBenchItem, caption: str, image_root: Path
) -> _Item:
    out = _Item(item.key)
    text = clean_text(caption).strip()
    if not text:  # an empty caption states nothing: no fact, precision and recall 0
        out.scores = caption_scores([score_trial([], [], [], len(item.oracle_facts))])
        out.facts, out.trials = [], []
        return out

    def fail(failure: JudgeFailure, step: str) -> _Item:
        out.failure, out.detail = failure.reason, f"{step}: {failure.detail}"[:300]
        return out

    extracted = await caller.call_json(
        extract_messages(text), ExtractedFacts, kind="dcscore_extract",
        temperature=settings.extract_temperature, max_tokens=settings.max_tokens,
    )  # fmt: skip
    if extracted.failure is not None:
        return fail(extracted.failure, "extract")
    facts = list(extracted.value.facts)
    out.facts = [f.model_dump() for f in facts]
    n_oracle = len(item.oracle_facts)
    if not facts:
        out.scores = caption_scores([score_trial([], [], [], n_oracle)])
        out.trials = []
        return out

    def check_matches(answer: FactMatches) -> None:
        _check_ids([m.id for m in answer.matches], len(facts), "matches")
        bad = [
            m.oracle_id
            for m in answer.matches
            if m.oracle_id is not None and not 1 <= m.oracle_id <= n_oracle
        ]
        if bad:
            raise ValueError(f"oracle_id must be null or one of 1..{n_oracle}, got {bad}")

    def check_verdicts(answer: FactVerdicts) -> None:
        _check_ids([v.id for v in answer.verdicts], len(facts), "verdicts")

    try:
        image = await asyncio.to_thread(caller.images.load, image_root / item.key)
    except ImageError as error:
        return fail(JudgeFailure("bad_input", str(error)), "image")
    match_calls = [
        caller.call_json(
            match_messages(facts, item.oracle_facts),
            FactMatches,
            kind="dcscore_match",
            trial=t,
            temperature=settings.match_temperature,
            max_tokens=settings.max_tokens,
            check=check_matches,
        )  # fmt: skip
        for t in range(settings.n_match)
    ]
    verify_calls = [
        caller.call_json(
            verify_messages(image.data_url, item.oracle_caption, facts),
            FactVerdicts,
            kind="dcscore_verify",
            trial=t,
            temperature=settings.verify_temperature,
            max_tokens=settings.max_tokens,
            check=check_verdicts,
        )  # fmt: skip
        for t in range(settings.n_verify)
    ]
    results = await asyncio.gather(*match_calls, *verify_calls)
    for step, result in zip(
        ["match"] * settings.n_match + ["verify"] * settings.n_verify, results, strict=True
    ):
        if result.failure is not None:  # every trial is needed, as in the official script
            return fail(result.failure, step)
    mappings = [
        [m.oracle_id for m in sorted(r.value.matches, key=lambda m: m.id)]
        for r in results[: settings.n_match]
    ]
    verifications = [
        [v.correct for v in sorted(r.value.verdicts, key=lambda v: v.id)] for r in results[settings.n_match :]
    ]
    relevance = [f.relevance for f in facts]
    trials, out.trials = [], []
    for i, verified in enumerate(verifications):
        for j, matches in enumerate(mappings):
            trial = score_trial(relevance, matches, verified, n_oracle)
            trials.append(trial)
            out.trials.append(
                {
                    "verify_trial": i,
                    "match_trial": j,
                    "matches": matches,
                    "verified": verified,
                    **asdict(trial),
                }
            )
    out.scores = caption_scores(trials)
    return out


def run_dcscore(
    caller: JudgeCaller,
    items: Sequence[DeCapBenchItem],
    captions: CaptionSet,
    image_root: Path,
    out_dir: Path,
    settings: DCScoreSettings | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> ProtocolResult:
    """Score every DeCapBench image that has a caption; write ``items.jsonl`` and return the summary."""
    settings = settings or DCScoreSettings()
    todo = [(item, captions.lookup(item.key)) for item in items]
    missing = [item.key for item, caption in todo if caption is None]
    todo = [(item, caption) for item, caption in todo if caption is not None]

    async def run_all() -> list[_Item]:
        done = 0

        async def one(item: DeCapBenchItem, caption: str) -> _Item:
            nonlocal done
            result = await _score_caption(caller, settings, item, caption, Path(image_root))
            done += 1
            if on_progress is not None:
                on_progress(done, len(todo))
            return result

        try:
            return await asyncio.gather(*[one(item, caption) for item, caption in todo])
        finally:
            await caller.aclose()

    scored = asyncio.run(run_all())
    rows = []
    for (item, caption), result in zip(todo, scored, strict=True):
        row: dict[str, Any] = {"key": item.key, "caption": caption, "failure": result.failure}
        if result.failure is not None:
            row["detail"] = result.detail
        else:
            row.update(result.scores or {})
            row["n_facts"] = len(result.facts or [])
            row["n_oracle_facts"] = len(item.oracle_facts)
        row["facts"] = result.facts
        row["trials"] = result.trials
        rows.append(row)
    write_items(Path(out_dir) / "items.jsonl", rows)
    ok = [r for r in rows if r["failure"] is None]
    metrics = {
        name: (100 * mean([r[name] for r in ok]) if ok else None)
        for name in (
            "dcscore",
            "precision",
            "recall",
            "f1",
            "precision_relevant",
            "recall_relevant",
            "f1_relevant",
        )
    }
    return ProtocolResult(
        protocol="dcscore",
        score=metrics["dcscore"],
        metrics=metrics,
        n_items=len(items),
        n_scored=len(ok),
        failures=dict(Counter(r["failure"] for r in rows if r["failure"] is not None)),
        missing=missing,
        settings=settings.model_dump(),
        judge=caller.config.model,
        stats=caller.stats.as_dict(caller.config.price_per_million_tokens),
        notes="DCScore x100 = mean over captions of (F1 + F1 relevant) / 2; components x100",
    )
