"""Reading a scores folder (``balcaprl score --out``: scores.jsonl, summary.json, verdicts.jsonl) and
an evaluation folder (``balcaprl evaluate --out``: eval.json and its bcapscore/ scores folder)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from balcaprl.errors import InputError
from balcaprl.evaluate.official import rules_line
from balcaprl.inspect.cards import verdict_fields, word_ratio
from balcaprl.inspect.inspection import (
    EVAL_FILE,
    SCORES_FILE,
    SUMMARY_FILE,
    VERDICTS_FILE,
    Inspection,
    finite_number,
    read_json,
    read_jsonl_rows,
)


def add_scores(found: Inspection, folder: Path, image_root: Path | None, label: str) -> None:
    scores = read_jsonl_rows(folder / SCORES_FILE)
    summary = read_json(folder / SUMMARY_FILE) if (folder / SUMMARY_FILE).is_file() else {}
    verdicts_path = folder / VERDICTS_FILE
    verdicts: list[dict[str, Any]] | None = None
    if verdicts_path.is_file():
        verdicts = read_jsonl_rows(verdicts_path)
        if len(verdicts) != len(scores):
            raise InputError(
                f"{verdicts_path} has {len(verdicts)} rows and {folder / SCORES_FILE} {len(scores)}; "
                "they come from one `balcaprl score` run and must match line by line"
            )
    else:
        found.notes.append(
            f"{folder} has no {VERDICTS_FILE} (written by `balcaprl score` since it records verdicts): "
            "cards show scores without assertions; score again to see them"
        )
    # An evaluation's b-CapScore folder keeps its inputs as {key: text} files next to the scores.
    texts = {name: read_json(folder / f"{name}.json") for name in ("captions", "references")
             if (folder / f"{name}.json").is_file()}  # fmt: skip
    root = image_root or (Path(summary["image_root"]) if summary.get("image_root") else None)
    if root is None:
        found.notes.append(f"{folder}: no image folder known; pass --images DIR to show the images")
    source = found.source(label)
    for number, row in enumerate(scores):
        extra = verdicts[number] if verdicts is not None else {}
        image = str(row.get("image", ""))
        if verdicts is not None and extra.get("image") != image:
            raise InputError(
                f"{verdicts_path}:{number + 1}: image {extra.get('image')!r} where {SCORES_FILE} has {image!r}"
            )
        caption = extra.get("caption", texts.get("captions", {}).get(image, ""))
        reference = extra.get("reference", texts.get("references", {}).get(image))
        card: dict[str, Any] = {
            "id": image,
            "source": source,
            "image": found.images.add(image, root) if root is not None else None,
            "caption": caption,
            "reference": reference,
            "ratio": word_ratio(caption, reference),
            "ratio_unit": "words",
            "in_band": None,
            "masked": None,  # b-CapScore has no length control
            "failure": row.get("failure"),
            "detail": row.get("failure_detail") or row.get("detail") or "",  # a record row, or an older one
            "verdict_from": None,
            "note": "",
        }
        for key in ("precision", "recall", "linguistic", "b_capscore"):
            card[key] = finite_number(row.get(key))
        card["linguistic_raw"] = card["linguistic"]
        if extra.get("verdict") is not None:
            card.update(verdict_fields(extra["verdict"]), verdict_from="judge")
        found.cards.append(card)


def load_evaluation(found: Inspection, folder: Path, image_root: Path | None) -> None:
    record = read_json(folder / EVAL_FILE)
    bcap = folder / "bcapscore"
    if not (bcap / SCORES_FILE).is_file():
        raise InputError(
            f"{folder} holds no b-CapScore results ({bcap / SCORES_FILE}); the page shows b-CapScore "
            "verdicts (run `balcaprl evaluate --suite bcapscore ...`)"
        )
    found.title = str(record.get("label") or folder.name)
    others = sorted(set(record.get("results", {})) - {"bcapscore"})
    if others:
        found.notes.append(f"other protocols in {EVAL_FILE} ({', '.join(others)}) are not shown")
    found.notes += [f"scoring rules, {rules_line(p, e)}" for p, e in record.get("results", {}).items()
                    if p != "general" and isinstance(e, dict)]  # fmt: skip
    add_scores(found, bcap, image_root, f"b-CapScore: {record.get('label') or folder.name}")
