"""A deterministic rule-based judge for tests and benchmarks (not a judge of real captions).

It reads no pixels: the reference stands in for the image. Rules, simple enough to compute by hand:
- A text splits into clauses at ``.``, ``;``, ``,``, newlines and the word "and"; each clause is one
  assertion, lower-cased and stripped.
- A caption assertion is ``pointable`` unless it contains a commentary word (``COMMENTARY_WORDS``:
  atmosphere, depth, inviting, ...), and ``visible`` when all its content words (``STOP_WORDS``
  removed) occur in the reference.
- A reference assertion is ``covered`` when all its content words occur in the caption.
- clarity, fluency, coherency are fixed by the constructor (default 8, 9, 7 -> linguistic 21/27).
- Under the ``training_without_pointability`` rubric (the ablation's prompt asks nothing about
  pointability) every caption assertion is marked pointable; the two other rubrics are judged alike.

``reference_jitter`` simulates an LLM that does not split the same reference identically every time:
with that probability each pair of neighbouring reference clauses is merged into one, with a random
generator seeded by (caption, reference) in :meth:`judge_batch` (so rollouts of one prompt may see
different denominators, as in joint mode) and by the reference alone in :meth:`decompose_references`
(one decomposition per reference, as in cached-reference mode). The size of the effect is a free
parameter of this simulation, not a measurement of any real judge.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import re
from collections.abc import Sequence

from balcaprl.judge.outcomes import judgement_from_verdict
from balcaprl.judge.protocol import JudgeFailure, JudgeOutcome, JudgeRequest
from balcaprl.rewards import CaptionAssertion, ReferenceAssertion, Verdict

STOP_WORDS = frozenset(
    [
        "a",
        "an",
        "the",
        "is",
        "are",
        "was",
        "were",
        "be",
        "of",
        "on",
        "in",
        "at",
        "to",
        "with",
        "and",
        "or",
        "its",
        "it",
        "this",
        "that",
        "there",
        "their",
        "by",
        "for",
        "from",
        "as",
        "has",
        "have",
        "his",
        "her",
    ]
)
COMMENTARY_WORDS = frozenset(
    [
        "atmosphere",
        "depth",
        "inviting",
        "viewer",
        "mood",
        "feel",
        "feels",
        "feeling",
        "beautiful",
        "beautifully",
        "nicely",
        "composition",
        "evokes",
        "sense",
        "cozy",
        "striking",
    ]
)
_SPLIT = re.compile(r"[.;,\n]+|\band\b")
_WORD = re.compile(r"[a-z0-9]+")


def clauses(text: str) -> list[str]:
    """The scripted judge's atomic assertions of ``text``."""
    return [c.strip().lower() for c in _SPLIT.split(text) if c and c.strip(" \t.;,")]


def content_words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if w not in STOP_WORDS}


def _rng(*parts: str) -> random.Random:
    return random.Random(hashlib.sha256("\0".join(parts).encode("utf-8")).digest())


class ScriptedJudge:
    """Deterministic :class:`~balcaprl.judge.protocol.Judge` (and ``SupportsFixedReference``)."""

    def __init__(
        self,
        *,
        latency_s: float = 0.0,
        clarity: int = 8,
        fluency: int = 9,
        coherency: int = 7,
        reference_jitter: float = 0.0,
    ):
        self.latency_s = latency_s
        self.scores = (clarity, fluency, coherency)
        self.reference_jitter = reference_jitter
        self.requests_seen = 0

    def _split_reference(self, reference: str, *seed: str) -> list[str]:
        parts = clauses(reference)
        if self.reference_jitter <= 0 or len(parts) < 2:
            return parts
        rng = _rng(*seed)  # seeded only when used: a sha256 and a seed per call add up on the server
        merged = [parts[0]]
        for part in parts[1:]:
            if rng.random() < self.reference_jitter:
                merged[-1] = f"{merged[-1]} and {part}"
            else:
                merged.append(part)
        return merged

    def _verdict(
        self, caption: str, reference: str, reference_texts: Sequence[str], rubric: str = "training"
    ) -> Verdict:
        reference_words = content_words(reference)
        caption_words = content_words(caption)
        judged = rubric != "training_without_pointability"
        caption_assertions = [
            CaptionAssertion(
                text=c,
                pointable=not (judged and words & COMMENTARY_WORDS),
                visible=words <= reference_words,
            )
            for c in clauses(caption)
            for words in [content_words(c)]
        ]
        reference_assertions = [
            ReferenceAssertion(text=r, covered=content_words(r) <= caption_words) for r in reference_texts
        ]
        clarity, fluency, coherency = self.scores
        return Verdict(
            caption_assertions=caption_assertions,
            reference_assertions=reference_assertions,
            clarity=clarity,
            fluency=fluency,
            coherency=coherency,
            explanation="scripted judge: fixed scores",
        )

    async def _wait(self, n: int) -> None:
        self.requests_seen += n
        if self.latency_s > 0:
            await asyncio.sleep(self.latency_s)

    async def judge_batch(self, requests: Sequence[JudgeRequest]) -> list[JudgeOutcome]:
        await self._wait(len(requests))
        outcomes: list[JudgeOutcome] = []
        for r in requests:
            texts = self._split_reference(r.reference, r.caption, r.reference)
            if not texts:
                outcomes.append(JudgeFailure("bad_input", "the reference has no assertion"))
                continue
            outcomes.append(judgement_from_verdict(self._verdict(r.caption, r.reference, texts, r.rubric)))
        return outcomes

    async def decompose_references(self, requests: Sequence[JudgeRequest]) -> list[list[str] | JudgeFailure]:
        await self._wait(len(requests))
        out: list[list[str] | JudgeFailure] = []
        for r in requests:
            texts = self._split_reference(r.reference, r.reference)
            out.append(texts if texts else JudgeFailure("bad_input", "the reference has no assertion"))
        return out

    async def judge_against_fixed_reference(
        self, requests: Sequence[JudgeRequest], reference_assertions: Sequence[Sequence[str]]
    ) -> list[JudgeOutcome]:
        await self._wait(len(requests))
        return [
            judgement_from_verdict(self._verdict(r.caption, " . ".join(texts), texts, r.rubric))
            for r, texts in zip(requests, reference_assertions, strict=True)
        ]
