"""The `Judge` interface: what every judge (OpenAI-compatible client, synthetic oracle, scripted test
judge) implements, and what trainers and evaluators call. Kept tiny on purpose.

A request yields exactly one outcome: a `Judgement` (a validated verdict) or a `JudgeFailure` with a
reason. The consumer scores a verdict with ``balcaprl.rewards.score_rollout`` and its own reward
configuration; a failure becomes NaN in the reward tensor, never 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

from balcaprl.files import unicode_refusal
from balcaprl.judge.rubrics import VerdictRubric
from balcaprl.rewards import Verdict

Rubric = VerdictRubric  # "training", "evaluation" or "training_without_pointability"
FailureReason = Literal[
    "timeout",
    "rate_limited",
    "server_error",
    "invalid_json",
    "schema_violation",
    "refused",
    "truncated_output",
    "bad_input",
    "oversized_answer",  # past a bound on what an answer may be: bytes, decompressed bytes, lengths
]


@dataclass(frozen=True)
class JudgeRequest:
    """One (image, caption, reference) triple to judge.

    ``image`` is a path to an image file or its encoded bytes (PNG/JPEG).
    """

    image: Path | str | bytes
    caption: str
    reference: str
    rubric: Rubric = "training"


@dataclass(frozen=True)
class Judgement:
    """A successful outcome: the validated verdict. Rewards are scored from it by whoever consumes it
    (a trainer with its reward configuration, an evaluation with the metric's), never here."""

    verdict: Verdict
    truncated_input: bool = False  # the caption was cut to the configured character cap


@dataclass(frozen=True)
class JudgeFailure:
    """A failed outcome; ``detail`` is for logs and never contains secrets."""

    reason: FailureReason
    detail: str = ""


JudgeOutcome = Judgement | JudgeFailure


@dataclass(frozen=True)
class SendableRequests:
    """A batch split into the requests that can be sent and a ``bad_input`` failure for each one
    that cannot (by its position in the batch); :meth:`outcomes` puts the two back in order."""

    sent: list[JudgeRequest]
    refused: dict[int, JudgeFailure]

    def outcomes(self, judged: Sequence[JudgeOutcome]) -> list[JudgeOutcome]:
        """The batch's outcomes, in order: ``judged`` (one per sent request) around the refusals."""
        if len(judged) != len(self.sent):
            raise ValueError(f"{len(judged)} outcomes for {len(self.sent)} sent requests")
        rest = iter(judged)
        return [
            self.refused[i] if i in self.refused else next(rest)
            for i in range(len(self.sent) + len(self.refused))
        ]


def sendable_requests(requests: Sequence[JudgeRequest], where: Sequence[str]) -> SendableRequests:
    """``requests`` less those whose image name, caption or reference is not valid Unicode (a lone
    surrogate), each refused as ``bad_input`` naming what and ``where[i]`` (``row 'r7'``): such a text
    is never sent, so no judge scores it as cleaned (:func:`~balcaprl.files.unicode_refusal`)."""
    sent, refused = [], {}
    for i, (request, place) in enumerate(zip(requests, where, strict=True)):
        name = str(request.image) if isinstance(request.image, str | Path) else ""  # bytes have no name
        texts = [("image name", name), ("caption", request.caption), ("reference", request.reference)]
        reason = unicode_refusal(texts, place)
        if reason is None:
            sent.append(request)
        else:
            refused[i] = JudgeFailure("bad_input", reason)
    return SendableRequests(sent, refused)


@runtime_checkable
class Judge(Protocol):
    """Anything that turns requests into outcomes, one outcome per request, in order."""

    async def judge_batch(self, requests: Sequence[JudgeRequest]) -> list[JudgeOutcome]: ...


@runtime_checkable
class SupportsDeadline(Protocol):
    """Optional extension: a judge told when a trainer wants its step's rewards. A trainer waits for
    the last one, so a judge that knows the deadline can spend its tail control (duplicate requests)
    on the calls that would answer after it. Called on the judge's event loop; None: no step waits."""

    def rewards_wanted_at(self, when: float | None) -> None: ...


@runtime_checkable
class SupportsFixedReference(Protocol):
    """Optional extension for judges served behind `balcaprl judge serve` in cached-reference mode.

    A judge that implements it decomposes a reference once and then marks coverage of that fixed
    list; a judge that does not is served through ``judge_batch`` alone (the server takes the
    judge's own reference assertions as the decomposition and matches coverage by position/text).
    """

    async def decompose_references(self, requests: Sequence[JudgeRequest]) -> list[list[str] | JudgeFailure]:
        """Each request's reference split into assertion texts (the caption is ignored)."""
        ...

    async def judge_against_fixed_reference(
        self, requests: Sequence[JudgeRequest], reference_assertions: Sequence[Sequence[str]]
    ) -> list[JudgeOutcome]:
        """Like ``judge_batch``, but the verdict's reference assertions are exactly the given texts."""
        ...
