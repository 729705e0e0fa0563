"""Builders for the evaluation tests (a uniquely named module; imported by the test files, never
through conftest): benchmark fixtures in each benchmark's exact file format, and a scripted judge
handler that answers the protocols' generic calls over the loopback server."""

from __future__ import annotations

import io
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

from PIL import Image

from balcaprl.judge import JudgeConfig
from balcaprl.judge.protocol import JudgeFailure
from balcaprl.testing.judge_server import GenericCall
from balcaprl.testing.oracle_protocols import CAPARENA_BASELINES, numbered_items, request_block


def png(colour: tuple[int, int, int], size: int = 24) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (size, size), colour).save(buffer, "PNG")
    return buffer.getvalue()


def judge_config(base_url: str, **overrides: Any) -> JudgeConfig:
    values: dict[str, Any] = dict(base_url=base_url, model="scripted", api_key_env=None, cache_path=None,
                                  timeout_s=10.0, max_retries=0)  # fmt: skip
    values.update(overrides)
    return JudgeConfig(**values)


def write_judge_yaml(path: Path, base_url: str, **overrides: Any) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(judge_config(base_url, **overrides).model_dump(mode="json")))
    return path


# ----------------------------------------------------------------------------------------- DeCapBench

# Two images; the oracle facts are what a human annotator wrote.
DECAP_ORACLE = {
    "iiw_001.jpg": {
        "oracle_caption": "A red door on the left. A black cat sits on the step.",
        "oracle_facts": ["There is a red door.", "The door is on the left.", "A black cat sits on the step."],
    },
    "iiw_002.jpg": {
        "oracle_caption": "A blue car is parked by a tree.",
        "oracle_facts": ["There is a blue car.", "The car is parked by a tree."],
    },
}


def write_decapbench(root: Path) -> tuple[Path, Path]:
    """``IIW_400_data.jsonl`` (image_name, oracle_caption, oracle_facts) and the image folder."""
    images = root / "decapbench_images"
    images.mkdir(parents=True, exist_ok=True)
    lines = []
    for i, (name, entry) in enumerate(DECAP_ORACLE.items()):
        (images / name).write_bytes(png((40 * i + 20, 10, 10)))
        lines.append(json.dumps({"image_name": name, **entry}))
    annotations = root / "IIW_400_data.jsonl"
    annotations.write_text("\n".join(lines) + "\n")
    return annotations, images


# ----------------------------------------------------------------------------------------- CaptionQA

CAPTIONQA_ROWS = [
    {
        "id": "nat_001",
        "domain": "natural",
        "questions": [
            # not yes/no: "Cannot answer from the caption" is added (4 options shown)
            {
                "question": "What colour is the door?",
                "choices": ["Red", "Green", "Blue"],
                "answer": "Red",
                "category": ["Attribute"],
            },  # fmt: skip
            # yes/no (choices): no extra option
            {"question": "Is there a cat?", "choices": ["Yes", "No"], "answer": "Yes", "category": "Object"},
            # not usable: the answer is not one of the choices
            {"question": "How many?", "choices": ["1", "2"], "answer": "3", "category": "Count"},
        ],
    },
    {
        "id": "nat_002",
        "domain": "natural",
        "questions": [
            {
                "question": "Where is the car parked?",
                "choices": ["By a tree", "In a garage"],
                "answer": "By a tree",
                "category": ["Spatial"],
            },  # fmt: skip
            {
                "question": "What brand is the car?",
                "choices": ["Ford", "Fiat", "Audi", "Kia"],
                "answer": "Kia",
                "category": ["Attribute"],
            },  # fmt: skip
        ],
    },
    {  # no caption will be given for this image
        "id": "doc_001",
        "domain": "document",
        "questions": [
            {"question": "What is the title?", "choices": ["A", "B"], "answer": "A", "category": "Text"}
        ],
    },
]


def write_captionqa(root: Path) -> Path:
    """The question set as a parquet file (as saved from the hub), with embedded images."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = []
    for i, row in enumerate(CAPTIONQA_ROWS):
        questions = [{**q, "category": q["category"] if isinstance(q["category"], list) else [q["category"]]}
                     for q in row["questions"]]  # fmt: skip
        rows.append({**row, "questions": questions, "images": [{"bytes": png((5, 60 * i, 5)), "path": None}]})
    path = root / "captionqa_all.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


# ----------------------------------------------------------------------------------------- CapArena


def write_caparena(root: Path, n_per_baseline: int = 2) -> tuple[Path, Path, dict[str, dict[str, Any]]]:
    """``caparena_auto_600.json`` with ``n_per_baseline`` images per baseline, and the image folder."""
    images = root / "caparena_images"
    images.mkdir(parents=True, exist_ok=True)
    data = {}
    index = 0
    for baseline in CAPARENA_BASELINES:
        for _ in range(n_per_baseline):
            name = f"test_{index:05d}.jpg"
            (images / name).write_bytes(png((index * 20 % 255, 90, 200)))
            data[name] = {
                "ref_model": baseline,
                "captions": {
                    baseline: f"baseline caption of {name} by {baseline}",
                    "Other-Model": "a caption by a model that is not this image's baseline",
                    "human": f"human reference for {name}",
                },
            }
            index += 1
    path = root / "caparena_auto_600.json"
    path.write_text(json.dumps(data, indent=1))
    return path, images, data


# ----------------------------------------------------------------------------------------- the handler


class ProtocolJudge:
    """Answers the protocols' generic calls from scripted tables (see each test for the values).

    - ``facts[caption] = [(fact, identifier, relevance), ...]`` (DCScore extraction);
    - ``matches[fact] = [oracle text or None per call]`` (DCScore matching; the n-th call for a fact
      list answers with the n-th entry, the last one repeating), oracle texts are turned into ids;
    - ``verified[fact] = [bool per call]`` (DCScore verification, same convention);
    - ``answers[(caption, question)] = option text`` or ``"raw:<text>"`` for a raw reply (CaptionQA);
    - ``preferred``: captions the arena judge prefers; both or neither preferred -> "Tie".
    ``fail_kinds``: kinds answered with a server error (500).
    """

    def __init__(self, facts=None, matches=None, verified=None, answers=None, preferred=(), fail_kinds=()):
        self.facts = facts or {}
        self.matches = matches or {}
        self.verified = verified or {}
        self.answers = answers or {}
        self.preferred = set(preferred)
        self.fail_kinds = set(fail_kinds)
        self.calls: Counter = Counter()
        self.seen: list[GenericCall] = []
        self._turn: Counter = Counter()

    def _pick(self, table: dict, key: str, turn: int, default):
        values = table.get(key)
        if values is None:
            return default
        return values[min(turn, len(values) - 1)]

    def __call__(self, call: GenericCall):
        self.calls[call.kind] += 1
        self.seen.append(call)
        if call.kind in self.fail_kinds:
            return JudgeFailure("server_error", "scripted failure")
        if call.kind == "dcscore_extract":
            caption = request_block("caption", call.text) or ""
            facts = self.facts.get(caption, [])
            return {"facts": [{"fact": f, "identifier": i, "relevance": r} for f, i, r in facts]}
        if call.kind == "dcscore_match":
            predicted = [
                re.sub(r" \[[^\]]*\]$", "", f)
                for f in numbered_items(request_block("predicted_facts", call.text))
            ]
            oracle = numbered_items(request_block("oracle_facts", call.text))
            turn = self._turn[("match", tuple(predicted))]
            self._turn[("match", tuple(predicted))] += 1
            out = []
            for i, fact in enumerate(predicted, 1):
                target = self._pick(self.matches, fact, turn, None)
                out.append({"id": i, "oracle_id": oracle.index(target) + 1 if target in oracle else None})
            return {"matches": out}
        if call.kind == "dcscore_verify":
            predicted = [
                re.sub(r" \[[^\]]*\]$", "", f) for f in numbered_items(request_block("facts", call.text))
            ]
            turn = self._turn[("verify", tuple(predicted))]
            self._turn[("verify", tuple(predicted))] += 1
            return {"verdicts": [{"id": i, "correct": bool(self._pick(self.verified, f, turn, False))}
                                 for i, f in enumerate(predicted, 1)]}  # fmt: skip
        if call.kind == "captionqa_answer":
            caption = request_block("caption", call.text)
            question = call.text.split("Question:\n", 1)[1].split("\n\nOptions:\n", 1)[0]
            options = call.text.split("Options:\n", 1)[1].split("\n\nAnswer:", 1)[0].split("\n")
            choice = self.answers.get((caption, question), "")
            if choice.startswith("raw:"):
                return choice[4:]
            for line in options:
                letter, text = line.split(". ", 1)
                if text == choice:
                    return letter
            return "I do not know"
        if call.kind == "caparena_compare":
            first, second = request_block("caption_1", call.text), request_block("caption_2", call.text)
            a, b = first in self.preferred, second in self.preferred
            judgment = "Tie" if a == b else ("Caption 1 is better" if a else "Caption 2 is better")
            return {"reason": "scripted", "judgment": judgment}
        return JudgeFailure("bad_input", f"unexpected call kind {call.kind!r}")
