"""A judge that makes mistakes at a known rate: another judge's verdicts with flags flipped.

Each ``pointable`` and ``visible`` flag of a caption assertion and each ``covered`` flag of a
reference assertion is flipped independently with probability ``rate``; the texts and the linguistic
scores are left alone. Served in front of the synthetic oracle (``balcaprl judge serve --oracle DIR
--flip-rate 0.1``) it is a judge whose true error rate per flag is known, which is what the judge
audit must recover.

The flips are seeded per request: the random stream of a request is a hash of the seed, the
request's rubric, caption and reference, and how many times this judge has seen that request
before. So the same judge asked twice answers differently (as a sampling judge does: the audit's
test-retest noise is not zero), while the n-th answer to a request is the same whatever the order
in which concurrent requests arrive.
"""

from __future__ import annotations

import hashlib
import random
import threading
from collections import Counter
from collections.abc import Sequence

from balcaprl.judge.protocol import Judge, Judgement, JudgeOutcome, JudgeRequest
from balcaprl.rewards import Verdict
from balcaprl.rewards.verdict import CaptionAssertion, ReferenceAssertion


class FlippingJudge:
    """``judge``'s verdicts with each flag flipped with probability ``rate`` (seeded by ``seed``)."""

    def __init__(self, judge: Judge, rate: float, seed: int = 0):
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"flip rate must be in [0, 1], got {rate}")
        self.judge, self.rate, self.seed = judge, rate, seed
        self._seen: Counter[bytes] = Counter()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"FlippingJudge({self.judge!r}, rate={self.rate}, seed={self.seed})"

    async def judge_batch(self, requests: Sequence[JudgeRequest]) -> list[JudgeOutcome]:
        outcomes = await self.judge.judge_batch(requests)
        return [self.flip(request, outcome) for request, outcome in zip(requests, outcomes, strict=True)]

    def _stream(self, request: JudgeRequest) -> random.Random:
        key = hashlib.sha256(
            "\0".join((str(self.seed), request.rubric, request.caption, request.reference)).encode()
        ).digest()
        with self._lock:
            nth = self._seen[key]
            self._seen[key] += 1
        return random.Random(int.from_bytes(hashlib.sha256(key + nth.to_bytes(8, "big")).digest()[:8], "big"))

    def flip(self, request: JudgeRequest, outcome: JudgeOutcome) -> JudgeOutcome:
        """The outcome with its flags flipped (a failure passes through unchanged)."""
        if not isinstance(outcome, Judgement):
            return outcome
        rng, rate = self._stream(request), self.rate
        v = outcome.verdict
        # model_construct: the texts and scores are the served judge's, already validated; only
        # booleans change, so validating again would only cost time.
        verdict = Verdict.model_construct(
            caption_assertions=[
                CaptionAssertion.model_construct(
                    text=a.text,
                    pointable=a.pointable ^ (rng.random() < rate),
                    visible=a.visible ^ (rng.random() < rate),
                )  # fmt: skip
                for a in v.caption_assertions
            ],
            reference_assertions=[
                ReferenceAssertion.model_construct(text=a.text, covered=a.covered ^ (rng.random() < rate))
                for a in v.reference_assertions
            ],
            clarity=v.clarity,
            fluency=v.fluency,
            coherency=v.coherency,
            explanation=v.explanation,
        )
        return Judgement(verdict=verdict, truncated_input=outcome.truncated_input)
