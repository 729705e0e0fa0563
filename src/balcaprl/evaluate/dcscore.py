"""DCScore, the DeCapBench protocol (Ye et al., "Painting with Words", ICLR 2025), on our judge client.

Per caption, as the benchmark's official ``evaluation_decapbench.py`` does it:

1. **extract** the caption's atomic facts, each with an identifier and a relevance flag (is it about
   the image's content, or an inference/commentary?) — one call, text only;
2. **match** every predicted fact to the most similar human oracle fact, or none — ``n_match``
   samples (3), text only;
3. **verify** every predicted fact against the image and the human reference caption — ``n_verify``
   samples (3), with the image.

Every (verification, matching) pair is one trial (3 x 3 = 9), scored by :func:`score_trial` over the
verifier's list of facts:

- precision = verified facts / facts;
- recall: each verified fact matched to an oracle fact earns 1/k, where k is the number of facts
  (verified or not) matched to that same oracle fact; each verified *unmatched* fact earns 1 and also
  joins the denominator: recall = earned / (oracle facts + verified unmatched facts);
- F1 = 2PR / (P + R + 1e-8); the same three on the relevant facts only (all oracle facts count as
  relevant). As in the official code, the 1/k shares of the relevant-fact recall use k counted over
  all facts, and facts are keyed by their text with either prompts: two facts with the same text
  share one match (the later one) and are relevant if either is.

A caption's precision, recall and F1s are the means over its trials; its DCScore is
(F1_all + F1_relevant) / 2, and the benchmark's DCScore is 100 x the mean over valid captions.

**Edge rules, as the official scorer has them (the defaults).** Oracle facts are used as published
(unstripped; DeCapBench's blank fact counts). An empty caption is asked like any other
(``empty_captions: ask``; ours, ``invalid``, makes no call). The official script tries a whole caption
up to 5 times: any unusable answer (unreadable by its parser, or listing other facts) or facts the
formulas divide by zero for (no fact, no relevant fact) ends the try, and the next try starts from a
new extraction, matching and verification. So here (``max_attempts``, official 5): after the last
try, a caption with no (relevant) fact is *invalid* — left out of the means, counted (``n_invalid``)
and named (``invalid``) — and one with an unusable answer is a failure (left out of the means too, as
the official script leaves it invalid, and asked again by a re-run). Our stricter choice,
``degenerate_captions: zero``, scores such a caption 0 and keeps it in the mean (no further try).

**Prompts.** By default our own wording (rubrics ``dcscore_extract``/``_match``/``_verify``: JSON
schemas, facts numbered). With ``official.decapbench`` set (:mod:`balcaprl.evaluate.official`), the
official templates read from the user's checkout, sent as the script sends them: system message
then the filled template as the user message; free-text answers read by the official parser alone
(:func:`parse_fenced_json`: its four tries, in its order); predicted facts keyed by their text and
oracle facts by their 0-based ``id``, each list formatted as the script formats it. The verification
image is the stored pixels (no EXIF rotation, as ``Image.open(...).convert("RGB")``) at full size,
re-encoded as JPEG (quality 75) with ``detail: "high"`` (``image_mode: official``; ``auto`` follows
the prompts).

Where we still differ from the official script, and why: a call that fails (server errors after the
client's retries, refusals) is reported as a failure (never scored, asked again by a re-run: each
answer is cached) rather than spending one of the caption's tries; a matching or verification answer must list exactly the extracted facts (the
script only requires the two answers to list the same facts), so that every trial's arithmetic is
defined; a try whose facts are degenerate makes no matching and verification calls (the script makes
them, then fails on the division: the same number, fewer calls). Otherwise each request is the
script's, byte for byte (the caption and the reference as they are, ``max_tokens``, a step's samples
in one request with ``n`` as ``sample_requests: one`` asks, the installed openai client's key order
and serialisation; an endpoint that ignores ``n`` gets the other samples one by one, recorded as
``samples_sent: each``); the ``guard``
option (:mod:`~balcaprl.evaluate.official`) escapes and cleans the texts instead. The judge model is
whatever the judge config names (the benchmark used gpt-4o-2024-05-13).
"""

from __future__ import annotations

import ast
import asyncio
import html
import json
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from balcaprl.evaluate.formats import CaptionSet, DeCapBenchItem, read_decapbench
from balcaprl.evaluate.official import (
    DECAPBENCH_JPEG_QUALITY,
    OFFICIAL_IMAGE_SIDE,
    DeCapBenchPrompts,
    load_decapbench_prompts,
    official_text,
    openai_body,
    paraphrase_source,
    unicode_failure,
)
from balcaprl.evaluate.protocols import OfficialPromptSection, Protocol
from balcaprl.evaluate.results import ProtocolResult, judge_in_spans, mean, read_items
from balcaprl.judge.calls import CallResult, JudgeCaller
from balcaprl.judge.images import ImageError, ImageLoader
from balcaprl.judge.prompt import clean_text, data_block
from balcaprl.judge.protocol import JudgeFailure
from balcaprl.judge.rubrics import load_rubric
from balcaprl.judge.throughput import span_rows

F1_EPS = 1e-8  # the official script's F1 denominator guard
_UNUSABLE = ("invalid_json", "schema_violation")  # answers worth another sample (empty, unreadable)
RUBRICS = ("dcscore_extract", "dcscore_match", "dcscore_verify")


class DCScoreSection(OfficialPromptSection):
    """DCScore's files and options; the defaults are the official protocol's."""

    INPUTS = {
        "annotations": ("DeCapBench annotations", "--decapbench"),
        "images": ("the DeCapBench image folder", "--decapbench-images"),
    }
    annotations: Path | None = Field(None, description="DeCapBench annotation JSONL (oracle facts).")
    images: Path | None = Field(None, description="DeCapBench image folder.")
    n_match: int = Field(3, ge=1, description="Matching samples per caption (official: 3).")
    n_verify: int = Field(3, ge=1, description="Verification samples per caption (official: 3).")
    extract_temperature: float | None = Field(1.0, description="Fact extraction sampling temperature.")
    match_temperature: float | None = Field(1.0, description="Matching sampling temperature.")
    verify_temperature: float | None = Field(0.3, description="Verification sampling temperature.")
    max_tokens: int = Field(2000, ge=16, description="Most tokens per answer (official: 2000).")
    degenerate_captions: Literal["invalid", "zero"] = Field(
        "invalid",
        description="A caption with no fact or no relevant fact: 'invalid' (official: extraction retried, "
        "then left out of the mean and counted) or 'zero' (ours, stricter: scored 0 and kept in the mean).",
    )
    max_attempts: int = Field(
        5,
        ge=1,
        description="Tries of a whole caption (a new extraction, matching and verification) while its "
        "answers are unusable or its facts leave the formulas undefined (official: 5).",
    )
    sample_requests: Literal["one", "each"] = Field(
        "one",
        description="With the official prompts, a step's matching or verification samples: 'one' (official: "
        "one request with n set to n_match / n_verify; an endpoint that ignores n gets the rest one by one, "
        "recorded as samples_sent: each) or 'each' (one request per sample, n: 1).",
    )
    empty_captions: Literal["ask", "invalid"] = Field(
        "ask",
        description="An empty caption: 'ask' (official: the judge is asked to extract its facts, like any "
        "caption) or 'invalid' (ours: no call, the caption is invalid at once).",
    )
    image_mode: Literal["auto", "official", "judge"] = Field(
        "auto",
        description="Verification images: 'official' (full size, JPEG quality 75, detail high), 'judge' "
        "(the judge config's max_image_side, no detail), 'auto' (official with official prompts).",
    )


# The official protocol's options (what `balcaprl report` checks before comparing with the paper).
OFFICIAL_OPTIONS: dict[str, tuple[Any, ...]] = {
    "n_match": (3,), "n_verify": (3,), "extract_temperature": (1.0,), "match_temperature": (1.0,),
    "verify_temperature": (0.3,), "max_tokens": (2000,), "degenerate_captions": ("invalid",),
    "max_attempts": (5,), "empty_captions": ("ask",), "images_sent": ("official",), "guard": (False,),
    "samples_sent": ("one",),
}  # fmt: skip


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
    relevance: Sequence[bool], matches: Sequence[Hashable | None], verified: Sequence[bool], n_oracle: int
) -> TrialScores:
    """One trial over the verifier's facts: their relevance flags, their matched oracle fact (an id, or
    None) and their verification, against ``n_oracle`` oracle facts (all relevant). Where the official
    formula divides by zero (no fact, no relevant fact) the precision here is 0: see :func:`degenerate`
    for the rule that keeps such captions out of the mean. See the module docstring."""
    n = len(relevance)
    if not (len(matches) == len(verified) == n):
        raise ValueError("relevance, matches and verified must have one entry per predicted fact")
    k = Counter(m for m in matches if m is not None)  # facts sharing each oracle fact

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


def degenerate(relevance: Sequence[bool]) -> str | None:
    """Why the official formulas are undefined for these facts (None: they are defined)."""
    if not relevance:
        return "no fact"
    if not any(relevance):
        return "no relevant fact"
    return None


def caption_scores(trials: Sequence[TrialScores]) -> dict[str, float]:
    """A caption's figures: each mean over its trials, and DCScore = (F1 + F1_relevant) / 2."""
    if not trials:
        raise ValueError("a caption needs at least one trial")
    out = {name: mean([getattr(t, name) for t in trials]) for name in TrialScores.__dataclass_fields__}
    out["dcscore"] = (out["f1"] + out["f1_relevant"]) / 2
    return out


# ----------------------------------------------------------------------------------------- our prompts


def _numbered(tag: str, texts: Sequence[str]) -> str:
    return data_block(tag, "\n".join(f"{i}. {' '.join(t.split())}" for i, t in enumerate(texts, 1)))


def _fact_line(fact: Fact) -> str:
    return f"{fact.fact} [{fact.identifier}]" if fact.identifier else fact.fact


def extract_messages(caption: str) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": load_rubric("dcscore_extract").text},
        {"role": "user", "content": data_block("caption", caption)},
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


def _image_part(url: str, detail: str | None) -> dict[str, Any]:
    image_url: dict[str, Any] = {"url": url}
    if detail is not None:
        image_url["detail"] = detail
    return {"type": "image_url", "image_url": image_url}


def verify_messages(
    image_data_url: str, reference: str, facts: Sequence[Fact], detail: str | None = None
) -> list[dict[str, Any]]:
    text = data_block("reference", reference) + "\n\n" + _numbered("facts", [_fact_line(f) for f in facts])
    return [
        {"role": "system", "content": load_rubric("dcscore_verify").text},
        {"role": "user", "content": [_image_part(image_data_url, detail), {"type": "text", "text": text}]},
    ]


# ----------------------------------------------------------------------------------------- official dialect


def fact_list_json(items: Sequence[dict[str, Any]]) -> str:
    """A list of fact objects laid out as the official script lays them out in its prompts: a fenced
    ``json`` block, one object per line, each followed by a comma."""
    lines = "".join(f"  {json.dumps(item, ensure_ascii=False)},\n" for item in items)
    return f"```json[\n{lines}]\n```"


def parse_fenced_json(answer: str) -> Any:
    """The value of the last fenced ``json`` block of an answer, read as the official parser reads it,
    its four tries in its order and nothing else: the block's body as a Python literal; then the rest
    of the answer after the last ```` ```json ````, ends' backticks and newlines removed, as a Python
    literal, then as JSON; then that text with every backtick removed, as JSON. ``ValueError`` when
    none reads (the official parser returns None, and the caption is tried again)."""
    tail = answer.split("```json")[-1]
    body = tail.split("```")[0].strip("\n")
    bare = tail.strip("`").strip().replace("\n", "")
    tries = ((body, ast.literal_eval), (bare, ast.literal_eval), (bare, json.loads),
             (bare.replace("`", ""), json.loads))  # fmt: skip
    for candidate, read in tries:
        try:
            return read(candidate)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
    raise ValueError("no JSON list in the answer (expected a ```json fenced list)")


def official_extract_messages(
    prompts: DeCapBenchPrompts, caption: str, guard: bool = False
) -> list[dict[str, Any]]:
    """The official extraction request: the system message, then the filled template."""
    return [
        {"role": "system", "content": prompts.system},
        {"role": "user", "content": prompts.extract.fill(caption=caption, guard=guard)},
    ]


def official_match_messages(
    prompts: DeCapBenchPrompts, facts: Sequence[dict[str, Any]], oracle: Sequence[str], guard: bool = False
) -> list[dict[str, Any]]:
    """The official matching request: predicted facts (their objects, without relevance) and the oracle
    facts keyed by their 0-based ``id``, each list laid out as the official script lays it out."""
    text = prompts.match.fill(
        predicted_atomic_facts=fact_list_json(facts),
        oracle_atomic_facts=fact_list_json([{"id": i, "fact": f} for i, f in enumerate(oracle)]),
        guard=guard,
    )
    return [{"role": "system", "content": prompts.system}, {"role": "user", "content": text}]


def official_verify_messages(
    prompts: DeCapBenchPrompts, image_data_url: str, reference: str, facts: Sequence[dict[str, Any]],
    detail: str | None = "high", guard: bool = False,
) -> list[dict[str, Any]]:  # fmt: skip
    """The official verification request: the image, then the filled template."""
    text = prompts.verify.fill(reference_caption=reference, atomic_facts=fact_list_json(facts), guard=guard)
    return [
        {"role": "system", "content": prompts.system},
        {"role": "user", "content": [_image_part(image_data_url, detail), {"type": "text", "text": text}]},
    ]


def _objects(value: Any, keys: Sequence[str], what: str) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise ValueError(f"the {what} answer must be a list of objects")
    for i, item in enumerate(value):
        if not isinstance(item, dict) or any(k not in item for k in keys):
            raise ValueError(f"{what} item {i} must be an object with {', '.join(keys)}")
        if not isinstance(item["fact"], str):
            raise ValueError(f"{what} item {i}: 'fact' must be a string")
        try:  # the objects go back into later prompts as JSON (a Python literal may hold a set)
            json.dumps(item, ensure_ascii=False)
        except (TypeError, ValueError):
            raise ValueError(f"{what} item {i} is not plain JSON data") from None
    return value


def _echoed(text: str, known: set[str]) -> str:
    """A fact text as the judge echoed it; with the guard on, the facts reached it HTML-escaped inside
    a data block, so an escaped echo of a known fact is that fact."""
    return text if text in known else html.unescape(text)


def _same_facts(texts: Sequence[str], known: set[str], what: str) -> None:
    if set(texts) != known:
        missing, extra = sorted(known - set(texts)), sorted(set(texts) - known)
        raise ValueError(
            f"the {what} must list exactly the extracted facts (missing {missing[:3]}, unknown {extra[:3]})"
        )


def _oracle_id(value: Any) -> Hashable | None:
    if value is None or value == "None":
        return None
    if not isinstance(value, int | str | float):
        raise ValueError(f"matched_oracle_id must be an id or None, got {type(value).__name__}")
    return value


# ----------------------------------------------------------------------------------------- protocol


def _read(answer: str, read: Callable[[str], Any]) -> tuple[Any, JudgeFailure | None]:
    """An official answer read by ``read``; unreadable: a ``schema_violation`` (the try ends)."""
    try:
        return read(answer), None
    except ValueError as error:
        return None, JudgeFailure("schema_violation", str(error)[:300])


def _as_sent(temperature: float | None) -> float | int | None:
    """A temperature as the official script writes it: ``temperature=1`` goes as the JSON integer 1."""
    return int(temperature) if temperature is not None and float(temperature).is_integer() else temperature


# An official request of one sample, as the script sends its extraction (besides its texts):
# `max_tokens` and `n: 1` (matching and verification ask for their samples in one request).
_OFFICIAL_REQUEST = {"token_field": "max_tokens", "extra_body": {"n": 1}}


@dataclass
class _Facts:
    """The extracted facts of one caption: their relevance, what later prompts show, and their keys:
    their texts, as the official scorer keys matches and relevance (two facts with one text share
    one match and one relevance, whichever prompts ran)."""

    relevance: list[bool]
    shown: list[Any]  # Fact (ours) or the fact objects without 'relevance' (official)
    dumped: list[dict[str, Any]]
    keys: list[Hashable]
    relevant_keys: set[Hashable]


@dataclass
class _Item:
    key: str
    failure: str | None = None
    detail: str | None = None
    invalid: str | None = None
    scores: dict[str, float] | None = None
    facts: list[dict[str, Any]] | None = None
    trials: list[dict[str, Any]] | None = None
    attempts: int = 0


class _Run:
    """One DCScore run: settings, prompts (ours or official) and images."""

    def __init__(self, caller: JudgeCaller, settings: DCScoreSection, prompts: DeCapBenchPrompts | None,
                 image_root: Path | None):  # fmt: skip
        self.caller, self.settings, self.prompts = caller, settings, prompts
        official_images = settings.image_mode == "official" or (
            settings.image_mode == "auto" and prompts is not None
        )
        self.images_sent = "official" if official_images else "judge"
        # n samples in one request, as the official script asks (the client never streams one)
        self.one_request = settings.sample_requests == "one"
        self.samples_sent = "one" if self.one_request else "each"
        # the official client's body layout, read before any call (openai_body probes the client once)
        self.encode = openai_body() if prompts is not None else None
        self.detail = "high" if official_images else None
        self.images = (
            ImageLoader(
                OFFICIAL_IMAGE_SIDE, root=image_root, jpeg_quality=DECAPBENCH_JPEG_QUALITY, upright=False
            )
            if official_images
            else ImageLoader(caller.config.max_image_side, root=image_root)
        )

    async def _text(self, messages: list[dict[str, Any]], kind: str, trial: int,
                    temperature: float | None, read: Callable[[str], Any]) -> tuple[Any, JudgeFailure | None]:  # fmt: skip
        """One official sample, free text read by ``read``: an unreadable answer is a ``schema_violation``
        (the caller tries the whole caption again, as the official script does)."""
        result = await self.caller.call_text(  # a cut-off answer is read as it is, as the script reads it
            messages, kind=kind, trial=trial or None, temperature=_as_sent(temperature),
            max_tokens=self.settings.max_tokens, truncated_ok=True, encode=self.encode, **_OFFICIAL_REQUEST,
        )  # fmt: skip
        return (None, result.failure) if result.failure is not None else _read(result.value, read)

    async def _samples(self, messages: list[dict[str, Any]], kind: str, n: int, attempt: int,
                       temperature: float | None, read: Callable[[str], Any]) -> list[tuple[Any, JudgeFailure | None]]:  # fmt: skip
        """A step's ``n`` official samples of one try: in one request with ``n``, as the script asks for
        them (``sample_requests: one``), the samples an endpoint did not give asked one by one; or one
        request per sample (``each``, and always with a streaming judge)."""
        trials = [t + n * attempt for t in range(n)]
        out: list[tuple[Any, JudgeFailure | None]] = []
        if self.one_request:
            result = await self.caller.call_texts(
                messages, n, kind=kind, trial=attempt or None, temperature=_as_sent(temperature),
                max_tokens=self.settings.max_tokens, token_field="max_tokens", encode=self.encode,
            )  # fmt: skip
            if result.failure is not None:
                return [(None, result.failure)] * n
            out = [_read(text, read) for text in result.value[:n]]
            if len(out) < n:  # the endpoint ignores n: the rest one by one, and the run says so
                self.samples_sent = "each"
        rest = [self._text(messages, kind, t, temperature, read) for t in trials[len(out) :]]
        return out + list(await asyncio.gather(*rest))

    # --------------------------------------------------------------------- extraction

    async def extract(self, text: str, attempt: int) -> tuple[_Facts | None, JudgeFailure | None]:
        """One extraction sample (``attempt`` numbers it, for the cache)."""
        trial = attempt if attempt else None
        if self.prompts is None:
            result = await self.caller.call_json(
                extract_messages(text), ExtractedFacts, kind="dcscore_extract", trial=trial,
                temperature=self.settings.extract_temperature, max_tokens=self.settings.max_tokens,
            )  # fmt: skip
            if result.failure is not None:
                return None, result.failure
            facts = list(result.value.facts)
            return _Facts(
                [f.relevance for f in facts], facts, [f.model_dump() for f in facts], [f.fact for f in facts],
                {f.fact for f in facts if f.relevance},
            ), None  # fmt: skip
        messages = official_extract_messages(self.prompts, text, self.settings.guard)
        found, failure = await self._text(
            messages, "dcscore_extract", attempt, self.settings.extract_temperature,
            lambda answer: _objects(parse_fenced_json(answer), ("fact", "relevance"), "extraction"),
        )  # fmt: skip
        if failure is not None:
            return None, failure
        shown = [{k: v for k, v in item.items() if k != "relevance"} for item in found]
        return _Facts(
            [item["relevance"] == 1 for item in found], shown, found, [item["fact"] for item in found],
            {item["fact"] for item in found if item["relevance"] == 1},
        ), None  # fmt: skip

    # --------------------------------------------------------------------- matching and verification

    def _paraphrase_calls(
        self, facts: _Facts, item: DeCapBenchItem, image_url: str, attempt: int
    ) -> list[Any]:
        n, n_oracle = len(facts.shown), len(item.oracle_facts)

        def check_matches(answer: FactMatches) -> None:
            _check_ids([m.id for m in answer.matches], n, "matches")
            bad = [
                m.oracle_id
                for m in answer.matches
                if m.oracle_id is not None and not 1 <= m.oracle_id <= n_oracle
            ]
            if bad:
                raise ValueError(f"oracle_id must be null or one of 1..{n_oracle}, got {bad}")

        def check_verdicts(answer: FactVerdicts) -> None:
            _check_ids([v.id for v in answer.verdicts], n, "verdicts")

        async def match(t: int) -> tuple[Any, JudgeFailure | None]:
            r: CallResult = await self.caller.call_json(
                match_messages(facts.shown, item.oracle_facts), FactMatches, kind="dcscore_match", trial=t,
                temperature=self.settings.match_temperature, max_tokens=self.settings.max_tokens,
                check=check_matches,
            )  # fmt: skip
            if r.failure is not None:
                return None, r.failure
            # keyed by fact text, as the official scorer keys them: of two facts with one text, the later
            # match counts for both
            ordered = sorted(r.value.matches, key=lambda m: m.id)
            return {facts.keys[m.id - 1]: m.oracle_id for m in ordered}, None

        async def verify(t: int) -> tuple[Any, JudgeFailure | None]:
            r: CallResult = await self.caller.call_json(
                verify_messages(image_url, item.oracle_caption, facts.shown, self.detail), FactVerdicts,
                kind="dcscore_verify", trial=t, temperature=self.settings.verify_temperature,
                max_tokens=self.settings.max_tokens, check=check_verdicts,
            )  # fmt: skip
            if r.failure is not None:
                return None, r.failure
            return [
                (facts.keys[v.id - 1], v.correct) for v in sorted(r.value.verdicts, key=lambda v: v.id)
            ], None

        n_match, n_verify = self.settings.n_match, self.settings.n_verify
        return [match(t + n_match * attempt) for t in range(n_match)] + [
            verify(t + n_verify * attempt) for t in range(n_verify)
        ]

    async def _official_calls(self, facts: _Facts, item: DeCapBenchItem, image_url: str, attempt: int
                              ) -> list[tuple[Any, JudgeFailure | None]]:  # fmt: skip
        prompts = self.prompts
        assert prompts is not None
        known, guard = set(facts.keys), self.settings.guard
        match_messages_ = official_match_messages(prompts, facts.shown, item.oracle_facts, guard)
        verify_messages_ = official_verify_messages(
            prompts, image_url, official_text(item.oracle_caption, guard), facts.shown, self.detail, guard
        )

        def read_matches(answer: str) -> dict[Hashable, Hashable | None]:
            entries = _objects(parse_fenced_json(answer), ("fact", "matched_oracle_id"), "matching")
            mapping = {_echoed(e["fact"], known): _oracle_id(e["matched_oracle_id"]) for e in entries}
            _same_facts(list(mapping), known, "matching")
            return mapping

        def read_verdicts(answer: str) -> list[tuple[Hashable, bool]]:
            entries = _objects(parse_fenced_json(answer), ("fact", "verification"), "verification")
            verdicts = [(_echoed(e["fact"], known), e["verification"] == 1) for e in entries]
            _same_facts([text for text, _ in verdicts], known, "verification")
            return verdicts

        settings = self.settings
        steps = await asyncio.gather(
            self._samples(match_messages_, "dcscore_match", settings.n_match, attempt, settings.match_temperature,
                          read_matches),
            self._samples(verify_messages_, "dcscore_verify", settings.n_verify, attempt,
                          settings.verify_temperature, read_verdicts),
        )  # fmt: skip
        return steps[0] + steps[1]

    # --------------------------------------------------------------------- one caption

    async def score(self, item: DeCapBenchItem, caption: str) -> _Item:
        out = _Item(item.key)
        settings = self.settings
        texts = [("image name", item.key), ("caption", caption), ("reference", item.oracle_caption),
                 *((f"oracle fact {i}", fact) for i, fact in enumerate(item.oracle_facts, 1))]  # fmt: skip
        refusal = unicode_failure(
            texts, f"image {item.key!r}", official=self.prompts is not None, guard=settings.guard
        )
        if refusal is not None:  # never sent: no call is made for it
            out.failure, out.detail = refusal.reason, refusal.detail
            return out
        # ours: cleaned and stripped; official: as the script sends it (cleaned only with the guard)
        text = clean_text(caption).strip() if self.prompts is None else official_text(caption, settings.guard)
        n_oracle = len(item.oracle_facts)

        def fail(failure: JudgeFailure, step: str) -> _Item:
            out.failure, out.detail = failure.reason, f"{step}: {failure.detail}"[:300]
            return out

        def undefined(reason: str) -> _Item:
            if settings.degenerate_captions == "zero":
                out.scores = caption_scores([score_trial([], [], [], n_oracle)])
                out.trials = []
            else:
                out.invalid = reason
            return out

        if not text.strip() and settings.empty_captions == "invalid":  # ours: it states nothing
            return undefined("empty caption")
        # Up to max_attempts tries of the whole caption, as the official script tries a caption up to 5
        # times: each a new extraction, matching and verification; an unusable answer, or (with the
        # official rule) facts the formulas are undefined for, spends a try.
        last: tuple[str, JudgeFailure] | str | None = None
        for attempt in range(settings.max_attempts):
            out.attempts = attempt + 1
            facts, failure = await self.extract(text, attempt)
            if failure is not None:
                if failure.reason not in _UNUSABLE:
                    return fail(failure, "extract")
                last = ("extract", failure)
                continue
            assert facts is not None
            out.facts = facts.dumped
            reason = degenerate(facts.relevance)
            if reason is not None:
                if settings.degenerate_captions == "zero":
                    return undefined(reason)
                last = reason
                continue
            try:
                image = await asyncio.to_thread(self.images.load, item.key)
            except ImageError as error:
                return fail(JudgeFailure("bad_input", str(error)), "image")
            if self.prompts is None:
                results = await asyncio.gather(*self._paraphrase_calls(facts, item, image.data_url, attempt))
            else:
                results = await self._official_calls(facts, item, image.data_url, attempt)
            steps = ["match"] * settings.n_match + ["verify"] * settings.n_verify
            unusable = None
            for step, (_, failure) in zip(steps, results, strict=True):
                if failure is not None and failure.reason not in _UNUSABLE:
                    return fail(failure, step)  # every sample is needed, as in the official script
                unusable = unusable or (failure and (step, failure))
            if unusable:
                last = unusable
                continue
            out.scores, out.trials = self._trials(
                facts, [v for v, _ in results[: settings.n_match]], [v for v, _ in results[settings.n_match :]],
                n_oracle,
            )  # fmt: skip
            return out
        if isinstance(last, str):  # no (relevant) fact in the last try: invalid, as the official script
            return undefined(last)
        assert last is not None
        step, failure = last
        return fail(
            JudgeFailure(
                failure.reason, f"no usable answer in {settings.max_attempts} tries: {failure.detail}"
            ),
            step,
        )

    @staticmethod
    def _trials(facts: _Facts, mappings: list[Any], verifications: list[Any], n_oracle: int
                ) -> tuple[dict[str, float], list[dict[str, Any]]]:  # fmt: skip
        """Every (verification, matching) pair's trial, each over the verifier's list of facts, as the
        official code runs it; the caption's scores."""
        trials, rows = [], []
        for i, verdicts in enumerate(verifications):
            for j, mapping in enumerate(mappings):
                keys = [key for key, _ in verdicts]
                matches = [mapping[key] for key in keys]
                relevance = [key in facts.relevant_keys for key in keys]
                verified = [ok for _, ok in verdicts]
                trial = score_trial(relevance, matches, verified, n_oracle)
                trials.append(trial)
                rows.append({"verify_trial": i, "match_trial": j, "matches": matches, "verified": verified,
                             **asdict(trial)})  # fmt: skip
        return caption_scores(trials), rows


def run_dcscore(
    caller: JudgeCaller,
    items: Sequence[DeCapBenchItem],
    captions: CaptionSet,
    out_dir: Path,
    settings: DCScoreSection | None = None,
    *,
    on_progress: Callable[[int, int], None] | None = None,
    prompts: DeCapBenchPrompts | None = None,
    label: str | None = None,
) -> ProtocolResult:
    """Score every DeCapBench image that has a caption; write ``items.jsonl`` and return the summary.
    ``prompts``: the official prompts (:func:`~balcaprl.evaluate.official.load_decapbench_prompts`);
    None runs our paraphrase."""
    settings = settings or DCScoreSection()
    run = _Run(caller, settings, prompts, settings.images)
    todo = [(item, captions.lookup(item.key)) for item in items]
    missing = [item.key for item, caption in todo if caption is None]
    todo = [(item, caption) for item, caption in todo if caption is not None]

    done = 0

    async def one(pair: tuple[DeCapBenchItem, str]) -> dict[str, Any]:
        nonlocal done
        item, caption = pair
        result = await run.score(item, caption)
        done += 1
        if on_progress is not None:
            on_progress(done, len(todo))
        row: dict[str, Any] = {"key": item.key, "caption": caption, "failure": result.failure,
                               "valid": result.scores is not None}  # fmt: skip
        if result.failure is not None:
            row["detail"] = result.detail
        elif result.invalid is not None:
            row["invalid"] = result.invalid
        else:
            row.update(result.scores or {})
        row["n_facts"] = None if result.facts is None else len(result.facts)
        row["n_oracle_facts"] = len(item.oracle_facts)
        row["extraction_attempts"] = result.attempts
        row["facts"] = result.facts
        row["trials"] = result.trials
        return row

    path = Path(out_dir) / "items.jsonl"
    judge_in_spans(path, todo, one, span=span_rows(caller.config), close=caller.aclose)
    # the figures below read each row's scores, never its facts and trials (the bulk of a row)
    rows = [{k: v for k, v in r.items() if k not in ("facts", "trials")} for r in read_items(path)]
    ok = [r for r in rows if r["valid"]]
    invalid = [r for r in rows if r.get("invalid")]
    names = ("dcscore", "precision", "recall", "f1", "precision_relevant", "recall_relevant", "f1_relevant")
    metrics: dict[str, Any] = {name: (100 * mean([r[name] for r in ok]) if ok else None) for name in names}
    metrics["n_invalid"] = len(invalid)
    metrics["invalid"] = {r["key"]: r["invalid"] for r in invalid}
    source = (
        prompts.source.ran(settings.guard)
        if prompts is not None
        else paraphrase_source("decapbench", RUBRICS)
    )
    return ProtocolResult(
        protocol="dcscore",
        score=metrics["dcscore"],
        metrics=metrics,
        n_items=len(items),
        n_scored=len(ok),
        failures=dict(Counter(r["failure"] for r in rows if r["failure"] is not None)),
        missing=missing,
        settings={
            **settings.options(),
            "images_sent": run.images_sent,
            "prompts": source.as_dict(),
            "samples_sent": run.samples_sent if prompts is not None else "each",
        },
        judge=caller.config.model,
        stats=caller.stats.as_dict(caller.config.price_per_million_tokens),
        notes="DCScore x100 = mean over valid captions of (F1 + F1 relevant) / 2; components x100; "
        "invalid: captions with no fact or no relevant fact, left out of the means as the official scorer "
        "does (degenerate_captions: zero scores them 0 instead)",
    )


PROTOCOL = Protocol(
    name="dcscore", benchmark="decapbench", title="DCScore (DeCapBench).", section=DCScoreSection,
    read=lambda section: read_decapbench(section.annotations), run=run_dcscore,
    official_prompts=lambda o: None if o.decapbench is None else load_decapbench_prompts(o.decapbench),
    official_options=OFFICIAL_OPTIONS,
)  # fmt: skip
