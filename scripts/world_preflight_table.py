#!/usr/bin/env python3
"""Measure what the pre-flight checks (tests/synthetic/test_world_temptations.py) hold the world to, at
the world's defaults and over a range of each free world parameter they depend on
(docs/synthetic-world.md, "Pre-flight checks" and "World parameters").

    PYTHONPATH=src python scripts/world_preflight_table.py [--json FILE]

Prints markdown: for the two RL starts (the stand-in drawn from the SFT targets, and the fixed sample of
the demo's SFT policy's rollouts), each statistic, and the checks it fails against the thresholds the
tests derive (one rollout per 8 x 8 batch; the noise bound of a pooled within-group correlation; the
advantage correlation's 95% interval over prompts below 1). Then one table per free parameter
(``balcaprl.demo.parameters.WORLD_PARAMETERS`` names it): the stand-in redrawn at each value, and where
the parameter is the judge's or the references' (the SFT policy's captions do not depend on it), the
SFT sample re-judged too. A stand-in row's failed checks include the mechanisms' (each temptation's
paired direction over the same scenes, ``balcaprl.synthetic.mechanisms``). ``--json FILE`` also writes
the markdown and every row's numbers (what ``scripts/docs_figures.py run world-preflight`` records).
No training: about 1.5 CPU-minutes.
"""

from __future__ import annotations

import argparse
import importlib
import json
import random
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from balcaprl.demo.config import DatasetSettings, SFTSettings
from balcaprl.demo.parameters import WORLD_PARAMETERS, parameter_value
from balcaprl.synthetic.captions import reference_caption
from balcaprl.synthetic.lexicon import COLORS, KINDS
from balcaprl.synthetic.mechanisms import Mechanisms, measure_mechanisms
from balcaprl.synthetic.probe import Group, WorldProbe, load_groups, probe_groups, stand_in_groups
from balcaprl.synthetic.scenes import generate_scenes

SAMPLE = Path(__file__).resolve().parents[1] / "tests" / "synthetic" / "data" / "sft_rollouts.jsonl"
PROMPTS = 48  # the probe's prompts: the first 48 training scenes, as the SFT sample's


@dataclass(frozen=True)
class World:
    """One setting of the world: demo dataset settings changed, constants of ``balcaprl.synthetic``
    modules changed (``"captioners.ERROR_STEP": 0.06``), the share of flawed SFT targets."""

    dataset: dict[str, Any] = field(default_factory=dict)
    constants: dict[str, Any] = field(default_factory=dict)
    flawed_fraction: float = 0.5


@contextmanager
def world_constants(constants: dict[str, Any]) -> Iterator[None]:
    """The modules' constants set to ``constants`` for the block (read at call time by the code that
    uses them), then put back."""
    saved = []
    try:
        for key, value in constants.items():
            module_name, name = key.split(".")
            module = importlib.import_module(f"balcaprl.synthetic.{module_name}")
            saved.append((module, name, getattr(module, name)))  # an unknown constant fails here
            setattr(module, name, value)
        yield
    finally:
        for module, name, value in reversed(saved):
            setattr(module, name, value)


def stand_in(world: World) -> tuple[WorldProbe, Mechanisms]:
    """48 prompts x 8 draws from the SFT targets of ``world``'s scenes, judged in ``world``; and each
    mechanism's direction over the same scenes."""
    with world_constants(world.constants):
        scenes = generate_scenes(PROMPTS, seed=0, spec=DatasetSettings(**world.dataset).scene_spec())
        groups = stand_in_groups(scenes, random.Random(0), flawed_fraction=world.flawed_fraction)
        return probe_groups(groups), measure_mechanisms(scenes)


def mechanisms_in(world: World) -> Mechanisms:
    with world_constants(world.constants):
        return measure_mechanisms(
            generate_scenes(PROMPTS, seed=0, spec=DatasetSettings(**world.dataset).scene_spec())
        )


def rejudged(groups: list[Group], world: World) -> WorldProbe:
    """``groups``' captions judged in ``world``, against references re-captioned in it from their own
    stream (seeded as the dataset build seeds them: for the SFT sample, its stored references)."""
    with world_constants(world.constants):
        rng = random.Random(1)
        return probe_groups([Group(g.scene, reference_caption(g.scene, rng), g.captions) for g in groups])


@dataclass(frozen=True)
class Sweep:
    """A free parameter over a range: its table's name (as WORLD_PARAMETERS names it), the values'
    labels and worlds (the code's own value among them), and whether the captions stay fixed (a
    judge-side parameter: the stand-in's captions drawn once and the SFT sample re-judged)."""

    name: str
    values: tuple[tuple[str, World], ...]
    judge_side: bool = False


def is_default(world: World) -> bool:
    """Is ``world`` the world the code and the demo's defaults make?"""
    return (
        all(getattr(_DEMO, k) == tuple(v) if isinstance(v, list | tuple) else getattr(_DEMO, k) == v
            for k, v in world.dataset.items())
        and all(parameter_value(k) == v for k, v in world.constants.items())
        and world.flawed_fraction == SFTSettings().flawed_fraction
    )  # fmt: skip


def _palette(n: int, demo: tuple[str, ...], world: tuple[str, ...]) -> tuple[str, ...]:
    """The first ``n`` of the demo's words, then the rest of the world's, in the lexicon's order."""
    return (demo + tuple(w for w in world if w not in demo))[:n]


_DEMO = DatasetSettings()
_ORIGINAL = (
    "captioners.ORIGINAL_WRONG_ATTRIBUTE",
    "captioners.ORIGINAL_COMMENTARY",
    "captioners.ORIGINAL_INFERENCE",
)
_ERRORS = ("captioners.ERROR_FIRST", "captioners.ERROR_STEP", "captioners.ERROR_SMALL")

SWEEPS: tuple[Sweep, ...] = (
    Sweep("flawed share", tuple((f"{f:g}", World(flawed_fraction=f)) for f in (0, 0.25, 0.5, 0.75, 1))),
    Sweep(
        "shapes per scene",
        tuple(
            (f"{lo}-{hi}", World(dataset={"min_objects": lo, "max_objects": hi}))
            for lo, hi in ((1, 1), (2, 2), (2, 3), (3, 3), (2, 5), (4, 7))
        ),
    ),
    Sweep(
        "kinds x colours",
        tuple(
            (
                f"{n} x {n}",
                World(
                    dataset={
                        "kinds": _palette(n, _DEMO.kinds, KINDS),
                        "colors": _palette(n, _DEMO.colors, COLORS),
                    }
                ),
            )  # fmt: skip
            for n in (2, 3, 4, 6, 8)
        ),
    ),
    Sweep(
        "words and textures",
        tuple(
            (f"{t:g} / {b:g}", World(dataset={"text_probability": t, "texture_probability": b}))
            for t, b in ((0, 0), (0.3, 0), (0, 0.5), (0.3, 0.5))
        ),
    ),
    Sweep(
        "reference relations",
        tuple(
            (str(k), World(constants={"captions.RELATIONS_BY_SCENE_SIZE": ((3, k), (5, 2), (9, 1))}))
            for k in (0, 1, 2, 3, 4, 6)
        ),
        judge_side=True,
    ),
    Sweep(
        "overload step",
        tuple((str(w), World(constants={"linguistic.OVERLOAD_WORDS": w})) for w in (5, 10, 20, 40)),
        judge_side=True,
    ),
    Sweep(
        "error schedule",
        tuple(
            (f"x{s:g}", World(constants={k: round(parameter_value(k) * s, 4) for k in _ERRORS}))
            for s in (0, 0.5, 1, 1.5, 2)
        ),
    ),
    Sweep(
        "base mode mix",
        tuple(
            (
                f"{1 - 2 * s:.2g} / {s:g} / {s:g}",
                World(
                    constants={
                        "captioners.BASE_MODE_WEIGHTS": {"detailed": 1 - 2 * s, "terse": s, "enumerating": s}
                    }
                ),
            )
            for s in (0.05, 0.1, 0.15, 0.25, 0.35)
        ),  # fmt: skip
    ),
    Sweep(
        "terse names a shape",
        tuple((f"{c:g}", World(constants={"captioners.TERSE_NAMES_A_SHAPE": c})) for c in (0, 0.5, 1)),
    ),
    Sweep(
        "original caption noise",
        tuple(
            (f"x{s:g}", World(constants={k: round(min(1.0, parameter_value(k) * s), 4) for k in _ORIGINAL}))
            for s in (0, 0.5, 1, 1.4)
        ),
    ),
    Sweep(
        "guesses per shape",
        tuple((str(g), World(constants={"captioners.GUESSES_PER_SHAPE": g})) for g in (1, 2, 4, 6)),
    ),
)

COLUMNS = (
    "| terse | below / above band | P, R vs length (noise) | P-R corr | c-GDPO vs GRPO corr [95%] "
    "| GRPO variance P / R / L | fails |"
)


def measured(probe: WorldProbe, mechanisms: Mechanisms | None = None, *, upper_side: bool) -> dict[str, Any]:
    """A start's statistics and the checks it fails (``upper_side``: the band's upper side is asked),
    with the mechanisms' checks where given (the stand-in's rows: the world's own captioners)."""
    low, high = probe.table.interval(lambda t: t.advantage_corr())
    mechanism_fails = mechanisms.failed_checks() if mechanisms else []
    return {
        "terse": probe.terse_share,
        "below": probe.below_band_share,
        "above": probe.above_band_share,
        "length_corr": list(probe.length_corr[:2]),
        "noise_bound": probe.noise_bound,
        "precision_recall_corr": probe.precision_recall_corr,
        "advantage_corr": [probe.advantage_corr, low, high],
        "variance_shares": list(probe.variance_shares),
        "fails": probe.failed_checks(upper_side=upper_side) + mechanism_fails,
        "mechanisms": {
            name: [d.mean, d.se] for name, d in (mechanisms.directions.items() if mechanisms else ())
        },
    }


def cells(row: dict[str, Any]) -> str:
    corr, low, high = row["advantage_corr"]
    p_len, r_len = row["length_corr"]
    shares = " / ".join(f"{s:.2f}" for s in row["variance_shares"])
    return (
        f"| {row['terse']:.1%} | {row['below']:.1%} / {row['above']:.1%} "
        f"| {p_len:+.2f} / {r_len:+.2f} (±{row['noise_bound']:.2f}) | {row['precision_recall_corr']:+.2f} "
        f"| {corr:.3f} [{low:.3f}, {high:.3f}] | {shares} | {', '.join(row['fails']) or 'none'} |"
    )


def _header(first: str) -> str:
    return f"| {first} {COLUMNS}\n| --- |" + " ---: |" * 6 + " --- |"


def sweep_rows(sweep: Sweep, sft_groups: list[Group]) -> list[dict[str, Any]]:
    rows = []
    starts = ("stand-in", "SFT sample") if sweep.judge_side else ("stand-in",)
    if sweep.judge_side:  # the captions drawn once, at the defaults (the stand-in's own references)
        fixed_stand_in = stand_in_groups(
            generate_scenes(PROMPTS, seed=0, spec=_DEMO.scene_spec()), random.Random(0)
        )
    for start in starts:
        for label, world in sweep.values:
            mechanisms = None
            if not sweep.judge_side:
                probe, mechanisms = stand_in(world)
            else:
                probe = rejudged(fixed_stand_in if start == "stand-in" else sft_groups, world)
                mechanisms = mechanisms_in(world) if start == "stand-in" else None
            row = measured(probe, mechanisms, upper_side=start == "stand-in")
            rows.append({"value": label, "default": is_default(world), "start": start, **row})
    return rows


def _parameter(name: str):
    return next(p for p in WORLD_PARAMETERS if p.table == name)


def markdown(starts: list[dict[str, Any]], sweeps: dict[str, list[dict[str, Any]]]) -> str:
    out = [_header("start")]
    out += [f"| {row['start']} {cells(row)}" for row in starts]
    for sweep in SWEEPS:
        parameter = _parameter(sweep.name)
        keys = ", ".join(f"`{k}`" for k in parameter.keys)
        out += ["", f"#### {sweep.name}", ""]
        judged = (
            " The captions stay as drawn at the defaults; the references are re-captioned in each setting, "
            "so the SFT sample is re-judged too."
            if sweep.judge_side
            else ""
        )
        default = next(label for label, world in sweep.values if is_default(world))
        out += [f"{keys} ({parameter.source}); the default is {default}.{judged}", ""]
        first = "value, start" if sweep.judge_side else "value"
        out.append(_header(first))
        for row in sweeps[sweep.name]:
            label = row["value"] + (" (default)" if row["default"] else "")
            label += f", {row['start']}" if sweep.judge_side else ""
            out.append(f"| {label} {cells(row)}")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="also write the markdown and the rows' numbers here")
    args = parser.parse_args(argv)
    _, sft_groups = load_groups(SAMPLE)
    starts = [
        {"start": "stand-in (SFT targets)", **measured(*stand_in(World()), upper_side=True)},
        {"start": "SFT policy (fixed sample)", **measured(probe_groups(sft_groups), upper_side=False)},
    ]
    sweeps = {sweep.name: sweep_rows(sweep, sft_groups) for sweep in SWEEPS}
    text = markdown(starts, sweeps)
    print(text, end="")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps({"markdown": text, "starts": starts, "sweeps": sweeps}, indent=1) + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
