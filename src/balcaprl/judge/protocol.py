"""The `Judge` interface: what every judge (OpenAI-compatible client, synthetic oracle, scripted test
judge) implements, and what trainers and evaluators call. Kept tiny on purpose.

A request yields exactly one outcome: a `Judgement` (a validated verdict and its reward vector) or a
`JudgeFailure` with a reason. A failure becomes NaN in the reward tensor, never 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

from balcaprl.rewards import RewardVector, Verdict

__all__ = ["FailureReason", "Judge", "JudgeFailure", "JudgeOutcome", "JudgeRequest", "Judgement", "Rubric"]

Rubric = Literal["training", "evaluation"]
FailureReason = Literal[
    "timeout",
    "rate_limited",
    "server_error",
    "invalid_json",
    "schema_violation",
    "refused",
    "truncated_output",
    "bad_input",
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
    """A successful outcome: the validated verdict and the rewards scored from it."""

    verdict: Verdict
    rewards: RewardVector
    truncated_input: bool = False  # the caption was cut to the configured character cap


@dataclass(frozen=True)
class JudgeFailure:
    """A failed outcome; ``detail`` is for logs and never contains secrets."""

    reason: FailureReason
    detail: str = ""


JudgeOutcome = Judgement | JudgeFailure


@runtime_checkable
class Judge(Protocol):
    """Anything that turns requests into outcomes, one outcome per request, in order."""

    async def judge_batch(self, requests: Sequence[JudgeRequest]) -> list[JudgeOutcome]: ...
