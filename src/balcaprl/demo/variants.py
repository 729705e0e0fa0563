"""The paper's ablations in miniature: each demo variant is a few recipe overrides on the demo recipe.

Names follow the paper's rows (Table 3 "leave-one-out", Table 4 "length penalty"); ``full`` is the
demo recipe itself, which is Table 3's "Full" (c-GDPO, equal weights 0.3 / 0.3 / 0.3, pointability,
length mask 0.5 / 2.0). Every variant changes exactly one thing relative to ``full``, so a difference
in the comparison table has one cause.
"""

from __future__ import annotations

from dataclasses import dataclass

from balcaprl.errors import ConfigError

__all__ = ["VARIANTS", "Variant", "get_variant", "parse_variants"]


@dataclass(frozen=True)
class Variant:
    name: str
    overrides: tuple[str, ...]  # ``key.sub=value`` recipe overrides (balcaprl.config.apply_overrides)
    paper_row: str  # the row of the paper this mirrors
    expectation: str  # what the paper reports for it, to compare the miniature against


VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant("full", (), "Table 3 'Full'", "all benchmarks rise; captions get longer (131 -> 203 words)"),
        Variant(
            "grpo",
            ("advantage.estimator=grpo",),
            "Table 3 'w/o c-GDPO'",
            "sum-then-normalise loses the reward trade-offs: worse than the base model on every benchmark, "
            "captions shrink (96 words)",
        ),
        Variant(
            "no-precision",
            ("rewards.weights.precision=0",),
            "Table 3 'w/o Precision'",
            "keeps recall/fluency gains but precision-like DCScore drops: more hallucination",
        ),
        Variant(
            "no-recall",
            ("rewards.weights.recall=0",),
            "Table 3 'w/o Recall'",
            "still above the base model, slightly below full; shorter captions (152 words)",
        ),
        Variant(
            "no-linguistic",
            ("rewards.weights.linguistic=0",),
            "Table 3 'w/o Linguistic'",
            "detail metrics rise but fluency (CapArena) drops; captions ~3x longer (375 words)",
        ),
        Variant(
            "no-pointability",
            ("rewards.pointability=false",),
            "Table 3 'w/o Pointability'",
            "reward hacking through fluent meta-commentary; worst CapArena",
        ),
        Variant(
            "no-length",
            ("rewards.length.mode=none",),
            "Table 4 'w/o length penalty'",
            "captions shrink below the base model (81 words) to avoid mistakes; DCScore regresses",
        ),
        Variant(
            "linear-length",
            ("rewards.length.mode=linear",),
            "Table 4 'w/ linear length penalty'",
            "better than no penalty, but shorter captions (90 words) and less balanced than the mask",
        ),
    )
}


def get_variant(name: str) -> Variant:
    try:
        return VARIANTS[name]
    except KeyError:
        raise ConfigError(f"unknown variant {name!r}; choose from {', '.join(VARIANTS)} (or 'all')") from None


def parse_variants(spec: str) -> list[Variant]:
    """``"all"``, one name, or a comma-separated list (``"full,grpo"``), in the order given."""
    names = list(VARIANTS) if spec.strip() == "all" else [s.strip() for s in spec.split(",") if s.strip()]
    if not names:
        raise ConfigError("no variant named; choose from " + ", ".join(VARIANTS) + " (or 'all')")
    variants = [get_variant(n) for n in names]
    if len({v.name for v in variants}) != len(variants):
        raise ConfigError(f"variant named twice in {spec!r}")
    return variants
