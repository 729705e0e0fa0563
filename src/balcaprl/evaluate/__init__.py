"""Evaluation: caption generation, the captioning benchmarks' protocols on our judge client
(b-CapScore, DCScore, CaptionQA, CapArena-Auto), lmms-eval's general benchmarks, and reports in the
paper's Table 1 form.

    balcaprl caption  --model CKPT --benchmark caparena --annotations caparena_auto_600.json \\
                      --images docci/ --out runs/x/captions.jsonl
    balcaprl evaluate --captions runs/x/captions.jsonl --suite caparena --judge judge.yaml \\
                      --caparena caparena_auto_600.json --caparena-images docci/ --out runs/x/eval
    balcaprl report   runs/base/eval runs/x/eval --baseline base --published qwen2.5-vl-3b

Library use: :func:`run_suite` (all protocols), or one protocol's ``run_*`` with a
:class:`~balcaprl.judge.JudgeCaller`; the scoring arithmetic is in pure functions
(:func:`~balcaprl.evaluate.dcscore.score_trial`, :func:`~balcaprl.evaluate.captionqa.score_answer`,
:func:`~balcaprl.evaluate.caparena.arena_scores`, :func:`~balcaprl.evaluate.report.spearman`).
"""

from balcaprl.evaluate.config import PROTOCOLS, EvaluationConfig, load_evaluation_config
from balcaprl.evaluate.formats import (
    CapArenaItem,
    CaptionQAEntry,
    CaptionSet,
    DeCapBenchItem,
    read_caparena,
    read_caption_sets,
    read_captionqa,
    read_decapbench,
)
from balcaprl.evaluate.results import ProtocolResult
from balcaprl.evaluate.suite import read_eval, run_suite

__all__ = [
    "PROTOCOLS",
    "CapArenaItem",
    "CaptionQAEntry",
    "CaptionSet",
    "DeCapBenchItem",
    "EvaluationConfig",
    "ProtocolResult",
    "load_evaluation_config",
    "read_caparena",
    "read_caption_sets",
    "read_captionqa",
    "read_decapbench",
    "read_eval",
    "run_suite",
]
