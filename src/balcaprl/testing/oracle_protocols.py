"""The synthetic world's answers to every protocol's judge calls, and its held-out split dressed as the
three benchmarks: what ``balcaprl judge serve --oracle DIR`` adds to the verdict calls, so that
``evaluate``, ``score`` and ``data recaption`` can all be tried offline (docs/offline.md).

What each answer rests on (the oracle knows every image's scene graph; it does not read English the
way a judge model does, so some steps are plain text rules, said so here):

* DCScore ``dcscore_extract``: a caption's facts are its sentences, each relevant (a text rule; the
  synthetic captions state one fact or two per sentence).
* DCScore ``dcscore_match``: a fact matches the oracle fact with the same text, case aside (a text
  rule: a paraphrase does not match).
* DCScore ``dcscore_verify``: the oracle's own decision: a fact is correct when every assertion the
  oracle reads in it is pointable and visible in the scene.
* CaptionQA ``captionqa_answer``: "Is there a <colour> <shape>?" is answered from the caption's words
  (the question asks what the caption says, not what the image shows); any other question gets the
  cannot-answer option when one is offered, else a ``bad_input`` failure saying so.
* CapArena ``caparena_compare``: the caption with the higher oracle b-CapScore against the human
  reference wins; equal scores are a tie.
* Re-captioning (a free-text request with one image, or the ``recaption_strict`` rubric): the
  dataset's reference caption of the scene the image shows.
"""

from __future__ import annotations

import html
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

from balcaprl.judge.protocol import JudgeFailure
from balcaprl.testing.judge_server import GenericCall

CAPARENA_BASELINES = ("GPT-4o-0806", "CogVLM2-llama3-chat-19B", "MiniCPM-V2.6-8B")
BENCHMARK_FILES = {
    "decapbench": "IIW_400_data.jsonl",
    "captionqa": "captionqa.jsonl",
    "caparena": "caparena_auto_600.json",
    "references": "references.json",  # {image: reference}, for `balcaprl score --references`
}


def request_block(tag: str, text: str) -> str | None:
    """The text of one ``<tag>`` data block of a request (the client escapes what it puts there)."""
    match = re.search(rf"<{tag}>\n(.*?)\n</{tag}>", text, flags=re.S)
    return None if match is None else html.unescape(match.group(1))


def numbered_items(text: str | None) -> list[str]:
    if not text:
        return []
    return [re.sub(r"^\d+\.\s?", "", line) for line in text.split("\n") if line.strip()]


def _question_and_options(text: str) -> tuple[str, dict[str, str]]:
    """The question and the lettered options (``{"A": "Yes", ...}``) of a CaptionQA request in the
    official layout; ``ValueError`` saying what is missing (the server answers it 400)."""
    if "Question:\n" not in text or "\n\nOptions:\n" not in text:
        raise ValueError("a CaptionQA request has a 'Question:' and an 'Options:' section")
    question, listed = text.split("Question:\n", 1)[1].split("\n\nOptions:\n", 1)
    options = {}
    for line in listed.split("\n\nAnswer:", 1)[0].split("\n"):
        letter, dot, option = line.partition(". ")
        if not dot or len(letter) != 1 or not letter.isupper():
            raise ValueError(f"the option line {line!r} is not 'LETTER. text'")
        options[letter] = option
    return question, options


def _sentences(text: str) -> list[str]:
    return [s.strip().rstrip(".") for s in re.split(r"(?<=\.)\s+", text.strip()) if s.strip().rstrip(".")]


def _scenes(dataset: Path) -> dict[str, dict[str, Any]]:
    lines = (Path(dataset) / "scenes.jsonl").read_text(encoding="utf-8").splitlines()
    return {record["id"]: record["scene"] for record in map(json.loads, filter(str.strip, lines))}


def write_synthetic_benchmarks(dataset: Path | str, out: Path | str) -> dict[str, Path]:
    """The held-out split of a synthetic dataset as the three benchmarks, each in its own file format,
    in ``out``; every image key is the image's path relative to the dataset folder (the image folder
    of every benchmark is the dataset folder), so one caption file with those keys serves them all.

    ``references.json`` holds each image's reference (``score --references``). DeCapBench: the
    reference is the human caption and its sentences are the oracle facts. CaptionQA: per image, "Is
    there a <colour> <shape>?" for one shape that is there (Yes) and one that is not (No). CapArena:
    the baselines take turns; a baseline's caption is the reference's first sentence.
    """
    from balcaprl.data.format import read_split_rows
    from balcaprl.synthetic.lexicon import COLORS, KINDS

    rows = read_split_rows(dataset, "eval")
    scenes = _scenes(Path(dataset))
    decap, questions, arena = [], [], {}
    for i, row in enumerate(rows):
        key = row["image"]
        decap.append(
            {
                "image_name": key,
                "oracle_caption": row["reference"],
                "oracle_facts": _sentences(row["reference"]),
            }
        )
        present = {f"{o['color']} {o['kind']}" for o in scenes[row["id"]]["objects"]}
        there = sorted(present)[0]
        absent = next(f"{c} {k}" for c in COLORS for k in KINDS if f"{c} {k}" not in present)
        questions.append({"id": key, "questions": [
            {"question": f"Is there a {there}?", "choices": ["Yes", "No"], "answer": "Yes", "category": ["Object"]},
            {"question": f"Is there a {absent}?", "choices": ["Yes", "No"], "answer": "No", "category": ["Object"]},
        ]})  # fmt: skip
        baseline = CAPARENA_BASELINES[i % len(CAPARENA_BASELINES)]
        first = _sentences(row["reference"])[0] + "."
        arena[key] = {"ref_model": baseline, "captions": {baseline: first, "human": row["reference"]}}
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    paths = {name: folder / file for name, file in BENCHMARK_FILES.items()}
    paths["decapbench"].write_text("".join(json.dumps(r) + "\n" for r in decap), encoding="utf-8")
    paths["captionqa"].write_text("".join(json.dumps(r) + "\n" for r in questions), encoding="utf-8")
    paths["caparena"].write_text(json.dumps(arena, indent=1) + "\n", encoding="utf-8")
    references = {row["image"]: row["reference"] for row in rows}
    paths["references"].write_text(json.dumps(references, indent=1) + "\n", encoding="utf-8")
    return paths


class OracleProtocols:
    """A generic-call handler for the loopback judge server (see the module docstring for what each
    answer rests on). ``references`` maps a scene id to its reference caption (for re-captioning);
    :meth:`from_dataset` reads them from a synthetic dataset folder."""

    def __init__(self, oracle: Any, references: dict[str, str] | None = None) -> None:
        self.oracle = oracle
        self.references = references or {}
        self.calls: Counter = Counter()

    @classmethod
    def from_dataset(cls, oracle: Any, dataset: Path | str) -> OracleProtocols:
        from balcaprl.data.format import read_split_rows

        rows = [row for split in ("train", "eval") for row in read_split_rows(dataset, split)]
        return cls(oracle, {row["id"]: row["reference"] for row in rows})

    def _b_capscore(self, scene: Any, caption: str, reference: str) -> float:
        from balcaprl.rewards import b_capscore, score_verdict

        r = score_verdict(self.oracle.verdict(scene, caption, reference, "evaluation"))
        return float(b_capscore(r.precision, r.recall, r.linguistic))

    def _scene(self, call: GenericCall) -> Any:
        if not call.images:
            raise LookupError("the request carries no image; the oracle knows a scene only by its image")
        return self.oracle.lookup(call.images[0])

    def __call__(self, call: GenericCall) -> Any:
        kind = call.kind or ("recaption" if call.schema_name is None and len(call.images) == 1 else None)
        self.calls[kind] += 1
        answer = getattr(self, f"_{kind}", None) if kind else None
        if answer is None:
            return JudgeFailure("bad_input", f"the oracle does not answer {kind or 'this'} calls")
        try:
            return answer(call)
        except (LookupError, ValueError) as error:  # an image of no scene of this dataset, a malformed call
            return JudgeFailure("bad_input", str(error))

    def _dcscore_extract(self, call: GenericCall) -> Any:
        facts = _sentences(request_block("caption", call.text) or "")
        return {"facts": [{"fact": f, "identifier": "", "relevance": True} for f in facts]}

    def _dcscore_match(self, call: GenericCall) -> Any:
        predicted = [
            re.sub(r" \[[^\]]*\]$", "", f)
            for f in numbered_items(request_block("predicted_facts", call.text))
        ]
        oracle = [o.lower() for o in numbered_items(request_block("oracle_facts", call.text))]
        return {"matches": [{"id": i, "oracle_id": oracle.index(f.lower()) + 1 if f.lower() in oracle else None}
                            for i, f in enumerate(predicted, 1)]}  # fmt: skip

    def _dcscore_verify(self, call: GenericCall) -> Any:
        scene = self._scene(call)
        reference = request_block("reference", call.text) or ""
        verdicts = []
        for i, fact in enumerate(numbered_items(request_block("facts", call.text)), 1):
            fact = re.sub(r" \[[^\]]*\]$", "", fact)
            assertions = self.oracle.verdict(scene, fact, reference, "evaluation").caption_assertions
            verdicts.append(
                {"id": i, "correct": bool(assertions) and all(a.pointable and a.visible for a in assertions)}
            )
        return {"verdicts": verdicts}

    def _captionqa_answer(self, call: GenericCall) -> Any:
        caption = (request_block("caption", call.text) or "").lower()
        question, options = _question_and_options(call.text)
        asked = re.fullmatch(r"Is there an? (.+)\?", question.strip())
        if asked is not None:
            wanted = "Yes" if asked.group(1).lower() in caption else "No"
            letter = next((letter for letter, text in options.items() if text == wanted), None)
            if letter is not None:
                return letter
            return JudgeFailure("bad_input", f"the answer {wanted!r} is not one of the options")
        unanswerable = [letter for letter, text in options.items() if "cannot answer" in text.lower()]
        if unanswerable:
            return unanswerable[0]
        return JudgeFailure("bad_input", "the oracle answers only 'Is there a <colour> <shape>?' questions")

    def _caparena_compare(self, call: GenericCall) -> Any:
        scene = self._scene(call)
        human = request_block("reference_caption", call.text) or ""
        a = self._b_capscore(scene, request_block("caption_1", call.text) or "", human)
        b = self._b_capscore(scene, request_block("caption_2", call.text) or "", human)
        judgment = "Tie" if abs(a - b) < 1e-9 else ("Caption 1 is better" if a > b else "Caption 2 is better")
        return {"reason": f"oracle b-CapScore {a:.3f} vs {b:.3f}", "judgment": judgment}

    def _recaption(self, call: GenericCall) -> Any:
        scene = self._scene(call)
        if scene.id not in self.references:
            return JudgeFailure("bad_input", f"no reference caption for scene {scene.id}")
        return self.references[scene.id]

    _recaption_strict = _recaption
