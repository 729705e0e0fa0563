"""Held-out oracle b-CapScore of a policy (or of any captions) on a synthetic dataset split.

Used by ``balcaprl synthetic sft`` to print its three figures (random init, after SFT, references),
and by the demo for its before/after table. Judged with the oracle's ``evaluation`` rubric (the
paper's b-CapScore rubric) and scored as the metric is defined, ``BCAPSCORE_REWARDS`` (pointability
on, no length mask), whatever a training recipe chose. Each caption is judged once; its verdict and
scores are kept (``CaptionScores.scored``) for every figure a caller reports.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image

from balcaprl.data.format import read_split_rows
from balcaprl.judge.protocol import Judgement, JudgeOutcome, JudgeRequest, Rubric, sendable_requests
from balcaprl.rewards import BCAPSCORE_REWARDS, RolloutRecord, b_capscore, score_rollout
from balcaprl.synthetic.oracle import OracleJudge
from balcaprl.synthetic.policy import caption_token_counts, generate_captions


@dataclass
class CaptionScores:
    """Dataset-level figures: b-CapScore x100 as the paper reports it, the rest as means in [0, 1]."""

    b_capscore: float
    precision: float
    recall: float
    linguistic: float
    n: int
    failures: int = 0
    mean_tokens: float | None = None
    per_caption: list[float] = field(default_factory=list, repr=False)  # b-CapScore in [0, 1], 0 if failed
    captions: list[str] = field(default_factory=list, repr=False)
    outcomes: list[JudgeOutcome] = field(default_factory=list, repr=False)  # the one judgement per caption
    # The record of each caption, None where the judge failed.
    scored: list[RolloutRecord | None] = field(default_factory=list, repr=False)

    def summary(self) -> str:
        tokens = f", {self.mean_tokens:.0f} tokens" if self.mean_tokens is not None else ""
        return (
            f"b-CapScore {self.b_capscore:5.1f} (P {self.precision:.2f}, R {self.recall:.2f}, "
            f"L {self.linguistic:.2f}{tokens}, n={self.n})"
        )


def score_captions(
    oracle: OracleJudge,
    rows: Sequence[dict[str, Any]],
    captions: Sequence[str],
    rubric: Rubric = "evaluation",
) -> CaptionScores:
    """Oracle-score ``captions[i]`` against ``rows[i]`` (its image and reference). A failed judgement
    counts as 0 (a caption the judge cannot score has no quality to report)."""
    if len(rows) != len(captions):
        raise ValueError(f"{len(rows)} rows but {len(captions)} captions")
    requests = [
        JudgeRequest(image=r["image_path"], caption=c, reference=r["reference"], rubric=rubric)
        for r, c in zip(rows, captions, strict=True)
    ]
    # a text that is no valid Unicode (a lone surrogate) is a bad_input, never judged as cleaned
    batch = sendable_requests(requests, [f"row {r.get('id', i)!r}" for i, r in enumerate(rows)])
    outcomes = batch.outcomes(asyncio.run(oracle.judge_batch(batch.sent)))
    per, prec, rec, ling, scored = [], [], [], [], []
    for outcome in outcomes:
        if isinstance(outcome, Judgement):
            v = score_rollout(outcome.verdict, BCAPSCORE_REWARDS)
            per.append(float(b_capscore(v.precision, v.recall, v.linguistic)))
            prec.append(v.precision)
            rec.append(v.recall)
            ling.append(v.linguistic)
            scored.append(v)
        else:
            per.append(0.0)
            scored.append(None)
    mean = lambda xs: sum(xs) / len(xs) if xs else 0.0  # noqa: E731
    return CaptionScores(
        b_capscore=100 * mean(per),
        precision=mean(prec),
        recall=mean(rec),
        linguistic=mean(ling),
        n=len(per),
        failures=scored.count(None),
        per_caption=per,
        captions=list(captions),
        outcomes=list(outcomes),
        scored=scored,
    )


def evaluate_policy(
    model: Any,
    processor: Any,
    dataset_dir: Path | str,
    *,
    split: str = "eval",
    limit: int | None = 200,
    max_new_tokens: int = 192,
    oracle: OracleJudge | None = None,
) -> CaptionScores:
    """Greedy captions for the first ``limit`` images of ``split``, scored by the oracle."""
    rows = read_split_rows(dataset_dir, split)[:limit]
    oracle = oracle or OracleJudge.from_dataset(dataset_dir)
    images = [Image.open(r["image_path"]).convert("RGB") for r in rows]
    captions = generate_captions(model, processor, images, max_new_tokens=max_new_tokens)
    scores = score_captions(oracle, rows, captions)
    counts = caption_token_counts(processor, captions)
    scores.mean_tokens = sum(counts) / len(counts) if counts else 0.0
    return scores
