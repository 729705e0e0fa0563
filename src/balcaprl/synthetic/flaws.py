"""Flawed captions of controlled kinds: the failure modes the paper's rewards are meant to catch.

Each kind damages one thing and leaves the rest as good as a reference, so a test can check that the
oracle penalises exactly that thing:

=================  ===========================================  ==========================
kind               what it does                                 what the oracle lowers
=================  ===========================================  ==========================
``too_short``      one sentence, one or two shapes              recall (and length ratio)
``hallucination``  wrong colour/kind/size/position, or an       precision (pointable but
                   extra shape that is not there                not visible)
``meta``           adds "the composition feels balanced"...     precision (not pointable)
``repetition``     repeats sentences                            linguistic (clarity, ...)
``list``           a numbered list of facts                     linguistic (fluency, ...)
``run_on``         everything in one long "and"-chained run     linguistic (clarity, ...)
=================  ===========================================  ==========================

They are used to mix SFT data (so the warm-started policy still makes these mistakes and RL has
something to remove) and in tests.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Literal, get_args

from balcaprl.synthetic.captions import (
    describe_object,
    indefinite,
    noun_phrase,
    overview_sentence,
    position_phrase,
    reference_caption,
    relation_sentences,
    sentence_case,
)
from balcaprl.synthetic.lexicon import CELL_NAMES, COLORS, KINDS, META_SENTENCES, SIZES
from balcaprl.synthetic.scenes import Scene, SceneObject

FlawKind = Literal["too_short", "hallucination", "meta", "repetition", "list", "run_on"]
FLAW_KINDS: tuple[FlawKind, ...] = get_args(FlawKind)


def _split_sentences(caption: str) -> list[str]:
    return [s.strip() + "." for s in caption.split(".") if s.strip()]


def _too_short(scene: Scene, rng: random.Random) -> str:
    objs = rng.sample(list(scene.objects), min(len(scene.objects), rng.choice((1, 2))))
    if len(objs) == 1:
        return sentence_case(f"{noun_phrase(objs[0], rng)} {position_phrase(objs[0].cell, rng)}.")
    return sentence_case(
        f"{noun_phrase(objs[0], rng, size=False)} and {noun_phrase(objs[1], rng, size=False)}."
    )


def hallucinated_object(
    scene: Scene, obj: SceneObject, rng: random.Random, *, move: bool = True
) -> SceneObject:
    """``obj`` with one attribute changed so that the result is false of the scene (``move``: its
    cell may be the attribute changed)."""
    taken_pairs = {(o.kind, o.color) for o in scene.objects}
    free_cells = [c for c in CELL_NAMES if c not in {o.cell for o in scene.objects}]
    choices = ["color", "kind", "size"] + (["cell"] if free_cells and move else [])
    what = rng.choice(choices)
    if what == "color":
        options = [c for c in COLORS if (obj.kind, c) not in taken_pairs]
        return (
            replace(obj, color=rng.choice(options)) if options else replace(obj, size=_other_size(obj, rng))
        )
    if what == "kind":
        options = [k for k in KINDS if (k, obj.color) not in taken_pairs]
        return replace(obj, kind=rng.choice(options)) if options else replace(obj, size=_other_size(obj, rng))
    if what == "size":
        return replace(obj, size=_other_size(obj, rng))
    row, col = rng.choice(free_cells)
    return replace(obj, row=row, col=col)


def _other_size(obj: SceneObject, rng: random.Random) -> str:
    return rng.choice([s for s in SIZES if s != obj.size])


def _hallucination(scene: Scene, rng: random.Random) -> str:
    objects = list(scene.objects)
    n_wrong = 1 if len(objects) <= 3 else 2
    wrong = set(rng.sample(range(len(objects)), n_wrong))
    described = [hallucinated_object(scene, o, rng) if i in wrong else o for i, o in enumerate(objects)]
    sentences = [overview_sentence(scene, rng)] + [
        describe_object(replace(o, text=None), rng) for o in described
    ]
    if rng.random() < 0.5:  # and sometimes a shape that is not there at all
        taken = {(o.kind, o.color) for o in scene.objects}
        free_cells = [c for c in CELL_NAMES if c not in {o.cell for o in scene.objects}]
        if free_cells:
            kind, color = rng.choice([(k, c) for k in KINDS for c in COLORS if (k, c) not in taken])
            row, col = rng.choice(free_cells)
            ghost = SceneObject(kind=kind, color=color, size=rng.choice(SIZES), row=row, col=col)
            sentences.insert(rng.randint(1, len(sentences)), describe_object(ghost, rng))
    return " ".join(sentences)


def _meta(scene: Scene, rng: random.Random) -> str:
    sentences = _split_sentences(reference_caption(scene, rng))
    for meta in rng.sample(META_SENTENCES, rng.choice((1, 2, 3))):
        sentences.insert(rng.randint(1, len(sentences)), meta)
    return " ".join(sentences)


def _repetition(scene: Scene, rng: random.Random) -> str:
    sentences = _split_sentences(reference_caption(scene, rng))
    for _ in range(rng.choice((1, 2, 3))):
        i = rng.randrange(len(sentences))
        sentences.insert(rng.randint(i + 1, len(sentences)), sentences[i])
    return " ".join(sentences)


def _list(scene: Scene, rng: random.Random) -> str:
    items = []
    for obj in scene.objects:
        item = f"{obj.size} {obj.color} {obj.kind}, {obj.position_name}"
        if obj.text:
            item += f", word {obj.text}"
        items.append(item)
    items.append(f"{scene.texture} background")
    return " ".join(f"{i}. {item}." for i, item in enumerate(items, start=1))


def _run_on(scene: Scene, rng: random.Random) -> str:
    parts = []
    for obj in scene.objects:
        part = f"{indefinite(f'{obj.size} {obj.color} {obj.kind}')} {rng.choice(('is', 'sits'))} {position_phrase(obj.cell, rng)}"
        parts.append(part)
    parts += [r.rstrip(".").lower() for r in relation_sentences(scene, rng, 1)]
    joiners = (" and ", " and then ", ", and ", " and also ")
    text = parts[0]
    for part in parts[1:]:
        text += rng.choice(joiners) + part
    # Opens like a reference (so the flaw is the run-on, not an odd first word), then never stops.
    opening = overview_sentence(scene, rng).rstrip(".")
    return f"{opening} and {text} and the background is {scene.texture}."


_GENERATORS = {
    "too_short": _too_short,
    "hallucination": _hallucination,
    "meta": _meta,
    "repetition": _repetition,
    "list": _list,
    "run_on": _run_on,
}


def flawed_caption(scene: Scene, kind: FlawKind, rng: random.Random) -> str:
    """A caption of ``scene`` with the flaw ``kind`` (see the module docstring's table)."""
    try:
        generator = _GENERATORS[kind]
    except KeyError:
        raise ValueError(f"unknown flaw kind {kind!r}; expected one of {FLAW_KINDS}") from None
    return generator(scene, rng)
