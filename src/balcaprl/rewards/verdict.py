"""The verdict a judge returns for one (image, caption, reference) triple.

The schema is part of the pinned public contract (see docs/method.md). It is richer than the paper's
single ``is_verified`` flag: keeping ``pointable`` and ``visible`` apart lets every log tell
meta-commentary (not pointable) from hallucination (pointable but not visible), while ``pointable and
visible`` is exactly the paper's true-positive set A+ = A_G ∩ A_P (eq. 2.3).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

AssertionText = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)]
# Linguistic scores are integers on the paper's 1..10 scale; 8.5 or "8" is a schema violation.
LinguisticScore = Annotated[int, Field(ge=1, le=10, strict=True)]


class VerdictError(ValueError):
    """A verdict that breaks the schema; the message names the offending field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class CaptionAssertion(_Strict):
    """One atomic assertion of the policy's caption (an element of A)."""

    text: AssertionText = Field(description="The atomic claim, in a few words.")
    pointable: bool = Field(description="A person could physically point at it in the image (A_P).")
    visible: bool = Field(description="It is actually true in the image (A_G); false for hallucinations.")


class ReferenceAssertion(_Strict):
    """One atomic assertion of the reference caption (an element of O)."""

    text: AssertionText = Field(description="The atomic claim, in a few words.")
    covered: bool = Field(description="The caption states it or clearly implies it (an element of Q).")


class Verdict(_Strict):
    """A judge's full answer: both decompositions and the three linguistic scores."""

    caption_assertions: list[CaptionAssertion] = Field(
        description="Every atomic assertion of the caption, meta-commentary included (may be empty)."
    )
    reference_assertions: list[ReferenceAssertion] = Field(
        min_length=1, description="Every atomic assertion of the reference caption (never empty)."
    )
    clarity: LinguisticScore = Field(description="Readability and absence of ambiguity, 1..10.")
    fluency: LinguisticScore = Field(description="Grammar and natural phrasing, 1..10.")
    coherency: LinguisticScore = Field(description="Logical flow and unified structure, 1..10.")
    explanation: str = Field(description="A short reason for the three linguistic scores.")


def _describe(error: ValidationError) -> str:
    parts = []
    for item in error.errors():
        where = ".".join(str(p) for p in item["loc"]) or "<verdict>"
        parts.append(f"{where}: {item['msg']}")
    return "; ".join(parts)


def parse_verdict(verdict: Verdict | dict[str, Any]) -> Verdict:
    """Validate a verdict given as a dict (e.g. parsed judge JSON) or pass a model through.

    Raises :class:`VerdictError` naming every offending field, e.g.
    ``reference_assertions.0.covered: Input should be a valid boolean``.
    """
    if isinstance(verdict, Verdict):
        return verdict
    if not isinstance(verdict, dict):
        raise VerdictError(f"a verdict must be a JSON object (dict), got {type(verdict).__name__}")
    try:
        return Verdict.model_validate(verdict)
    except ValidationError as error:
        raise VerdictError(f"invalid verdict: {_describe(error)}") from None
