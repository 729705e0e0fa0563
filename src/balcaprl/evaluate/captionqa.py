"""CaptionQA (Yang et al. 2025): how useful a caption is — a text-only model answers the benchmark's
multiple-choice questions about each image from the caption alone.

As the official ``qa.py`` (and lmms-eval's ``captionqa`` task) does it:

- a question is used when it has at least two choices and its ``answer`` is the text of one of them;
- every question that is not a yes/no question gets one more option, "Cannot answer from the
  caption". Yes/no means: some choice contains "yes" and some choice contains "no" (substrings,
  lower-cased, as the official code tests them), or the question starts with an auxiliary verb
  (is, are, was, were, do, does, did, have, has, had, can, could, will, would, should, shall, may,
  might, must);
- the options are shuffled with ``random.Random(0)``, one ``shuffle`` of ``list(range(n))`` per
  usable question, in file order, over every usable question of the question file (whether or not
  its image has a caption, so a missing caption never changes another question's order);
- the judge (Qwen2.5-72B-Instruct at temperature 0 in the paper) answers with one letter; the
  letter is read as the official ``extract_letter`` reads it (after ``</think>``, after
  ``Answer: ``, after a first newline; the first standalone capital letter within range, else a
  standalone number 1..n);
- correct = 1, wrong = 0, the cannot-answer option = 1 / (number of original choices) + 0.05, an
  answer with no readable letter = 0 (counted as ``unparsed``).

The benchmark's score is 100 x the mean per-question score; accuracy, the cannot-answer rate and
per-category scores come with it. A question whose call failed is a failure: reported, left out of
the means, and asked again by a re-run (answers are cached).
"""

from __future__ import annotations

import asyncio
import random
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from balcaprl.evaluate.formats import CaptionQAEntry, CaptionSet, Question
from balcaprl.evaluate.results import ProtocolResult, mean, write_items
from balcaprl.judge.calls import JudgeCaller
from balcaprl.judge.prompt import clean_text
from balcaprl.rewards.rubrics import load_rubric

__all__ = [
    "CANNOT_ANSWER",
    "CaptionQASettings",
    "PreparedQuestion",
    "extract_letter",
    "is_yes_no_question",
    "prepare_questions",
    "question_prompt",
    "run_captionqa",
    "score_answer",
]

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
CANNOT_ANSWER = "Cannot answer from the caption"
CANNOT_ANSWER_BONUS = 0.05
_YES_NO_STARTS = (
    "is ", "are ", "was ", "were ", "do ", "does ", "did ", "have ", "has ", "had ", "can ", "could ",
    "will ", "would ", "should ", "shall ", "may ", "might ", "must ",
)  # fmt: skip


class CaptionQASettings(BaseModel):
    """How CaptionQA is run; the defaults are the official protocol's (seed 0, temperature 0)."""

    model_config = ConfigDict(extra="forbid")

    seed: int = Field(0, description="Seed of the option shuffle (official: 0).")
    temperature: float | None = Field(0.0, description="The answering model's temperature (official: 0).")
    max_tokens: int = Field(
        16, ge=1, description="Most answer tokens (official: 4; a cut-off answer is still read)."
    )


def is_yes_no_question(question: str, choices: Sequence[str]) -> bool:
    texts = [c.strip().lower() for c in choices]
    if any("yes" in t for t in texts) and any("no" in t for t in texts):
        return True
    return question.strip().lower().startswith(_YES_NO_STARTS)


@dataclass(frozen=True)
class PreparedQuestion:
    """A usable question with its options as shown (shuffled, cannot-answer added when due)."""

    entry_id: str
    index: int  # the question's position in its entry
    question: str
    choices: tuple[str, ...]  # the original choices
    answer_index: int  # of the right choice, in the original order
    options: tuple[str, ...]  # choices + cannot-answer (when added), in the original order
    permutation: tuple[int, ...]  # shown option i is options[permutation[i]]
    category: str

    @property
    def shown(self) -> list[str]:
        return [self.options[i] for i in self.permutation]

    @property
    def has_cannot_answer(self) -> bool:
        return len(self.options) > len(self.choices)


def _answer_index(q: Question) -> int | None:
    if not isinstance(q.answer, str):
        return None
    for i, choice in enumerate(q.choices):
        if q.answer.strip() == choice.strip():
            return i
    return None


def prepare_questions(entries: Sequence[CaptionQAEntry], seed: int = 0) -> list[PreparedQuestion]:
    """Every usable question in file order, with its shuffled options (one RNG for the whole file)."""
    rng = random.Random(seed)
    prepared = []
    for entry in entries:
        for index, q in enumerate(entry.questions):
            if len(q.choices) < 2:
                continue
            answer = _answer_index(q)
            if answer is None:
                continue
            options = q.choices if is_yes_no_question(q.question, q.choices) else (*q.choices, CANNOT_ANSWER)
            permutation = list(range(len(options)))
            rng.shuffle(permutation)
            prepared.append(
                PreparedQuestion(
                    entry.id,
                    index,
                    q.question,
                    q.choices,
                    answer,
                    tuple(options),
                    tuple(permutation),
                    q.category,
                )  # fmt: skip
            )
    return prepared


def question_prompt(caption: str, question: PreparedQuestion) -> str:
    """The user message: the caption, the question, the lettered options (the official layout)."""
    options = "\n".join(f"{LETTERS[i]}. {text}" for i, text in enumerate(question.shown))
    return f"Caption:\n{caption}\n\nQuestion:\n{question.question}\n\nOptions:\n{options}\n\nAnswer:"


def extract_letter(answer: str | None, n_options: int) -> str | None:
    """The chosen letter in a model's answer, read as the official code reads it; None if none."""
    if not answer:
        return None
    if "</think>" in answer:
        answer = answer.split("</think>", 1)[1]
    if "Answer: " in answer:
        answer = answer.split("Answer: ", 1)[1]
    if "\n" in answer:
        answer = answer.split("\n", 1)[1]
    match = re.search(r"\b([A-Z])\b", answer.upper())
    if match and LETTERS.index(match.group(1)) < max(1, n_options):
        return match.group(1)
    match = re.search(r"\b([1-9][0-9]?)\b", answer)
    if match and 1 <= int(match.group(1)) <= max(1, n_options):
        return LETTERS[int(match.group(1)) - 1]
    return None


def score_answer(question: PreparedQuestion, letter: str | None) -> tuple[float, str]:
    """``(score, outcome)``: outcome is correct, wrong, cannot_answer or unparsed."""
    if letter is None:
        return 0.0, "unparsed"
    original = question.permutation[LETTERS.index(letter)]
    if question.has_cannot_answer and original == len(question.options) - 1:
        return 1.0 / len(question.choices) + CANNOT_ANSWER_BONUS, "cannot_answer"
    if original == question.answer_index:
        return 1.0, "correct"
    return 0.0, "wrong"


def _messages(caption: str, question: PreparedQuestion) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": load_rubric("captionqa_answer").text},
        {"role": "user", "content": question_prompt(caption, question)},
    ]


def run_captionqa(
    caller: JudgeCaller,
    entries: Sequence[CaptionQAEntry],
    captions: CaptionSet,
    out_dir: Path,
    settings: CaptionQASettings | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> ProtocolResult:
    """Answer every usable question whose image has a caption; write ``items.jsonl``; summarise."""
    settings = settings or CaptionQASettings()
    questions = prepare_questions(entries, settings.seed)
    caption_of = {e.id: captions.lookup(e.id) for e in entries}
    missing = sorted(i for i, c in caption_of.items() if c is None)
    todo = [q for q in questions if caption_of[q.entry_id] is not None]

    async def run_all():
        done = 0

        async def one(q: PreparedQuestion):
            nonlocal done
            caption = clean_text(caption_of[q.entry_id] or "").strip()
            result = await caller.call_text(
                _messages(caption, q), kind="captionqa_answer", temperature=settings.temperature,
                max_tokens=settings.max_tokens, truncated_ok=True,
            )  # fmt: skip
            done += 1
            if on_progress is not None:
                on_progress(done, len(todo))
            return result

        try:
            return await asyncio.gather(*[one(q) for q in todo])
        finally:
            await caller.aclose()

    results = asyncio.run(run_all())
    rows = []
    for q, result in zip(todo, results, strict=True):
        row: dict[str, Any] = {
            "id": q.entry_id, "question_index": q.index, "category": q.category, "question": q.question,
            "options_shown": q.shown, "ground_truth": q.choices[q.answer_index],
        }  # fmt: skip
        if result.failure is not None:
            row.update(failure=result.failure.reason, detail=result.failure.detail, score=None)
        else:
            letter = extract_letter(result.value, len(q.options))
            score, outcome = score_answer(q, letter)
            row.update(failure=None, response=result.value, letter=letter, outcome=outcome, score=score)
        rows.append(row)
    write_items(Path(out_dir) / "items.jsonl", rows)

    ok = [r for r in rows if r["failure"] is None]
    by_category: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in ok:
        by_category[r["category"] or "unknown"].append(r)
    outcomes = Counter(r["outcome"] for r in ok)

    def pct(values: list[float]) -> float | None:
        return 100 * mean(values) if values else None

    metrics = {
        "score": pct([r["score"] for r in ok]),
        "accuracy": pct([float(r["outcome"] == "correct") for r in ok]),
        "cannot_answer_rate": pct([float(r["outcome"] == "cannot_answer") for r in ok]),
        "unparsed": outcomes["unparsed"],
        "n_questions": len(questions),
        "n_answered": len(ok),
        "per_category": {
            name: {
                "score": pct([r["score"] for r in rs]),
                "accuracy": pct([float(r["outcome"] == "correct") for r in rs]),
                "n": len(rs),
            }
            for name, rs in sorted(by_category.items())
        },
    }
    return ProtocolResult(
        protocol="captionqa",
        score=metrics["score"],
        metrics=metrics,
        n_items=len(questions),
        n_scored=len(ok),
        failures=dict(Counter(r["failure"] for r in rows if r["failure"] is not None)),
        missing=missing,
        settings=settings.model_dump(),
        judge=caller.config.model,
        stats=caller.stats.as_dict(caller.config.price_per_million_tokens),
        notes="score = 100 x mean per-question score (correct 1, cannot-answer 1/n + 0.05, wrong 0); "
        "missing lists image ids without a caption (their questions are not asked)",
    )
