"""CaptionQA (Yang et al. 2025): how useful a caption is — a text-only model answers the benchmark's
multiple-choice questions about each image from the caption alone.

As the official ``qa.py`` (and lmms-eval's ``captionqa`` task) does it:

- a question is used when it has at least two choices of its own (both official scorers count them
  before the cannot-answer option below is added: a one-choice question is skipped, never asked, and
  draws no shuffle) and its ``answer`` is the text of one of its choices;
- every question that is not a yes/no question gets one more option, "Cannot answer from the
  caption". Yes/no means: some choice contains "yes" and some choice contains "no" (substrings,
  lower-cased, as the official code tests them), or the question starts with an auxiliary verb
  (is, are, was, were, do, does, did, have, has, had, can, could, will, would, should, shall, may,
  might, must);
- the options are shuffled with ``random.Random(0)``, one ``shuffle`` of ``list(range(n))`` per
  usable question, in file order;
- the judge (Qwen2.5-72B-Instruct at temperature 0, at most 4 answer tokens) answers with one
  letter; the letter is read as the official ``extract_letter`` reads it (after ``</think>``, after
  ``Answer: ``, after a first newline; the first standalone capital letter within range, else a
  standalone number 1..n);
- correct = 1, wrong = 0, an option whose text is "Cannot answer from the caption" = 1 / (number of
  original choices) + 0.05 (qa.py compares the chosen option's text, so a question whose own choices
  include that text scores it so too), an answer with no readable letter = 0 (``unparsed``), an
  empty answer = 0 (``empty``): both counted.

The benchmark's score is 100 x the mean per-question score; accuracy, the cannot-answer rate and
per-category scores come with it.

**Where the authors' ``qa.py`` and lmms-eval's task differ, the default is ``qa.py``** — the script
the benchmark's authors publish and score their leaderboard with; lmms-eval's task is a port of it.
Both variants are options: ``shuffle_over`` (``captioned``, qa.py: the RNG advances only over
questions of images that have a caption, in the question file's order; ``all``, lmms-eval: over every
usable question of the file, whatever has a caption — lmms-eval always uses the whole ``all`` split,
so give that file), ``cannot_answer`` (``text``, qa.py: the chosen option's text is the
cannot-answer text; ``position``, lmms-eval: the chosen option is the one added last) and
``rounding`` (``question``, qa.py: each question's score rounded to 4 decimals, then the mean;
``mean``, lmms-eval: unrounded, the mean rounded to 4 decimals). With a complete caption file of the
``all`` split and no cannot-answer text among a question's own choices, the two differ only by
rounding. Not taken from lmms-eval:
it reads the judge's answer unstripped (``"A\n"`` is unreadable there; qa.py and we strip it) and
scores an HTTP error as an empty answer (here a failed call is a failure: reported, left out of the
means and asked again by a re-run; answers are cached). Our stricter choice for empty answers,
``empty_answer: failure``, leaves them out instead of scoring 0.

**Prompts.** By default our own system message (rubric ``captionqa_answer``, labelled paraphrase)
and the official user-message layout, the caption an escaped data block. With ``official.captionqa``
set, the system message, the prompt builder, the letter reader and the cannot-answer option come from
lmms-eval's task (:func:`~balcaprl.evaluate.official.load_captionqa_task`), and the request is the
task's: the caption as it is, ``temperature`` 0, ``max_tokens`` 4 (qa.py's own vLLM
path sends the same system and user messages). The ``guard`` option escapes and cleans the caption
instead.

Entries with several images (several views of one scene) are captioned from all of them, as
lmms-eval's task does; the authors' ``caption.py`` also puts one line saying how many before the
prompt, which ``balcaprl caption --multi-image captionqa`` reads from a checkout of their repository
(see ``balcaprl caption --multi-image``).
"""

from __future__ import annotations

import random
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from balcaprl.evaluate.formats import CaptionQAEntry, CaptionSet, Question, read_captionqa
from balcaprl.evaluate.official import (
    CAPTIONQA_BODY,
    CaptionQATask,
    load_captionqa_task,
    official_text,
    paraphrase_source,
    unicode_failure,
)
from balcaprl.evaluate.protocols import OfficialPromptSection, Protocol
from balcaprl.evaluate.results import ProtocolResult, judge_in_spans, mean, read_items
from balcaprl.judge.calls import JudgeCaller
from balcaprl.judge.prompt import clean_text, data_block
from balcaprl.judge.protocol import JudgeFailure
from balcaprl.judge.rubrics import load_rubric
from balcaprl.judge.throughput import span_rows

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
CANNOT_ANSWER = "Cannot answer from the caption"
CANNOT_ANSWER_BONUS = 0.05
ROUND_DIGITS = 4  # both official scorers round to 4 decimals (per question, or the mean)
_YES_NO_STARTS = (
    "is ", "are ", "was ", "were ", "do ", "does ", "did ", "have ", "has ", "had ", "can ", "could ",
    "will ", "would ", "should ", "shall ", "may ", "might ", "must ",
)  # fmt: skip


class CaptionQASection(OfficialPromptSection):
    """CaptionQA's question file and options; the defaults are the official protocol's (seed 0,
    temperature 0)."""

    INPUTS = {"questions": ("the CaptionQA questions", "--captionqa")}
    questions: Path | None = Field(None, description="CaptionQA questions (parquet/JSON/JSONL).")
    seed: int = Field(0, description="Seed of the option shuffle (official: 0).")
    temperature: float | None = Field(0.0, description="The answering model's temperature (official: 0).")
    max_tokens: int = Field(
        4, ge=1, description="Most answer tokens (official: 4; a cut-off answer is still read)."
    )
    empty_answer: Literal["zero", "failure"] = Field(
        "zero",
        description="An empty answer: 'zero' (official: scored 0 and counted) or 'failure' (ours, stricter: "
        "left out of the means, asked again by a re-run).",
    )
    rounding: Literal["question", "mean"] = Field(
        "question",
        description="'question' (qa.py: each question's score rounded to 4 decimals) or 'mean' (lmms-eval: "
        "only the mean rounded).",
    )
    shuffle_over: Literal["captioned", "all"] = Field(
        "captioned",
        description="The questions the option shuffle's RNG advances over: 'captioned' (qa.py: those of "
        "images with a caption) or 'all' (lmms-eval: every usable question of the file).",
    )
    cannot_answer: Literal["text", "position"] = Field(
        "text",
        description="Which chosen option scores 1/n + 0.05: 'text' (qa.py: any whose text is the cannot-answer "
        "text) or 'position' (lmms-eval: the option added last).",
    )


# The official protocol's options (both official scorers' variants count as official).
OFFICIAL_OPTIONS: dict[str, tuple[Any, ...]] = {
    "seed": (0,), "temperature": (0.0,), "max_tokens": (4,), "empty_answer": ("zero",),
    "rounding": ("question", "mean"), "shuffle_over": ("captioned", "all"),
    "cannot_answer": ("text", "position"), "guard": (False,),
}  # fmt: skip


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
    cannot_answer: str = CANNOT_ANSWER  # the cannot-answer option's text

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


def prepare_questions(
    entries: Sequence[CaptionQAEntry],
    seed: int = 0,
    *,
    only: Callable[[str], bool] | None = None,
    cannot_answer: str = CANNOT_ANSWER,
    add_cannot_answer: Callable[[str, list[str]], list[str]] | None = None,
) -> list[PreparedQuestion]:
    """Every usable question in file order, with its shuffled options (one RNG for the whole file).

    ``only``: the entries whose questions take part (the others draw nothing from the RNG: qa.py's
    rule for images without a caption). ``cannot_answer`` / ``add_cannot_answer(question, choices)``:
    the extra option's text and the function that adds it (lmms-eval's task's, with official prompts).
    A question needs two choices of its own, counted before the cannot-answer option is added, as
    qa.py and lmms-eval's task both count them: a one-choice question is skipped before any shuffle
    is drawn, so the questions after it are shown as the official scorers show them.
    """
    rng = random.Random(seed)
    prepared = []
    for entry in entries:
        if only is not None and not only(entry.id):
            continue
        for index, q in enumerate(entry.questions):
            if len(q.choices) < 2:  # before the cannot-answer option: qa.py's and lmms-eval's rule
                continue
            if add_cannot_answer is not None:
                options = tuple(str(o) for o in add_cannot_answer(q.question, list(q.choices)))
            elif is_yes_no_question(q.question, q.choices):
                options = q.choices
            else:
                options = (*q.choices, cannot_answer)
            answer = _answer_index(q)
            if answer is None:
                continue
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
                    cannot_answer,
                )
            )
    return prepared


def question_prompt(caption: str, question: PreparedQuestion) -> str:
    """The user message: the caption (an escaped data block), the question, the lettered options (the
    official layout)."""
    options = "\n".join(f"{LETTERS[i]}. {text}" for i, text in enumerate(question.shown))
    caption_block = data_block("caption", caption)
    return f"Caption:\n{caption_block}\n\nQuestion:\n{question.question}\n\nOptions:\n{options}\n\nAnswer:"


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


def score_answer(question: PreparedQuestion, letter: str | None, by_text: bool = True) -> tuple[float, str]:
    """``(score, outcome)``: outcome is correct, wrong, cannot_answer or unparsed. ``by_text``: the
    cannot-answer option is any option with its text, checked before the right answer (qa.py); else
    the option added last (lmms-eval)."""
    shown = LETTERS.find(letter) if isinstance(letter, str) and len(letter) == 1 else -1
    if not 0 <= shown < len(question.permutation):
        return 0.0, "unparsed"
    original = question.permutation[shown]
    if (
        question.options[original] == question.cannot_answer
        if by_text
        else question.has_cannot_answer and original == len(question.options) - 1
    ):
        return 1.0 / len(question.choices) + CANNOT_ANSWER_BONUS, "cannot_answer"
    if original == question.answer_index:
        return 1.0, "correct"
    return 0.0, "wrong"


def answer_messages(
    caption: str, question: PreparedQuestion, task: CaptionQATask | None = None, guard: bool = False
) -> list[dict[str, Any]]:
    """The judge's request: our system message and layout (the caption cleaned, as an escaped data
    block), or lmms-eval's (``task``: the caption as it is; with ``guard``, as ours)."""
    if task is None:
        return [
            {"role": "system", "content": load_rubric("captionqa_answer").text},
            {"role": "user", "content": question_prompt(clean_text(caption).strip(), question)},
        ]
    shown = official_text(caption, guard)
    shown = data_block("caption", shown) if guard else shown
    prompt = task.build_prompt(shown, question.question, question.shown)
    return [{"role": "system", "content": task.system}, {"role": "user", "content": prompt}]


def _is_empty_answer(failure: JudgeFailure) -> bool:
    # the call path fails an empty answer at once as invalid_json ("the answer is empty")
    return failure.reason == "invalid_json" and "empty" in failure.detail


def run_captionqa(
    caller: JudgeCaller,
    entries: Sequence[CaptionQAEntry],
    captions: CaptionSet,
    out_dir: Path,
    settings: CaptionQASection | None = None,
    *,
    on_progress: Callable[[int, int], None] | None = None,
    prompts: CaptionQATask | None = None,
    label: str | None = None,
) -> ProtocolResult:
    """Answer every usable question whose image has a caption; write ``items.jsonl``; summarise.
    ``prompts``: lmms-eval's official task (:func:`~balcaprl.evaluate.official.load_captionqa_task`);
    None runs our paraphrase."""
    settings, task = settings or CaptionQASection(), prompts
    caption_of = {e.id: captions.lookup(e.id) for e in entries}
    only = (lambda i: caption_of[i] is not None) if settings.shuffle_over == "captioned" else None
    rules = {
        "cannot_answer": CANNOT_ANSWER if task is None else task.cannot_answer,
        "add_cannot_answer": None if task is None else task.add_cannot_answer,
    }
    questions = prepare_questions(entries, settings.seed, only=only, **rules)
    n_usable = len(questions) if only is None else len(prepare_questions(entries, settings.seed, **rules))
    missing = sorted(i for i, c in caption_of.items() if c is None)
    todo = [q for q in questions if caption_of[q.entry_id] is not None]
    read_letter = extract_letter if task is None else task.extract_letter

    done = 0

    async def one(q: PreparedQuestion) -> dict[str, Any]:
        nonlocal done
        caption = caption_of[q.entry_id] or ""
        texts = [("caption", caption), ("question", q.question),
                 *((f"option {LETTERS[i]}", text) for i, text in enumerate(q.shown))]  # fmt: skip
        failure = unicode_failure(
            texts, f"image {q.entry_id!r}", official=task is not None, guard=settings.guard
        )
        if failure is None:  # a refused question is never sent
            result = await caller.call_text(
                answer_messages(caption, q, task, settings.guard), kind="captionqa_answer",
                temperature=settings.temperature, max_tokens=settings.max_tokens, truncated_ok=True,
                token_field="max_tokens",  # as both official scorers send it
                encode=None if task is None else CAPTIONQA_BODY,  # lmms-eval's task's bytes
            )  # fmt: skip
            failure = result.failure
        done += 1
        if on_progress is not None:
            on_progress(done, len(todo))
        row: dict[str, Any] = {
            "id": q.entry_id, "question_index": q.index, "category": q.category, "question": q.question,
            "options_shown": q.shown, "ground_truth": q.choices[q.answer_index],
        }  # fmt: skip
        if failure is not None and not (settings.empty_answer == "zero" and _is_empty_answer(failure)):
            return {**row, "failure": failure.reason, "detail": failure.detail, "score": None}
        response = "" if failure is not None else result.value
        letter = read_letter(response, len(q.options))
        score, outcome = score_answer(q, letter, by_text=settings.cannot_answer == "text")
        if not response:
            outcome = "empty"
        if settings.rounding == "question":
            score = round(score, ROUND_DIGITS)
        return {
            **row,
            "failure": None,
            "response": response,
            "letter": letter,
            "outcome": outcome,
            "score": score,
        }

    items = Path(out_dir) / "items.jsonl"
    judge_in_spans(items, todo, one, span=span_rows(caller.config), close=caller.aclose)
    summary_keys = ("category", "failure", "outcome", "score")  # what the figures below read, per row
    rows = [{key: row.get(key) for key in summary_keys} for row in read_items(items)]

    ok = [r for r in rows if r["failure"] is None]
    by_category: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in ok:
        by_category[r["category"] or "unknown"].append(r)
    outcomes = Counter(r["outcome"] for r in ok)

    def pct(values: list[float]) -> float | None:
        if not values:
            return None
        value = mean(values)
        return 100 * (round(value, ROUND_DIGITS) if settings.rounding == "mean" else value)

    metrics = {
        "score": pct([r["score"] for r in ok]),
        "accuracy": pct([float(r["outcome"] == "correct") for r in ok]),
        "cannot_answer_rate": pct([float(r["outcome"] == "cannot_answer") for r in ok]),
        "unparsed": outcomes["unparsed"],
        "empty_answers": outcomes["empty"],
        "n_questions": n_usable,
        "n_asked": len(todo),
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
    source = (
        task.source.ran(settings.guard)
        if task is not None
        else paraphrase_source("captionqa", ("captionqa_answer",))
    )
    return ProtocolResult(
        protocol="captionqa",
        score=metrics["score"],
        metrics=metrics,
        n_items=n_usable,
        n_scored=len(ok),
        failures=dict(Counter(r["failure"] for r in rows if r["failure"] is not None)),
        missing=missing,
        settings={**settings.options(), "prompts": source.as_dict()},
        judge=caller.config.model,
        stats=caller.stats.as_dict(caller.config.price_per_million_tokens),
        notes="score = 100 x mean per-question score (correct 1, cannot-answer 1/n + 0.05, wrong, unreadable "
        "or empty 0); missing lists image ids without a caption (their questions are not asked)",
    )


PROTOCOL = Protocol(
    name="captionqa", benchmark="captionqa", title="CaptionQA.", section=CaptionQASection,
    read=lambda section: read_captionqa(section.questions), run=run_captionqa,
    official_prompts=lambda o: None if o.captionqa is None else load_captionqa_task(o.captionqa),
    official_options=OFFICIAL_OPTIONS,
)  # fmt: skip
