"""What the judge is asked to return, per kind of call, and the JSON schema sent as `response_format`.

The verdict judge makes four kinds of call:
- ``verdict`` (joint mode, the paper): caption assertions, reference assertions and the linguistic
  scores, turned into a :class:`~balcaprl.rewards.Verdict` by :func:`to_verdict`.
- ``reference_assertions`` (cached-reference mode, once per reference): the reference split into
  assertions, :class:`ReferenceAssertions`.
- ``coverage`` (cached-reference mode, once per rollout): caption assertions, the linguistic scores and
  one coverage mark per *given* reference assertion; assembled into a ``Verdict`` by
  :func:`assemble_verdict`.
- ``coverage_missing``: the follow-up to a coverage answer that left some numbers unmarked; it asks
  for those numbers only (:class:`CoverageMarks`), and the marks are merged into the first answer.

The field descriptions are part of what the judge reads, so each verdict rubric has its own wire
schema (:func:`verdict_schema`, :func:`coverage_schema`): the training rubric's `pointable` is the
strict point-at-it test, the evaluation rubric's also passes evidence-based inferences, and the
"w/o pointability" rubric asks for no `pointable` at all. Their ``response_format`` names differ
(``balcaprl_verdict_training``, ``balcaprl_coverage_evaluation``, ...: :func:`judge_call_kind`).

:func:`json_response_format` builds the ``response_format`` of every structured call (these and the
evaluation protocols' own schemas), named ``balcaprl_<kind>``. The wire schema is the portable subset
of JSON schema that strict structured outputs accept everywhere (OpenAI, vLLM/xgrammar, SGLang): every
field required, no extra properties, and no length or numeric bounds (some servers reject them). The
bounds still hold: every answer is validated locally with pydantic, and a violation is a
``schema_violation`` after one re-ask -- except the length bounds below, whose violation is an
``oversized_answer`` at once (a judge that writes 10,000 assertions or an essay of an explanation is
not asked to write it again).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Annotated, Any, Literal, TypeVar, get_args

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, create_model

from balcaprl.judge.rubrics import VERDICT_RUBRICS
from balcaprl.rewards import ReferenceAssertion, Verdict
from balcaprl.rewards.verdict import LinguisticScore

CallKind = Literal["verdict", "reference_assertions", "coverage", "coverage_missing"]

# How big a verdict may be. A caption is cut at caption_char_cap (4,000 characters) and a detailed
# reference runs to a few hundred words: a few hundred atomic claims at most, each a short clause.
MAX_ASSERTIONS = 512  # per list: caption assertions, reference assertions, coverage marks
MAX_ASSERTION_CHARS = 1000
MAX_EXPLANATION_CHARS = 4000  # "one or two sentences" asked for
_Text = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=MAX_ASSERTION_CHARS)]
_T = TypeVar("_T")
_Many = Annotated[list[_T], Field(max_length=MAX_ASSERTIONS)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


# What the schema tells the judge about each field. Worded to agree with the rubric texts (a test
# holds both to the paper's rules and checks them for developer notation).
_CLAIM = "One atomic claim, saying what the text says."
_COVERED = "True when the caption states it, says it in other words, or lets a reader reasonably infer it."
_CAPTION_ASSERTIONS = (
    "Every atomic claim of the caption in order, commentary and opinions included; empty if it makes none."
)
_CLARITY = "How easily a reader understands the caption: 1 (very poor) to 10 (excellent)."
_FLUENCY = "How natural and correct the writing is: 1 (very poor) to 10 (excellent)."
_COHERENCY = "How well the parts fit together into one description: 1 (very poor) to 10 (excellent)."
_EXPLANATION = "One or two sentences giving the main reasons for the three scores."


@dataclass(frozen=True)
class _Wording:
    """A verdict rubric's descriptions of the two caption-assertion flags."""

    pointable: str | None  # None: this rubric does not ask about pointability
    visible: str


_WORDING: dict[str, _Wording] = {
    "training": _Wording(
        pointable="True when a person could point at what the claim talks about in the image.",
        visible="True when the claim is actually so in this image; false for a hallucination.",
    ),
    "evaluation": _Wording(
        pointable="True when a person could point at what the claim talks about, or at visible clues "
        "from which everyday knowledge soundly draws it.",
        visible="True when the claim holds for this image, directly or through clear clues; false "
        "when it is invented, wrong or only faintly supported.",
    ),
    "training_without_pointability": _Wording(
        pointable=None,
        visible="True when the claim is actually so in this image; false for a hallucination.",
    ),
}
assert set(_WORDING) == set(VERDICT_RUBRICS)


# The models' docstrings are sent too (as JSON schema descriptions): they are written for the judge.


class ReferenceText(_Strict):
    """One claim of the reference."""

    text: _Text = Field(description=_CLAIM)


class ReferenceAssertions(_Strict):
    """The reference, split into atomic claims."""

    reference_assertions: _Many[ReferenceText] = Field(
        min_length=1, description="Every atomic claim of the reference, in order (never empty)."
    )


class _ReferenceMark(_Strict):
    """One claim of the reference, and whether the caption covers it."""

    text: _Text = Field(description=_CLAIM)
    covered: bool = Field(description=_COVERED)


class CoverageMark(_Strict):
    """Whether the caption covers the reference claim with this number."""

    id: int = Field(description="The number of the reference assertion, as listed.")
    covered: bool = Field(description=_COVERED)


class CoverageMarks(_Strict):
    """Coverage marks for the numbers the follow-up lists, and only those."""

    reference_coverage: _Many[CoverageMark] = Field(
        description="One mark for each reference assertion number the follow-up lists."
    )


def _linguistic_fields() -> dict[str, Any]:
    return {
        "clarity": (LinguisticScore, Field(description=_CLARITY)),
        "fluency": (LinguisticScore, Field(description=_FLUENCY)),
        "coherency": (LinguisticScore, Field(description=_COHERENCY)),
        "explanation": (str, Field(max_length=MAX_EXPLANATION_CHARS, description=_EXPLANATION)),
    }


def _known(rubric: str) -> _Wording:
    if rubric not in _WORDING:
        raise ValueError(f"unknown verdict rubric {rubric!r}; choose one of {', '.join(VERDICT_RUBRICS)}")
    return _WORDING[rubric]


def _camel(rubric: str) -> str:
    return "".join(word.capitalize() for word in rubric.split("_"))


@cache
def _caption_assertion_schema(rubric: str) -> type[BaseModel]:
    wording = _known(rubric)
    fields: dict[str, Any] = {"text": (_Text, Field(description=_CLAIM))}
    if wording.pointable is not None:
        fields["pointable"] = (bool, Field(description=wording.pointable))
    fields["visible"] = (bool, Field(description=wording.visible))
    return create_model(f"{_camel(rubric)}CaptionAssertion", __base__=_Strict, **fields)


@cache
def verdict_schema(rubric: str) -> type[BaseModel]:
    """The joint-mode answer a verdict rubric asks for (its field descriptions follow the rubric)."""
    return create_model(
        f"{_camel(rubric)}Verdict",
        __base__=_Strict,
        caption_assertions=(
            _Many[_caption_assertion_schema(rubric)],  # type: ignore[misc]
            Field(description=_CAPTION_ASSERTIONS),
        ),
        reference_assertions=(
            _Many[_ReferenceMark],
            Field(min_length=1, description="Every atomic claim of the reference in order, each marked."),
        ),
        **_linguistic_fields(),
    )


@cache
def coverage_schema(rubric: str) -> type[BaseModel]:
    """The cached-reference answer a verdict rubric asks for: like :func:`verdict_schema`, but one
    coverage mark per numbered reference assertion instead of the reference's own split."""
    return create_model(
        f"{_camel(rubric)}Coverage",
        __base__=_Strict,
        caption_assertions=(
            _Many[_caption_assertion_schema(rubric)],  # type: ignore[misc]
            Field(description=_CAPTION_ASSERTIONS),
        ),
        reference_coverage=(
            _Many[CoverageMark],
            Field(description="One mark for every numbered reference assertion, in order."),
        ),
        **_linguistic_fields(),
    )


def judge_call_kind(call: CallKind, rubric: str | None = None) -> str:
    """The kind (and so the ``response_format`` name) of a verdict-judge call: ``verdict_training``,
    ``coverage_evaluation``, ... for calls whose schema follows the rubric, else the call itself."""
    if call in ("verdict", "coverage"):
        _known(rubric or "")
        return f"{call}_{rubric}"
    return call


# kind -> (call, rubric): every verdict-judge call kind, for servers that answer them (the loopback
# judge server). The bare "verdict" and "coverage" stand for calls that name their rubric only in the
# system message.
JUDGE_CALL_KINDS: dict[str, tuple[CallKind, str | None]] = {
    **{call: (call, None) for call in get_args(CallKind)},
    **{judge_call_kind(c, r): (c, r) for c in ("verdict", "coverage") for r in VERDICT_RUBRICS},
}


def _as_verdict(data: dict[str, Any]) -> Verdict:
    # A rubric that does not judge pointability admits every claim (see VERDICT_RUBRICS).
    data["caption_assertions"] = [{"pointable": True, **a} for a in data["caption_assertions"]]
    return Verdict.model_validate(data)


def to_verdict(answer: BaseModel, data: dict[str, Any] | None = None) -> Verdict:
    """The :class:`~balcaprl.rewards.Verdict` of a joint-mode answer of any verdict rubric. ``data``:
    the JSON object ``answer`` was validated from, when the caller has it (a cached answer), which
    spares dumping the answer again (every field the verdict keeps is the same in both)."""
    return _as_verdict(answer.model_dump(mode="json") if data is None else dict(data))


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


def strict_json_schema(schema: type[BaseModel]) -> dict[str, Any]:
    """``schema``'s JSON schema as OpenAI's strict structured outputs want it -- every object closed
    (``additionalProperties: false``) with all its properties required, ``null`` defaults dropped,
    a ``$ref`` with other keys beside it inlined, a one-entry ``allOf`` unwrapped -- the rules the
    openai SDK applies (a test compares the two on every schema the package sends), without importing
    the SDK on the judge's path."""
    root = schema.model_json_schema()

    def strict(node: dict[str, Any]) -> dict[str, Any]:
        for key in ("$defs", "definitions"):
            for sub in (node.get(key) or {}).values():
                strict(sub)
        if node.get("type") == "object" and "additionalProperties" not in node:
            node["additionalProperties"] = False
        if isinstance(node.get("properties"), dict):
            node["required"] = list(node["properties"])
            node["properties"] = {k: strict(v) for k, v in node["properties"].items()}
        if isinstance(node.get("items"), dict):
            node["items"] = strict(node["items"])
        if isinstance(node.get("anyOf"), list):
            node["anyOf"] = [strict(v) for v in node["anyOf"]]
        if isinstance(node.get("allOf"), list):
            if len(node["allOf"]) == 1:
                node.update(strict(node.pop("allOf")[0]))
            else:
                node["allOf"] = [strict(v) for v in node["allOf"]]
        if "default" in node and node["default"] is None:
            del node["default"]
        ref = node.get("$ref")
        if ref and len(node) > 1:
            resolved: Any = root
            for part in ref.removeprefix("#/").split("/"):
                resolved = resolved[part]
            node.update({**resolved, **node})
            del node["$ref"]
            return strict(node)
        return node

    return strict(root)


@cache
def json_response_format(schema: type[BaseModel], kind: str) -> dict[str, Any]:
    """The strict json_schema ``response_format`` of ``schema``, named :func:`schema_name` (kind).

    Cached: generating the schema costs milliseconds, and the judge makes thousands of calls a step.
    Treat the returned dict as read-only.
    """
    body = _portable(strict_json_schema(schema))
    return {"type": "json_schema", "json_schema": {"name": schema_name(kind), "schema": body, "strict": True}}


@cache
def schema_digest(schema: type[BaseModel], kind: str) -> str:
    """A short hash of what :func:`json_response_format` sends (name included), for cache keys: a
    changed schema never reuses answers given under the old one."""
    text = json.dumps(json_response_format(schema, kind), sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def check_coverage(coverage: Any, n_reference_assertions: int, *, partial: bool = False) -> None:
    """Raises ``ValueError`` unless the marks are the ids 1..M, one each (a schema violation: a mark
    for an unknown or repeated number would silently change the recall denominator). ``partial``:
    ids may also be missing (they are asked for again: :func:`missing_ids`), never unknown or repeated."""
    ids = [mark.id for mark in coverage.reference_coverage]
    wanted = set(range(1, n_reference_assertions + 1))
    if len(set(ids)) != len(ids) or not set(ids) <= wanted or (not partial and set(ids) != wanted):
        which = "may only mark ids among" if partial else "must mark each of the ids"
        raise ValueError(
            f"reference_coverage {which} 1..{n_reference_assertions}, each exactly once, got ids {ids}"
        )


def missing_ids(coverage: Any, n_reference_assertions: int) -> list[int]:
    """The reference assertion numbers 1..M that a coverage answer left unmarked, in order."""
    marked = {mark.id for mark in coverage.reference_coverage}
    return [i for i in range(1, n_reference_assertions + 1) if i not in marked]


def assemble_verdict(
    coverage: Any, reference_assertions: Sequence[str], extra_marks: Mapping[int, bool] | None = None
) -> Verdict:
    """A full verdict from a coverage answer (of any verdict rubric's :func:`coverage_schema`), the
    fixed reference list it marked, and the marks a follow-up gave for numbers it had left out
    (``ValueError`` unless together they mark every number exactly once)."""
    covered = {mark.id: mark.covered for mark in coverage.reference_coverage}
    for i, mark in (extra_marks or {}).items():
        if i in covered:
            raise ValueError(f"reference assertion {i} is marked twice (answer and follow-up)")
        covered[i] = mark
    if sorted(covered) != list(range(1, len(reference_assertions) + 1)):
        raise ValueError(
            f"reference_coverage must mark each of the ids 1..{len(reference_assertions)} exactly once, "
            f"got ids {sorted(covered)}"
        )
    data = coverage.model_dump(mode="json", exclude={"reference_coverage"})
    data["reference_assertions"] = [
        ReferenceAssertion(text=text, covered=covered[i]).model_dump()
        for i, text in enumerate(reference_assertions, 1)
    ]
    return _as_verdict(data)
