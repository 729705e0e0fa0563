"""b-CapScore (the paper's Appendix "A Balanced Captioning Metric"): the harmonic mean of
pointability-aware precision, reference recall and linguistic quality, judged with the evaluation
rubric against DeCapBench's images and human reference captions (GPT-5.4 as judge in Table 1).

This is `balcaprl score` (:func:`balcaprl.evaluate.score.score_captions`) run on the benchmark: the
captions and the human references are written as ``{image: text}`` files in the protocol's folder
and scored there, so ``scores.jsonl`` and ``summary.json`` are exactly what ``balcaprl score`` writes.
The evaluation rubric is our wording of the paper's evaluation prompt; the summary records it as such
(``settings.prompts``), and `balcaprl report` marks the number as not the paper's own prompt's.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

from pydantic import Field

from balcaprl.evaluate.formats import CaptionSet, DeCapBenchItem, read_decapbench
from balcaprl.evaluate.official import PromptSource
from balcaprl.evaluate.protocols import Protocol, ProtocolSection
from balcaprl.evaluate.results import ProtocolResult
from balcaprl.evaluate.score import score_captions
from balcaprl.files import atomic_write_json_text
from balcaprl.judge.client import OpenAICompatibleJudge, build_judge


class BCapScoreSection(ProtocolSection):
    """b-CapScore's files (its options are the judge config's)."""

    INPUTS = {
        "annotations": ("DeCapBench annotations", "--decapbench"),
        "images": ("the DeCapBench image folder", "--decapbench-images"),
    }
    annotations: Path | None = Field(None, description="DeCapBench annotation JSONL (human references).")
    images: Path | None = Field(None, description="DeCapBench image folder.")


def run_bcapscore(
    judge: OpenAICompatibleJudge,
    items: Sequence[DeCapBenchItem],
    captions: CaptionSet,
    out_dir: Path,
    settings: BCapScoreSection | None = None,
    *,
    on_progress: Callable[[int, int], None] | None = None,
    prompts: None = None,
    label: str | None = None,
) -> ProtocolResult:
    """Score the DeCapBench images that have a caption; ``judge`` resolves images in the image folder
    (b-CapScore has no options and no official prompts: ``settings``, ``prompts`` and ``label`` are
    there for the one signature of every protocol)."""
    out_dir = Path(out_dir)
    chosen = [(item, captions.lookup(item.key)) for item in items]
    missing = [item.key for item, caption in chosen if caption is None]
    chosen = [(item, caption) for item, caption in chosen if caption is not None]
    captions_file, references_file = out_dir / "captions.json", out_dir / "references.json"
    # a text that is no valid Unicode is written as its escape: score refuses its row (bad_input)
    for path, texts in ((captions_file, {i.key: c for i, c in chosen}),
                        (references_file, {i.key: i.oracle_caption for i, _ in chosen})):  # fmt: skip
        atomic_write_json_text(path, json.dumps(texts, indent=1, ensure_ascii=False))
    total = len(chosen)
    done = 0

    def progress(i, outcome) -> None:
        nonlocal done
        done += 1
        if on_progress is not None:
            on_progress(done, total)

    run = score_captions(judge, captions_file, references_file, out_dir, on_outcome=progress)
    summary = run.summary
    metrics = {
        name: (None if figures is None else figures["mean"] * (1 if name == "b_capscore" else 100))
        for name, figures in summary["metrics"].items()
    }
    metrics["ci95"] = (
        (summary["metrics"]["b_capscore"] or {}).get("ci95_low"),
        (summary["metrics"]["b_capscore"] or {}).get("ci95_high"),
    )
    return ProtocolResult(
        protocol="bcapscore",
        score=metrics["b_capscore"],
        metrics=metrics,
        n_items=len(items),
        n_scored=summary["n_scored"],
        failures=summary["failures"],
        missing=missing,
        settings={
            "rubric": "evaluation",
            "rubric_version": summary["judge"]["rubric_version"],
            "reference_mode": summary["judge"]["reference_mode"],
            "prompts": PromptSource(
                "paraphrase", "bcapscore", rubrics={"evaluation": summary["judge"]["rubric_version"]}
            ).as_dict(),
        },  # fmt: skip
        judge=summary["judge"]["model"],
        stats=summary["accounting"],
        notes="b-CapScore x100 (mean of per-caption harmonic means); precision, recall, linguistic x100; "
        "scores.jsonl/summary.json as `balcaprl score` writes them",
    )


PROTOCOL = Protocol(
    name="bcapscore", benchmark="decapbench", title="b-CapScore (DeCapBench).", section=BCapScoreSection,
    read=lambda section: read_decapbench(section.annotations), run=run_bcapscore,
    client=build_judge,
)  # fmt: skip
