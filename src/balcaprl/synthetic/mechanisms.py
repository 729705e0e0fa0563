"""Each temptation's direction, measured paired over the same scenes (docs/synthetic-world.md, "The
temptations"): the pre-flight checks of the mechanisms (tests/synthetic/test_world_temptations.py) and
the columns of scripts/world_preflight_table.py read these.

A direction the paper states is there when the paired mean difference exceeds 1.96 standard errors on
the stated side; no size is asked for, since the paper states none (:class:`Direction`).
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from balcaprl.rewards import BCAPSCORE_REWARDS, b_capscore, score_rollout, score_verdict
from balcaprl.synthetic.captioners import base_caption, original_caption
from balcaprl.synthetic.captions import reference_caption
from balcaprl.synthetic.lexicon import words_of
from balcaprl.synthetic.oracle import oracle_verdict
from balcaprl.synthetic.parser import parse_caption
from balcaprl.synthetic.probe import ONE_PER_BATCH
from balcaprl.synthetic.scenes import Scene


@dataclass(frozen=True)
class Direction:
    """The mean of paired differences x - y and its standard error."""

    mean: float
    se: float

    @classmethod
    def of(cls, xs: Sequence[float], ys: Sequence[float]) -> Direction:
        diffs = [float(x) - float(y) for x, y in zip(xs, ys, strict=True)]
        return cls(statistics.mean(diffs), statistics.stdev(diffs) / math.sqrt(len(diffs)))

    @property
    def holds(self) -> bool:
        """x above y by more than the noise of the mean difference (1.96 standard errors)."""
        return self.mean > 1.96 * self.se


@dataclass(frozen=True)
class Mechanisms:
    directions: dict[str, Direction]  # each oriented so that the paper's direction is > 0
    enumerating_past_twice: float  # share of enumerating captions past tau_u = 2 x the reference

    def failed_checks(self) -> list[str]:
        failed = [name for name, direction in self.directions.items() if not direction.holds]
        return failed + (["enumerating past 2x"] if self.enumerating_past_twice < ONE_PER_BATCH else [])


def _rewards(scene: Scene, caption: str, reference: str):
    return score_verdict(oracle_verdict(scene, caption, reference))


def held_out_b_capscore(scene: Scene, caption: str, reference: str) -> float:
    """b-CapScore as the demo's held-out evaluation computes it (evaluation rubric, no length mask)."""
    r = score_rollout(oracle_verdict(scene, caption, reference, "evaluation"), BCAPSCORE_REWARDS)
    return b_capscore(r.precision, r.recall, r.linguistic)


def first_named_right_more_often(scenes: Sequence[Scene], draws: int = 400) -> Direction:
    """Is the first shape a detailed base caption names right more often than the last?"""
    first, last = [], []
    for i in range(draws):
        scene = scenes[i % len(scenes)]
        parsed = parse_caption(base_caption(scene, random.Random(i), "detailed"), scene)
        objects = [a for a in parsed.assertions if a.kind == "object"]
        first.append(objects[0].visible)
        last.append(objects[-1].visible)
    return Direction.of(first, last)


def measure_mechanisms(scenes: Sequence[Scene]) -> Mechanisms:
    """Every mechanism's direction over ``scenes`` (scene i's captions and reference seeded by i)."""
    detailed, enumerating, past_twice, terse_eval, detailed_eval, original, recap = [], [], [], [], [], [], []
    for i, scene in enumerate(scenes):
        reference = reference_caption(scene, random.Random(i))
        detailed_caption = base_caption(scene, random.Random(i), "detailed")
        enumerating_caption = base_caption(scene, random.Random(i), "enumerating")
        detailed.append(_rewards(scene, detailed_caption, reference))
        enumerating.append(_rewards(scene, enumerating_caption, reference))
        past_twice.append(len(words_of(enumerating_caption)) > 2 * len(words_of(reference)))
        terse_eval.append(
            held_out_b_capscore(scene, base_caption(scene, random.Random(i), "terse"), reference)
        )
        detailed_eval.append(held_out_b_capscore(scene, detailed_caption, reference))
        original.append(_rewards(scene, original_caption(scene, random.Random(i)), reference))
        recap.append(_rewards(scene, reference, reference))

    def of(rows, key):
        return [getattr(row, key) for row in rows]

    return Mechanisms(
        directions={
            "first named right": first_named_right_more_often(scenes),
            # captions made long to raise recall, at the cost of hallucination and fluency
            "enumerating recall": Direction.of(of(enumerating, "recall"), of(detailed, "recall")),
            "enumerating precision": Direction.of(of(detailed, "precision"), of(enumerating, "precision")),
            "enumerating linguistic": Direction.of(of(detailed, "linguistic"), of(enumerating, "linguistic")),
            # without length control captions shorten and the detailed score regresses
            "terse below at evaluation": Direction.of(detailed_eval, terse_eval),
            # higher-quality references give a more effective recall signal
            "recap recall": Direction.of(of(recap, "recall"), of(original, "recall")),
            "recap precision": Direction.of(of(recap, "precision"), of(original, "precision")),
        },
        enumerating_past_twice=statistics.mean(past_twice),
    )
