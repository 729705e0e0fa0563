"""Two judges' outcomes on the same items, compared: flags, rewards, ranks.

Items where either judge failed are left out of every figure (and counted). Rewards are scored
with the metric's rule (:data:`balcaprl.rewards.BCAPSCORE_REWARDS`: pointability on, no length
control; the length mask does not depend on the judge), and b-CapScore is their harmonic mean.
Flags are compared over paired assertions (:mod:`balcaprl.judge.audit.pairing`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from balcaprl.judge.audit.agreement import (
    cohen_kappa,
    kendall_tau_b,
    mean_abs_diff,
    pairwise_order_agreement,
    pearson,
    spearman,
)
from balcaprl.judge.audit.pairing import pair_assertions
from balcaprl.judge.protocol import Judgement, JudgeOutcome
from balcaprl.rewards import BCAPSCORE_REWARDS, REWARD_NAMES, Verdict, b_capscore, score_rollout

FLAGS = ("pointable", "visible", "covered")
SCORES = (*REWARD_NAMES, "b_capscore")


def item_scores(verdict: Verdict) -> dict[str, float]:
    """precision, recall, linguistic (the metric's rule) and b-CapScore of one verdict, in [0, 1]."""
    r = score_rollout(verdict, BCAPSCORE_REWARDS)
    return {"precision": r.precision, "recall": r.recall, "linguistic": r.linguistic,
            "b_capscore": float(b_capscore(r.precision, r.recall, r.linguistic))}  # fmt: skip


def _flag_figures(x: list[bool], y: list[bool]) -> dict[str, Any]:
    n = len(x)
    return {
        "pairs": n,
        "agreement": float(np.mean(np.asarray(x) == np.asarray(y))) if n else None,
        "kappa": cohen_kappa(x, y),
        "x_true_rate": float(np.mean(x)) if n else None,
        "y_true_rate": float(np.mean(y)) if n else None,
    }


def _error_figures(truth: list[bool], judged: list[bool]) -> dict[str, Any]:
    """A judge's flags against a reference judge's: error rate, and its two kinds."""
    t, j = np.asarray(truth, dtype=bool), np.asarray(judged, dtype=bool)
    return {
        "pairs": int(t.size),
        "error_rate": float(np.mean(t != j)) if t.size else None,
        "false_true_rate": float(np.mean(j[~t]))
        if (~t).any()
        else None,  # says true where the reference says false
        "false_false_rate": float(np.mean(~j[t]))
        if t.any()
        else None,  # says false where the reference says true
    }


def compare_outcomes(
    x: Sequence[JudgeOutcome], y: Sequence[JudgeOutcome], *, reference: bool = False
) -> dict[str, Any]:
    """Figures comparing outcomes ``x`` and ``y`` of the same items (in order). ``reference=True``:
    ``x`` is a reference judge (the synthetic oracle), and each flag also gets ``y``'s error rates."""
    if len(x) != len(y):
        raise ValueError(f"outcomes must be paired, got {len(x)} and {len(y)}")
    flags: dict[str, tuple[list[bool], list[bool]]] = {f: ([], []) for f in FLAGS}
    unpaired = {"caption": [0, 0], "reference": [0, 0]}
    split_differently = 0
    scores: dict[str, tuple[list[float], list[float]]] = {s: ([], []) for s in SCORES}
    both = 0
    for a, b in zip(x, y, strict=True):
        if not (isinstance(a, Judgement) and isinstance(b, Judgement)):
            continue
        both += 1
        va, vb = a.verdict, b.verdict
        differs = False
        for which, la, lb, names in (
            ("caption", va.caption_assertions, vb.caption_assertions, ("pointable", "visible")),
            ("reference", va.reference_assertions, vb.reference_assertions, ("covered",)),
        ):
            pairing = pair_assertions([t.text for t in la], [t.text for t in lb])
            unpaired[which][0] += len(pairing.unpaired_x)
            unpaired[which][1] += len(pairing.unpaired_y)
            differs |= bool(pairing.unpaired_x or pairing.unpaired_y)
            for i, j in pairing.pairs:
                for name in names:
                    flags[name][0].append(getattr(la[i], name))
                    flags[name][1].append(getattr(lb[j], name))
        split_differently += differs
        sa, sb = item_scores(va), item_scores(vb)
        for name in SCORES:
            scores[name][0].append(sa[name])
            scores[name][1].append(sb[name])
    result: dict[str, Any] = {
        "items": len(x),
        "both_judged": both,
        "flags": {name: _flag_figures(*flags[name]) for name in FLAGS},
        "unpaired": {which: {"x": n[0], "y": n[1]} for which, n in unpaired.items()},
        "items_split_differently": split_differently,
        "scores": {},
    }
    if reference:
        result["errors"] = {name: _error_figures(*flags[name]) for name in FLAGS}
    for name in SCORES:
        u, v = scores[name]
        d = np.asarray(v) - np.asarray(u)
        result["scores"][name] = {
            "pearson": pearson(u, v),
            "spearman": spearman(u, v),
            "mean_abs_diff": mean_abs_diff(u, v),
            "mean_x": float(np.mean(u)) if u else None,
            "mean_y": float(np.mean(v)) if v else None,
            # test-retest noise of one judgement: the sd of a difference of two is sqrt(2) times it
            "noise_sd": float(d.std(ddof=1) / np.sqrt(2)) if d.size > 1 else None,
            "changed_share": float(np.mean(np.abs(d) > 1e-12)) if d.size else None,
        }
    u, v = scores["b_capscore"]
    result["rank"] = {
        "kendall_tau_b": kendall_tau_b(u, v),
        "pairwise_order_agreement": pairwise_order_agreement(u, v),
    }
    return result
