"""What the judge is asked to return, per kind of call, and the JSON schema sent as `response_format`.

The verdict judge makes three kinds of call:
- ``verdict`` (joint mode, the paper): the full :class:`~balcaprl.rewards.Verdict`.
- ``reference_assertions`` (cached-reference mode, once per (image, reference)): the reference split
  into assertions, :class:`ReferenceAssertions`.
- ``coverage`` (cached-reference mode, once per rollout): caption assertions, the linguistic scores and
  one coverage mark per *given* reference assertion, :class:`CoverageVerdict`; assembled into a
  full ``Verdict`` by :func:`assemble_verdict`.

:func:`json_response_format` builds the ``response_format`` of every structured call (these three
and the evaluation protocols' own schemas), named ``balcaprl_<kind>``. The wire schema is the
portable subset of JSON schema that strict structured outputs accept everywhere (OpenAI,
vLLM/xgrammar, SGLang): every field required, no extra properties, and no length or numeric bounds
(some servers reject them). The bounds still hold: every answer is validated locally with pydantic,
and a violation is a ``schema_violation`` after one re-ask.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from functools import cache
from typing import Annotated, Any, Literal, get_args

from openai.lib._parsing import type_to_response_format_param
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from balcaprl.rewards import CaptionAssertion, ReferenceAssertion, Verdict
from balcaprl.rewards.verdict import LinguisticScore

__all__ = [
    "CALL_KINDS",
    "CallKind",
    "CoverageMark",
    "CoverageVerdict",
    "ReferenceAssertions",
    "ReferenceText",
    "assemble_verdict",
    "check_coverage",
    "json_response_format",
    "schema_digest",
    "schema_name",
]

CallKind = Literal["verdict", "reference_assertions", "coverage"]
_Text = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class ReferenceText(_Strict):
    """One reference assertion, not yet judged."""

    text: _Text = Field(description="The atomic claim, in a few words.")


class ReferenceAssertions(_Strict):
    """The reference split into atomic assertions (cached-reference mode)."""

    reference_assertions: list[ReferenceText] = Field(
        min_length=1, description="Every atomic assertion of the reference, in order (never empty)."
    )


class CoverageMark(_Strict):
    """Whether the caption covers the given reference assertion number ``id`` (1-based)."""

    id: int = Field(description="The number of the reference assertion, as listed.")
    covered: bool = Field(description="The caption states it or clearly implies it.")


class CoverageVerdict(_Strict):
    """A rollout's answer in cached-reference mode: like a verdict, but coverage of a fixed list."""

    caption_assertions: list[CaptionAssertion] = Field(
        description="Every atomic assertion of the caption, meta-commentary included (may be empty)."
    )
    reference_coverage: list[CoverageMark] = Field(
        description="Exactly one mark per numbered reference assertion, in order."
    )
    clarity: LinguisticScore = Field(description="Readability and absence of ambiguity, 1..10.")
    fluency: LinguisticScore = Field(description="Grammar and natural phrasing, 1..10.")
    coherency: LinguisticScore = Field(description="Logical flow and unified structure, 1..10.")
    explanation: str = Field(description="A short reason for the three linguistic scores.")


CALL_KINDS: tuple[CallKind, ...] = get_args(CallKind)
_UNPORTABLE = {"minLength", "maxLength", "minimum", "maximum", "minItems", "maxItems", "title"}


def schema_name(kind: str) -> str:
    """The ``response_format`` name of a structured call of ``kind``: ``balcaprl_<kind>``. Servers may
    log it; the loopback judge server reads it to tell the verdict judge's calls apart."""
    return f"balcaprl_{kind}"


def _portable(node: Any) -> Any:
    if isinstance(node, dict):
        # Keep keys that are property *names* (inside "properties") even if they match a keyword.
        return {
            k: (
                {name: _portable(sub) for name, sub in v.items()}
                if k in ("properties", "$defs")
                else _portable(v)
            )
            for k, v in node.items()
            if k not in _UNPORTABLE
        }
    if isinstance(node, list):
        return [_portable(v) for v in node]
    return node


@cache
def json_response_format(schema: type[BaseModel], kind: str) -> dict[str, Any]:
    """The strict json_schema ``response_format`` of ``schema``, named :func:`schema_name` (kind).

    Cached: generating the schema costs milliseconds, and the judge makes thousands of calls a step.
    Treat the returned dict as read-only.
    """
    param = type_to_response_format_param(schema)
    body = _portable(param["json_schema"]["schema"])  # type: ignore[index]
    return {"type": "json_schema", "json_schema": {"name": schema_name(kind), "schema": body, "strict": True}}


@cache
def schema_digest(schema: type[BaseModel], kind: str) -> str:
    """A short hash of what :func:`json_response_format` sends (name included), for cache keys: a
    changed schema never reuses answers given under the old one."""
    text = json.dumps(json_response_format(schema, kind), sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def check_coverage(coverage: CoverageVerdict, n_reference_assertions: int) -> None:
    """Raises ``ValueError`` unless the marks are exactly the ids 1..M, one each (a schema violation:
    a mark for a missing or repeated number would silently change the recall denominator)."""
    ids = [mark.id for mark in coverage.reference_coverage]
    if sorted(ids) != list(range(1, n_reference_assertions + 1)):
        raise ValueError(
            f"reference_coverage must mark each of the ids 1..{n_reference_assertions} exactly once, "
            f"got ids {ids}"
        )


def assemble_verdict(coverage: CoverageVerdict, reference_assertions: Sequence[str]) -> Verdict:
    """A full verdict from a coverage answer and the fixed reference list it marked
    (``ValueError`` as :func:`check_coverage` says)."""
    check_coverage(coverage, len(reference_assertions))
    covered = {mark.id: mark.covered for mark in coverage.reference_coverage}
    return Verdict(
        caption_assertions=list(coverage.caption_assertions),
        reference_assertions=[
            ReferenceAssertion(text=text, covered=covered[i])
            for i, text in enumerate(reference_assertions, 1)
        ],
        clarity=coverage.clarity,
        fluency=coverage.fluency,
        coherency=coverage.coherency,
        explanation=coverage.explanation,
    )
