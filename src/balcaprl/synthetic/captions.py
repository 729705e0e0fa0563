"""Reference captions: what a careful human (or a strong captioner) would write about a scene.

Varied sentence structures and paraphrases (subject-first, position-first, existential), relations
between shapes ("to the left of", "directly above"), the spread of sizes, counts and printed words, in
a fluent, non-repetitive paragraph of roughly 45..155 tokens (about 85 for 2-3 shapes). Every word comes from
:mod:`balcaprl.synthetic.lexicon`, so the oracle parses all of it and the tiny policy can say all of it.
"""

from __future__ import annotations

import random
from collections import Counter

from balcaprl.synthetic.lexicon import PLURALS, number_word
from balcaprl.synthetic.scenes import Scene, SceneObject

_POSITION_PHRASES = {
    (0, 0): ("in the top left corner", "in the upper left corner", "at the top left"),
    (0, 1): ("at the top", "near the top edge", "at the top center"),
    (0, 2): ("in the top right corner", "in the upper right corner", "at the top right"),
    (1, 0): ("on the left side", "at the left edge", "in the middle of the left side"),
    (1, 1): ("in the center", "in the middle", "at the center of the image"),
    (1, 2): ("on the right side", "at the right edge", "in the middle of the right side"),
    (2, 0): ("in the bottom left corner", "in the lower left corner", "at the bottom left"),
    (2, 1): ("at the bottom", "near the bottom edge", "at the bottom center"),
    (2, 2): ("in the bottom right corner", "in the lower right corner", "at the bottom right"),
}
_SIZE_PHRASES = {"small": ("small",), "medium": ("medium", "medium-sized"), "large": ("large", "big")}
_TEXTURE_PHRASES = {
    "plain": ("plain white", "plain light gray"),
    "striped": ("striped",),
    "dotted": ("dotted",),
    "checkered": ("checkered",),
}


def sentence_case(text: str) -> str:
    return text[:1].upper() + text[1:]


def indefinite(phrase: str) -> str:
    """``a``/``an`` chosen by sound, as a fluent writer would (the oracle checks it)."""
    return ("an " if phrase[:1] in "aeiou" else "a ") + phrase


def position_phrase(cell: tuple[int, int], rng: random.Random) -> str:
    return rng.choice(_POSITION_PHRASES[cell])


def noun_phrase(obj: SceneObject, rng: random.Random, *, size: bool = True) -> str:
    """``"a large red circle"`` (size optional)."""
    words = [rng.choice(_SIZE_PHRASES[obj.size])] if size else []
    return indefinite(" ".join([*words, obj.color, obj.kind]))


def _text_clause(obj: SceneObject, rng: random.Random) -> str:
    return rng.choice(
        (
            f" with the word {obj.text} written on it",
            f" bearing the word {obj.text}",
            f" labelled with the word {obj.text}",
            f", which carries the word {obj.text},",
        )
    )


def describe_object(obj: SceneObject, rng: random.Random) -> str:
    """One sentence about one shape: kind, colour, size, position and any printed word."""
    np_ = noun_phrase(obj, rng)
    if obj.text:
        np_ += _text_clause(obj, rng)
    pos = position_phrase(obj.cell, rng)
    verb = rng.choice(("sits", "is", "rests", "can be seen", "is located", "appears"))
    form = rng.randrange(4)
    if form == 0 or obj.text:
        sentence = f"{np_} {verb} {pos}."
    elif form == 1:
        sentence = f"{pos}, there is {np_}."
    elif form == 2:
        sentence = f"{pos} {rng.choice(('sits', 'rests', 'lies'))} {np_}."
    else:
        sentence = f"there is {np_} {pos}."
    return sentence_case(sentence.replace(",,", ",").replace(",.", "."))


def overview_sentence(scene: Scene, rng: random.Random) -> str:
    n = number_word(len(scene.objects))
    bg = rng.choice(_TEXTURE_PHRASES[scene.texture])
    backdrop = rng.choice(("background", "backdrop"))
    return sentence_case(
        rng.choice(
            (
                f"the image shows {n} shapes on {indefinite(bg)} {backdrop}.",
                f"{n} shapes are scattered across {indefinite(bg)} {backdrop}.",
                f"this picture contains {n} shapes set against {indefinite(bg)} {backdrop}.",
                f"there are {n} shapes in this image, set on {indefinite(bg)} {backdrop}.",
            )
        )
    )


def _count_sentence(scene: Scene, rng: random.Random) -> str | None:
    counts = Counter(o.kind for o in scene.objects)
    repeated = [(k, c) for k, c in sorted(counts.items()) if c >= 2]
    if not repeated:
        return None
    parts = [f"{number_word(c)} {PLURALS[k]}" for k, c in repeated]
    listed = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    return sentence_case(rng.choice((f"among them are {listed}.", f"the shapes include {listed}.")))


def _related_pairs(scene: Scene, *, every_pair: bool = False) -> list[tuple[SceneObject, str, SceneObject]]:
    """Neighbours in one row (left/right) or one column (above/below): the relations people state.
    ``every_pair``: any two shapes whose columns (rows) differ, as a thorough describer places each
    shape against every other."""
    pairs = []
    for a in scene.objects:
        for b in scene.objects:
            if (every_pair or a.row == b.row) and a.col < b.col:
                pairs.append((a, "left_of", b))
            if (every_pair or a.col == b.col) and a.row < b.row:
                pairs.append((a, "above", b))
    return pairs


def relation_sentences(scene: Scene, rng: random.Random, k: int, *, every_pair: bool = False) -> list[str]:
    """Up to ``k`` true relation sentences, each between two shapes named by colour and kind."""
    pairs = _related_pairs(scene, every_pair=every_pair)
    rng.shuffle(pairs)
    out = []
    for a, rel, b in pairs[:k]:
        the_a, the_b = f"the {a.name}", f"the {b.name}"
        if rel == "left_of":
            options = (
                f"{the_a} is to the left of {the_b}.",
                f"{the_b} sits to the right of {the_a}.",
                f"to the right of {the_a}, you can see {the_b}.",
            )
        else:
            options = (
                f"{the_a} is directly above {the_b}.",
                f"{the_b} sits below {the_a}.",
                f"just below {the_a} is {the_b}.",
            )
        out.append(sentence_case(rng.choice(options)))
    return out


def _size_sentence(scene: Scene, rng: random.Random) -> str | None:
    """How the sizes are spread ("there are two small shapes and one large shape."), when they differ."""
    counts = Counter(o.size for o in scene.objects)
    if len(counts) < 2:
        return None
    parts = [
        f"{number_word(c)} {size} {'shape' if c == 1 else 'shapes'}"
        for size, c in sorted(counts.items(), key=lambda kv: ("small", "medium", "large").index(kv[0]))
    ]
    listed = ", ".join(parts[:-1]) + " and " + parts[-1]
    return sentence_case(rng.choice((f"the image holds {listed}.", f"the picture holds {listed}.")))


# The re-captioner is thorough (the paper's references are long, detailed re-captions): it places each
# shape of a small scene against every other it is left/right of or above/below, and says how the sizes
# are spread; fewer relations in big scenes, to stay within the word budget. (most shapes, relations):
# the first row that fits a scene gives its relation sentences. Free: no paper statement fixes the
# count (docs/synthetic-world.md, "World parameters").
REFERENCE_SHUFFLED = 0.25  # share of references that describe the shapes out of reading order
RELATIONS_BY_SCENE_SIZE: tuple[tuple[int, int], ...] = ((3, 4), (5, 2), (9, 1))


def relation_count(n_shapes: int) -> int:
    """How many relation sentences the re-captioner writes about a scene of ``n_shapes`` shapes."""
    return next(count for most, count in RELATIONS_BY_SCENE_SIZE if n_shapes <= most)


def reference_caption(scene: Scene, rng: random.Random) -> str:
    """A good detailed caption of ``scene``: overview, one sentence per shape, relations, counts."""
    objects = list(scene.objects)  # reading order, which is also how the scene stores them
    if rng.random() < REFERENCE_SHUFFLED:
        rng.shuffle(objects)
    sentences = [overview_sentence(scene, rng)]
    sentences += [describe_object(o, rng) for o in objects]
    relations = relation_sentences(scene, rng, relation_count(len(objects)), every_pair=True)
    for sentence in relations:  # spread relations among the object sentences, after both are introduced
        sentences.append(sentence)
    sizes = _size_sentence(scene, rng)
    if sizes:
        sentences.append(sizes)
    count = _count_sentence(scene, rng)
    if count:
        sentences.insert(1, count) if rng.random() < 0.5 else sentences.append(count)
    return " ".join(sentences)
