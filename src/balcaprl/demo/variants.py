"""The paper's ablations in miniature: each demo variant is a few recipe overrides on the demo recipe.

Names follow the paper's rows: Table 3 "leave-one-out" (with "w/o recap": ``no-recap`` trains
against the dataset's degraded ``reference_original``), Table 4 "length penalty" with its grid of the
mask's band (``tau-LOW-HIGH``; 0.5 / 2 is ``full``) and the appendix's precision-weight table
(``prec-W``; its 0 is ``no-precision`` and its 0.3 is ``full``). ``full`` is
the demo recipe itself, which is Table 3's "Full" (c-GDPO, equal weights 0.3 / 0.3 / 0.3,
pointability, length mask 0.5 / 2.0). Every variant changes exactly one thing relative to ``full``,
so a difference in the comparison table has one cause (``tau-0-3`` changes both bounds, as the paper's
row does). Each variant's ``claims`` are every direction the paper states for its row, in its text or
its table, as the ablation runner (:mod:`balcaprl.demo.ablation`) checks them.
"""

from __future__ import annotations

from dataclasses import dataclass

from balcaprl.errors import ConfigError


@dataclass(frozen=True)
class Claim:
    """One direction the paper states for a row, checkable on the held-out oracle figures: ``metric``
    (a per-scene record key of the demo's evaluation) is higher (``sign`` +1) or lower (-1) than in
    ``baseline`` ("start": the SFT policy, the paper's base model; any other name: that variant trained
    with the same seeds). ``basis``: where the paper states it (its words in short, or its table's two
    numbers).

    The paper's benchmarks map onto the miniature's held-out figures as: DCScore (the correctness and
    coverage view) -> ``b_capscore``; CaptionQA (how much of the image a caption lets one answer about)
    -> ``recall``; CapArena (preference, where fluency decides) -> ``linguistic``; Arena Length ->
    ``tokens``; hallucination (visually verifiable precision) -> ``precision``; meta-commentary ->
    ``non_pointable_share``."""

    metric: str
    sign: int
    baseline: str = "full"
    basis: str = ""


@dataclass(frozen=True)
class Variant:
    name: str
    overrides: tuple[str, ...]  # ``key.sub=value`` recipe overrides (balcaprl.config.apply_overrides)
    paper_row: str  # the row of the paper this mirrors
    expectation: str  # what the paper reports for it, to compare the miniature against
    claims: tuple[
        Claim, ...
    ] = ()  # every direction the paper states for it, as the ablation runner checks them


def _all_four(sign: int, baseline: str, basis: str) -> tuple[Claim, ...]:
    """A direction the paper states "across benchmarks": DCScore, CaptionQA and CapArena."""
    return tuple(Claim(m, sign, baseline, basis) for m in ("b_capscore", "recall", "linguistic"))


def _tau(low: float, high: float, claims: tuple[Claim, ...]) -> Variant:
    overrides = (f"rewards.length.tau_low={low:g}",) if low != 0.5 else ()
    return Variant(
        f"tau-{low:g}-{high:g}",
        (*overrides, f"rewards.length.tau_high={high:g}"),
        f"Table 4 'tau_l={low:g}, tau_u={high:g}'",
        "the mask's band; a longer upper bound lengthens captions, helping detail metrics at fluency's cost",
        claims,
    )


_TAU_TEXT = (
    "Table 4 text: longer captions 'generally improve CaptionQA and DCScore, but at the expense of CapArena'"
)

VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant(
            "full",
            (),
            "Table 3 'Full'",
            "all benchmarks rise; captions get longer (131 -> 203 words)",
            (
                *_all_four(
                    +1, "start", "Table 3: 52.0 / 75.0 / -12.0 against the base model's 43.3 / 70.0 / -34.0"
                ),
                Claim("tokens", +1, "start", "Table 3: 203 against 131 words"),
            ),
        ),
        Variant(
            "grpo",
            ("advantage.estimator=grpo",),
            "Table 3 'w/o c-GDPO'",
            "sum-then-normalise loses the reward trade-offs: worse than the base model on every benchmark, "
            "captions shrink (96 words)",
            (
                *_all_four(
                    -1, "start", "text: 'substantial performance degradation across benchmarks' vs the base"
                ),
                Claim("tokens", -1, "start", "Table 3: 96 against 131 words"),
                Claim("b_capscore", -1, "full", "Table 3: 38.0 against 52.0"),
                Claim("tokens", -1, "full", "Table 3: 96 against 203 words"),
            ),
        ),
        Variant(
            "no-precision",
            ("rewards.weights.precision=0",),
            "Table 3 'w/o Precision'",
            "keeps recall/fluency gains but precision-like DCScore drops: more hallucination; the weight "
            "table's worst row (w_prec = 0)",
            (
                Claim("b_capscore", -1, "full", "text: 'a clear drop in DCScore'"),
                Claim("precision", -1, "full", "text: 'reduces visually-verifiable precision'"),
                Claim("linguistic", +1, "start", "text: 'maintains the large gain in CapArena'"),
                *(
                    Claim(
                        "b_capscore",
                        -1,
                        f"prec-{w}",
                        "weight table: w_prec = 0 'leads to the worst overall performance'",
                    )
                    for w in ("0.1", "0.2", "0.4")
                ),
            ),
        ),
        Variant(
            "no-recall",
            ("rewards.weights.recall=0",),
            "Table 3 'w/o Recall'",
            "still above the base model, slightly below full; shorter captions (152 words)",
            (
                *_all_four(+1, "start", "text: 'above the baseline on all benchmarks'"),
                Claim("b_capscore", -1, "full", "text: 'only slightly below the full method'"),
                Claim("tokens", -1, "full", "Table 3: 152 against 203 words"),
            ),
        ),
        Variant(
            "no-linguistic",
            ("rewards.weights.linguistic=0",),
            "Table 3 'w/o Linguistic'",
            "detail metrics rise but fluency (CapArena) drops; captions ~3x longer (375 words)",
            (
                Claim(
                    "b_capscore",
                    +1,
                    "full",
                    "text: 'increases both CaptionQA and DCScore compared to even our full method'",
                ),
                Claim("recall", +1, "full", "the same sentence (CaptionQA)"),
                Claim("linguistic", -1, "full", "text: 'a substantial drop in CapArena'"),
                Claim("tokens", +1, "full", "text: 'approximately 3x increase in caption length'"),
            ),
        ),
        Variant(
            "no-pointability",
            ("rewards.pointability=false",),
            "Table 3 'w/o Pointability'",
            "reward hacking through fluent meta-commentary; worst CapArena",
            (
                *_all_four(-1, "full", "text: 'largely hurts the model' (39.2 / 63.5 / -85.7)"),
                Claim("non_pointable_share", +1, "full", "text: 'abusing the use of meta-commentary'"),
            ),
        ),
        Variant(
            "no-length",
            ("rewards.length.mode=none",),
            "Table 4 'w/o length penalty'",
            "captions shrink below the base model (81 words) to avoid mistakes; DCScore regresses",
            (
                Claim("b_capscore", -1, "start", "text: 'regresses in DCScore'"),
                Claim("recall", +1, "start", "text: 'slightly improves in CaptionQA and CapArena'"),
                Claim("linguistic", +1, "start", "the same sentence (CapArena)"),
                Claim("tokens", -1, "start", "text: 'caption length becomes shorter than its base model'"),
            ),
        ),
        Variant(
            "linear-length",
            ("rewards.length.mode=linear",),
            "Table 4 'w/ linear length penalty'",
            "better than no penalty, but shorter captions (90 words) and less balanced than the mask",
            (
                Claim("b_capscore", +1, "no-length", "text: 'this greatly improves DCScore'"),
                Claim("tokens", -1, "full", "text: the mask results 'in longer caption length'"),
                Claim(
                    "recall",
                    -1,
                    "full",
                    "text: the mask outperforms it 'in a more balanced way' (72.7 vs 75.3)",
                ),
                Claim("linguistic", -1, "full", "the same sentence (CapArena -33.0 vs -19.0)"),
            ),
        ),
        Variant(
            "no-recap",
            ("data.reference=reference_original",),
            "Table 3 'w/o recap with gpt-5-mini'",
            "the original, weaker references: consistent drops, slightly worse than no recall at all",
            (
                *_all_four(-1, "full", "text: 'consistent drops across benchmarks'"),
                Claim(
                    "b_capscore",
                    -1,
                    "no-recall",
                    "text: 'slightly worse than removing the recall reward altogether'",
                ),
            ),
        ),
        # The precision-weight table (Appendix): w_prec 0 is `no-precision`, 0.3 is `full`; its only
        # direction (0 is the worst) is checked on `no-precision`'s row.
        *(
            Variant(
                f"prec-{w:g}",
                (f"rewards.weights.precision={w:g}",),
                f"weight table 'w_prec = {w:g}'",
                "close to full; a higher precision weight trades the benchmarks against each other",
            )
            for w in (0.1, 0.2, 0.4)
        ),
        # Table 4's grid of the mask's band (tau_l = 0.5 with tau_u = 2 is `full`).
        _tau(
            0,
            3,
            (
                Claim(
                    "tokens",
                    -1,
                    "start",
                    "text: an upper bound alone 'is not sufficient to prevent' short captions (80 vs 131)",
                ),
                Claim("tokens", -1, "tau-0.5-3", "text: 'setting tau_l to 0.5 effectively mitigates this'"),
            ),
        ),
        _tau(
            0.5,
            1,
            (
                Claim("tokens", -1, "full", "Table 4: 121 against 203 words"),
                Claim("b_capscore", -1, "full", f"{_TAU_TEXT} (46.1 vs 52.0)"),
            ),
        ),
        *(
            _tau(0.5, h, (Claim("tokens", +1, "full", f"Table 4: {n} against 203 words"),))
            for h, n in ((3, 313), (4, 322), (5, 355))
        ),
        _tau(
            0.5,
            6,
            (
                Claim("tokens", +1, "full", "Table 4: 280 against 203 words"),
                Claim("b_capscore", +1, "tau-0.5-1", f"{_TAU_TEXT} (54.5 vs 46.1)"),
                Claim("recall", +1, "tau-0.5-1", "the same sentence (CaptionQA 75.8 vs 74.0)"),
                Claim("linguistic", -1, "tau-0.5-1", "the same sentence (CapArena -36.7 vs -17.7)"),
            ),
        ),
    )
}

# Named sets of variants (``--variants ablation``).
VARIANT_SETS: dict[str, tuple[str, ...]] = {
    "table3": ("full", "grpo", "no-precision", "no-recall", "no-linguistic", "no-pointability", "no-recap"),
    "table4": ("full", "no-length", "linear-length"),
    "tau": ("full", "tau-0-3", "tau-0.5-1", "tau-0.5-3", "tau-0.5-4", "tau-0.5-5", "tau-0.5-6"),
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
