"""Caption files for tests and benchmarks: captions of a synthetic dataset's images, of chosen kinds.

Each image gets one caption per kind: ``good`` (a fresh reference-style caption, not the stored
reference) or one of the synthetic world's flaw kinds (:data:`balcaprl.synthetic.flaws.FLAW_KINDS`:
hallucination, meta-commentary, ...), so the oracle's verdicts cover every mark a page can show.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from balcaprl.data.format import read_split_rows
from balcaprl.synthetic.captions import reference_caption
from balcaprl.synthetic.flaws import FLAW_KINDS, flawed_caption
from balcaprl.synthetic.oracle import SCENES_FILE
from balcaprl.synthetic.scenes import Scene

__all__ = ["CAPTION_KINDS", "synthetic_captions", "write_caption_jsonl"]

CAPTION_KINDS = ("good", *FLAW_KINDS)


def synthetic_captions(
    dataset: Path | str,
    kinds: Sequence[str] = CAPTION_KINDS,
    *,
    split: str = "train",
    seed: int = 0,
    limit: int | None = None,
) -> list[dict[str, Any]]:
    """``[{"id", "image", "caption", "reference", "kind"}, ...]``: per image of ``split`` (the first
    ``limit``), one caption of each kind, in that order. ``image`` is relative to the dataset folder."""
    root = Path(dataset)
    scenes = {}
    for line in (root / SCENES_FILE).read_text(encoding="utf-8").splitlines():
        if line.strip():
            record = json.loads(line)
            scenes[record["id"]] = Scene.from_dict(record["scene"])
    rng = random.Random(seed)
    rows = []
    for row in read_split_rows(root, split)[:limit]:
        scene = scenes[row["id"]]
        for kind in kinds:
            caption = reference_caption(scene, rng) if kind == "good" else flawed_caption(scene, kind, rng)  # type: ignore[arg-type]
            rows.append({"id": row["id"], "image": row["image"], "caption": caption,
                         "reference": row["reference"], "kind": kind})  # fmt: skip
    return rows


def write_caption_jsonl(
    rows: Sequence[dict[str, Any]], path: Path | str, keys: Sequence[str] = ("image", "caption")
) -> Path:
    """Write ``rows`` as JSONL with only ``keys`` (the caption-file format of ``balcaprl score``)."""
    path = Path(path)
    path.write_text("".join(json.dumps({k: r[k] for k in keys}, ensure_ascii=False) + "\n" for r in rows))
    return path
