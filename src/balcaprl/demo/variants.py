"""The paper's ablations in miniature: each demo variant is a few recipe overrides on the demo recipe.

Names follow the paper's rows: Table 3 "leave-one-out" (with "w/o recap": ``no-recap`` trains
against the dataset's degraded ``reference_original``), Table 4 "length penalty" and the appendix's
precision-weight table (``prec-W``; its 0 is ``no-precision`` and its 0.3 is ``full``). ``full`` is
the demo recipe itself, which is Table 3's "Full" (c-GDPO, equal weights 0.3 / 0.3 / 0.3,
pointability, length mask 0.5 / 2.0). Every variant changes exactly one thing relative to ``full``,
so a difference in the comparison table has one cause. Each variant's ``claims`` are the directions
the paper reports for its row, as the ablation runner (:mod:`balcaprl.demo.ablation`) checks them.
"""

from __future__ import annotations

from dataclasses import dataclass

from balcaprl.errors import ConfigError


@dataclass(frozen=True)
class Claim:
    """One direction the paper reports for a row, checkable on the held-out oracle figures: ``metric``
    (a per-scene record key of the demo's evaluation) is higher (``sign`` +1) or lower (-1) than in
    ``baseline`` ("full": the full method trained with the same seeds; "start": the SFT policy)."""

    metric: str
    sign: int
    baseline: str = "full"


@dataclass(frozen=True)
class Variant:
    name: str
    overrides: tuple[str, ...]  # ``key.sub=value`` recipe overrides (balcaprl.config.apply_overrides)
    paper_row: str  # the row of the paper this mirrors
    expectation: str  # what the paper reports for it, to compare the miniature against
    claims: tuple[Claim, ...] = ()  # the paper's directions, as the ablation runner checks them


VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant(
            "full",
            (),
            "Table 3 'Full'",
            "all benchmarks rise; captions get longer (131 -> 203 words)",
            (Claim("b_capscore", +1, "start"), Claim("tokens", +1, "start")),
        ),
        Variant(
            "grpo",
            ("advantage.estimator=grpo",),
            "Table 3 'w/o c-GDPO'",
            "sum-then-normalise loses the reward trade-offs: worse than the base model on every benchmark, "
            "captions shrink (96 words)",
            (Claim("b_capscore", -1), Claim("tokens", -1)),
        ),
        Variant(
            "no-precision",
            ("rewards.weights.precision=0",),
            "Table 3 'w/o Precision'",
            "keeps recall/fluency gains but precision-like DCScore drops: more hallucination; the weight "
            "table's worst row (w_prec = 0)",
            (Claim("non_visible_share", +1), Claim("b_capscore", -1)),
        ),
        Variant(
            "no-recall",
            ("rewards.weights.recall=0",),
            "Table 3 'w/o Recall'",
            "still above the base model, slightly below full; shorter captions (152 words)",
            (Claim("tokens", -1),),
        ),
        Variant(
            "no-linguistic",
            ("rewards.weights.linguistic=0",),
            "Table 3 'w/o Linguistic'",
            "detail metrics rise but fluency (CapArena) drops; captions ~3x longer (375 words)",
            (Claim("tokens", +1), Claim("fluency", -1)),
        ),
        Variant(
            "no-pointability",
            ("rewards.pointability=false",),
            "Table 3 'w/o Pointability'",
            "reward hacking through fluent meta-commentary; worst CapArena",
            (Claim("non_pointable_share", +1), Claim("b_capscore", -1)),
        ),
        Variant(
            "no-length",
            ("rewards.length.mode=none",),
            "Table 4 'w/o length penalty'",
            "captions shrink below the base model (81 words) to avoid mistakes; DCScore regresses",
            (Claim("tokens", -1, "start"),),
        ),
        Variant(
            "linear-length",
            ("rewards.length.mode=linear",),
            "Table 4 'w/ linear length penalty'",
            "better than no penalty, but shorter captions (90 words) and less balanced than the mask",
            (Claim("tokens", -1),),
        ),
        Variant(
            "no-recap",
            ("data.reference=reference_original",),
            "Table 3 'w/o recap with gpt-5-mini'",
            "the original, weaker references: consistent drops, slightly worse than no recall at all",
            (Claim("b_capscore", -1),),
        ),
        # The precision-weight table (Appendix): w_prec 0 is `no-precision`, 0.3 is `full`.
        *(
            Variant(
                f"prec-{w:g}",
                (f"rewards.weights.precision={w:g}",),
                f"weight table 'w_prec = {w:g}'",
                "close to full; a higher precision weight trades the benchmarks against each other",
            )
            for w in (0.1, 0.2, 0.4)
        ),
    )
}

# Named sets of variants (``--variants ablation``).
VARIANT_SETS: dict[str, tuple[str, ...]] = {
    "table3": ("full", "grpo", "no-precision", "no-recall", "no-linguistic", "no-pointability", "no-recap"),
    "table4": ("full", "no-length", "linear-length"),
    "weights": ("no-precision", "prec-0.1", "prec-0.2", "full", "prec-0.4"),
}


def get_variant(name: str) -> Variant:
    try:
        return VARIANTS[name]
    except KeyError:
        raise ConfigError(
            f"unknown variant {name!r}; choose from {', '.join(VARIANTS)} (or 'all', "
            f"{', '.join(repr(k) for k in VARIANT_SETS)})"
        ) from None


def parse_variants(spec: str) -> list[Variant]:
    """``"all"``, one name, or a comma-separated list (``"full,grpo"``), in the order given."""
    names: list[str] = []
    for part in (s.strip() for s in spec.split(",")):
        if part in ("all", "ablation"):  # every variant: Tables 3 and 4 and the weight table
            names += [n for n in VARIANTS if n not in names]
        elif part in VARIANT_SETS:
            names += [n for n in VARIANT_SETS[part] if n not in names]
        elif part:
            names.append(part)
    if not names:
        raise ConfigError("no variant named; choose from " + ", ".join(VARIANTS) + " (or 'all')")
    variants = [get_variant(n) for n in names]
    if len({v.name for v in variants}) != len(variants):
        raise ConfigError(f"variant named twice in {spec!r}")
    return variants
