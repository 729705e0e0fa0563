"""The world's other captioners: the base model that SFT imitates, and the original annotator whose
captions the re-captioner replaced.

The paper trains from a base model against references re-captioned by a stronger model, and its
ablations turn on how the two differ. Each captioner here models one such difference, by the process
that makes it, never by the reward it earns (docs/synthetic-world.md, "The temptations"):

- :func:`base_caption` is what the SFT warm start learns to say. It names the shapes in order of
  salience (large before small), and a shape it names later, or a small one, is more often described
  wrongly: hard-to-see objects come last, so a longer caption is a less precise one. It has three
  modes: ``detailed`` (overview and one sentence per shape, no relations or counts: about half as long
  as the re-captioned references), ``terse`` (the overview, perhaps the most salient shape: a short caption
  with nothing wrong in it), and ``enumerating`` (every shape with a few guesses beside it: it buys
  reference coverage with false claims, and runs past twice the reference's length).
- :func:`original_caption` is the degraded reference beside the re-captioned one (the dataset's
  ``reference_original``): shorter, it leaves a shape out, gets an attribute wrong now and then, and
  adds fluent commentary nobody can point at.

:func:`sft_target` draws one SFT target: a flawed caption (``flaws``) with ``flawed_fraction``, else a
base caption in a mode drawn by :data:`BASE_MODE_WEIGHTS`.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Literal, get_args

from balcaprl.synthetic.captions import describe_object, overview_sentence
from balcaprl.synthetic.flaws import FLAW_KINDS, flawed_caption, hallucinated_object
from balcaprl.synthetic.lexicon import INFERENCE_SENTENCES, META_SENTENCES
from balcaprl.synthetic.scenes import Scene, SceneObject

BaseMode = Literal["detailed", "terse", "enumerating"]
BASE_MODES: tuple[BaseMode, ...] = get_args(BaseMode)
# How often the base captioner is in each mode: mostly detailed, with a terse and a verbose habit a
# base model shows and RL can grow (or be stopped from growing).
BASE_MODE_WEIGHTS: dict[BaseMode, float] = {"detailed": 0.7, "terse": 0.15, "enumerating": 0.15}

_SALIENCE = {"large": 0, "medium": 1, "small": 2}
# Chance that the base captioner describes the i-th shape it names wrongly: rising with i, and higher
# for a small shape (it is harder to see).
ERROR_FIRST, ERROR_STEP, ERROR_SMALL = 0.08, 0.12, 0.25
GUESSES_PER_SHAPE = 4  # the enumerating mode's wrong candidates beside each shape's true description
TERSE_NAMES_A_SHAPE = 0.5  # chance a terse caption names its most salient shape after the overview
# The original annotator: chances it gets an attribute wrong, adds commentary nobody can point at, and
# adds an inference from evidence (it also leaves one shape out of a scene of three or more).
ORIGINAL_WRONG_ATTRIBUTE, ORIGINAL_COMMENTARY, ORIGINAL_INFERENCE = 0.5, 0.7, 0.3


def salience_order(scene: Scene) -> list[SceneObject]:
    """The shapes as a captioner notices them: large first, then medium, then small (reading order
    within a size)."""
    return sorted(scene.objects, key=lambda o: (_SALIENCE[o.size], o.row, o.col))


def error_probability(index: int, obj: SceneObject) -> float:
    """How likely the base captioner is to get the ``index``-th shape it names (0 = first) wrong."""
    return min(0.9, ERROR_FIRST + ERROR_STEP * index + (ERROR_SMALL if obj.size == "small" else 0.0))


def _as_seen(scene: Scene, index: int, obj: SceneObject, rng: random.Random) -> SceneObject:
    if rng.random() < error_probability(index, obj):
        return hallucinated_object(scene, obj, rng)
    return obj


def base_caption(scene: Scene, rng: random.Random, mode: BaseMode = "detailed") -> str:
    """What the base captioner says about ``scene`` in ``mode`` (see the module docstring)."""
    objects = salience_order(scene)
    sentences = [overview_sentence(scene, rng)]
    if mode == "terse":
        if rng.random() < TERSE_NAMES_A_SHAPE:
            sentences.append(describe_object(replace(objects[0], text=None), rng))
    elif mode == "detailed":
        for i, obj in enumerate(objects):
            sentences.append(describe_object(_as_seen(scene, i, obj, rng), rng))
    elif mode == "enumerating":
        for obj in objects:
            candidates = [obj]
            for _ in range(4 * GUESSES_PER_SHAPE):  # distinct guesses (a small world may have fewer)
                guess = hallucinated_object(scene, obj, rng, move=False)
                if guess not in candidates:
                    candidates.append(guess)
                if len(candidates) > GUESSES_PER_SHAPE:
                    break
            rng.shuffle(candidates)
            sentences += [describe_object(c, rng) for c in candidates]
    else:
        raise ValueError(f"unknown base caption mode {mode!r}; expected one of {BASE_MODES}")
    return " ".join(sentences)


def original_caption(scene: Scene, rng: random.Random) -> str:
    """The original annotator's caption: the degraded reference the re-captioned one replaced."""
    objects = list(scene.objects)
    if len(objects) >= 3:
        objects.pop(rng.randrange(len(objects)))  # a shape left out
    if rng.random() < ORIGINAL_WRONG_ATTRIBUTE:
        i = rng.randrange(len(objects))
        objects[i] = hallucinated_object(scene, objects[i], rng)
    sentences = [overview_sentence(scene, rng)]
    sentences += [describe_object(replace(o, text=None), rng) for o in objects]
    if rng.random() < ORIGINAL_COMMENTARY:
        sentences.insert(rng.randint(1, len(sentences)), rng.choice(META_SENTENCES))
    if rng.random() < ORIGINAL_INFERENCE:
        sentences.append(rng.choice(INFERENCE_SENTENCES))
    return " ".join(sentences)


def sft_target(scene: Scene, rng: random.Random, flawed_fraction: float) -> str:
    """One SFT target for ``scene``: a flawed caption of a random kind with ``flawed_fraction``, else a
    base caption in a mode drawn by :data:`BASE_MODE_WEIGHTS`."""
    if rng.random() < flawed_fraction:
        return flawed_caption(scene, rng.choice(FLAW_KINDS), rng)
    mode = rng.choices(BASE_MODES, weights=[BASE_MODE_WEIGHTS[m] for m in BASE_MODES])[0]
    return base_caption(scene, rng, mode)
