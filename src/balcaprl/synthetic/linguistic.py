"""Clarity, fluency and coherency (1..10) from measurable properties of a parsed caption.

The paper's judge rubric (Appendix, training prompt) names what to penalise; here each item is a
count the parser already made, so the scores are deterministic and explainable:

- clarity: overloaded sentences, an overloaded caption (far longer than the image's content needs),
  repeated assertions, fragments nobody can parse, sentences that say nothing;
- fluency: list-of-facts style, run-ons, agreement errors (a/an, number), robotic repeated openers,
  repeated sentences, stutters ("the the"), unparsable words;
- coherency: list style, repetition, run-ons, an overloaded caption, unparsable fragments,
  sentences that say nothing.

An overloaded caption is one longer than :func:`word_budget` words: what a complete, unhurried
description of that many shapes needs (every reference stays within it). The paper's clarity rule
asks the judge to penalise unnecessary detail and overloaded captions; the judge sees the image, so
it knows how much there is to say.

Meta-commentary and hallucinations are *not* penalised here: they can be perfectly fluent, which is
exactly why the paper needs pointability-aware precision as a separate reward.
"""

from __future__ import annotations

from dataclasses import dataclass

from balcaprl.synthetic.parser import ParsedCaption

LONG_SENTENCE = 25  # tokens; the reference generator's sentences stay under ~18
# Words a caption of n shapes may take before it reads as overloaded: what the re-captioner's complete
# description takes, an overview, the size spread and counts, and ~20 words per shape (its sentence
# plus a share of the relations); no reference exceeds it (a test, on the full world).
BUDGET_BASE, BUDGET_PER_SHAPE = 70, 20
OVERLOAD_WORDS = 10  # each this many words past the budget costs a clarity point


@dataclass(frozen=True)
class LinguisticScores:
    clarity: int
    fluency: int
    coherency: int
    explanation: str


def _overload(length: int) -> int:
    """0 for a sentence of normal length, rising to 4 for a 60+ token run-on."""
    return 0 if length <= LONG_SENTENCE else min(4, 1 + (length - LONG_SENTENCE) // 12)


def word_budget(scene_objects: int) -> int:
    """Words a caption of an image with ``scene_objects`` shapes may take without being overloaded."""
    return BUDGET_BASE + BUDGET_PER_SHAPE * scene_objects


def _caption_overload(parsed: ParsedCaption) -> int:
    """0 within the word budget, then 1 per ``OVERLOAD_WORDS`` words past it, up to 4."""
    if parsed.scene_objects <= 0:
        return 0  # no image to size the budget by
    excess = parsed.n_words - word_budget(parsed.scene_objects)
    return 0 if excess <= 0 else min(4, 1 + (excess - 1) // OVERLOAD_WORDS)


def _clamp(score: float) -> int:
    return int(max(1, min(10, round(score))))


def linguistic_scores(parsed: ParsedCaption) -> LinguisticScores:
    """Score a parsed caption; the explanation lists every problem that cost points."""
    if parsed.n_words == 0 or parsed.n_sentences == 0:
        return LinguisticScores(1, 1, 1, "empty caption")
    problems: list[str] = []
    unparsed = parsed.unparsed_words / parsed.n_words
    overload = min(4, sum(_overload(n) for n in parsed.sentence_lengths))
    is_list = parsed.list_markers >= 2
    and_chain = parsed.max_ands >= 3
    duplicates = min(4, parsed.duplicate_assertions)
    repeated_sentences = min(3.0, 1.5 * parsed.duplicate_sentences)
    agreement = min(6, 2 * parsed.agreement_errors)
    robotic = 2 if parsed.n_sentences >= 4 and parsed.repeated_openers / parsed.n_sentences > 0.5 else 0
    too_few = 3 if parsed.n_words < 4 else 0
    empty = round(6 * parsed.empty_sentences / parsed.n_sentences)
    stutter = min(4, 2 * parsed.stutters)
    verbose = _caption_overload(parsed)

    clarity = (
        10 - overload - (2 if and_chain else 0) - duplicates - min(8, round(10 * unparsed)) - too_few - empty
        - stutter // 2 - verbose
    )  # fmt: skip
    fluency = (
        10 - (4 if is_list else 0) - min(2, overload) - (1 if and_chain else 0) - agreement - robotic
        - repeated_sentences - min(8, round(12 * unparsed)) - too_few - stutter
    )  # fmt: skip
    coherency = (
        10 - (3 if is_list else 0) - duplicates - min(2, overload) - min(8, round(10 * unparsed)) - too_few - empty
        - verbose // 2
    )  # fmt: skip

    if overload:
        problems.append(f"overloaded run-on sentence(s) (longest {max(parsed.sentence_lengths)} tokens)")
    if verbose:
        problems.append(
            f"an overloaded caption ({parsed.n_words} tokens for {parsed.scene_objects} shapes; "
            f"{word_budget(parsed.scene_objects)} would do)"
        )
    if and_chain:
        problems.append(f"a chain of {parsed.max_ands} 'and's in one sentence")
    if is_list:
        problems.append(f"a numbered list of facts ({parsed.list_markers} items), not prose")
    if parsed.duplicate_assertions:
        problems.append(f"{parsed.duplicate_assertions} repeated assertion(s)")
    if parsed.duplicate_sentences:
        problems.append(f"{parsed.duplicate_sentences} repeated sentence(s)")
    if parsed.agreement_errors:
        problems.append(f"{parsed.agreement_errors} agreement error(s) (a/an or number)")
    if robotic:
        problems.append("robotic phrasing: most sentences open the same way")
    if parsed.unparsed_words:
        problems.append(f"{parsed.unparsed_words} of {parsed.n_words} tokens do not form a sensible phrase")
    if too_few:
        problems.append("too few words to read as a caption")
    if parsed.empty_sentences:
        problems.append(f"{parsed.empty_sentences} sentence(s) that say nothing")
    if parsed.stutters:
        problems.append(f"{parsed.stutters} immediately repeated word(s)")
    explanation = "; ".join(problems) if problems else "clear, fluent and well-organised prose"
    return LinguisticScores(_clamp(clarity), _clamp(fluency), _clamp(coherency), explanation)
