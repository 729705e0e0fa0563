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

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
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

# Each name from the module that defines it, on first use (PEP 562): `balcaprl score` imports
# balcaprl.evaluate.score, and importing this package must not import every protocol (and numpy) first.
_HOMES = {
    "PROTOCOLS": "config",
    "EvaluationConfig": "config",
    "load_evaluation_config": "config",
    "CapArenaItem": "formats",
    "CaptionQAEntry": "formats",
    "CaptionSet": "formats",
    "DeCapBenchItem": "formats",
    "read_caparena": "formats",
    "read_caption_sets": "formats",
    "read_captionqa": "formats",
    "read_decapbench": "formats",
    "ProtocolResult": "results",
    "read_eval": "suite",
    "run_suite": "suite",
}


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{_HOMES[name]}"), name)
    globals()[name] = value
    return value


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
