"""The oracle judges only images of its own dataset: a lossy copy of a scene's image is recognised
within a stated tolerance, anything else (a look-alike scene of another dataset) is a failure with a
reason, never the verdict of the scene it resembles."""

from __future__ import annotations

import asyncio
import io
import random
from dataclasses import replace

import numpy as np
import pytest
from PIL import Image

from balcaprl.judge import JudgeFailure, Judgement, JudgeRequest
from balcaprl.synthetic.captions import reference_caption
from balcaprl.synthetic.oracle import FINGERPRINT_SIDE, NEAR_EXACT_TOLERANCE, OracleJudge
from balcaprl.synthetic.render import png_bytes, render_scene
from balcaprl.synthetic.scenes import generate_scenes


def _jpeg(image: Image.Image, quality: int) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def known():
    scenes = generate_scenes(120, seed=0, prefix="known")
    return scenes, OracleJudge.from_scenes(scenes)


def test_scenes_of_another_dataset_are_failures_not_lookalike_verdicts(known):
    scenes, oracle = known
    strangers = generate_scenes(40, seed=5, prefix="stranger")
    requests = [
        JudgeRequest(image=png_bytes(render_scene(s)), caption="a red circle.", reference="a red circle.")
        for s in strangers
    ]
    outcomes = asyncio.run(oracle.judge_batch(requests))
    graphs = {(s.texture, s.objects) for s in scenes}
    for stranger, outcome in zip(strangers, outcomes, strict=True):
        if (stranger.texture, stranger.objects) in graphs:  # the same picture: a fair match
            continue
        assert isinstance(outcome, JudgeFailure), stranger.id
        assert (
            outcome.reason == "bad_input" and "is no copy of any of the oracle's 120 scenes" in outcome.detail
        )


def test_one_changed_colour_is_another_scene(scene):
    oracle = OracleJudge.from_scenes([scene])
    square = scene.objects[1]  # the small blue square
    repainted = replace(
        scene, objects=(scene.objects[0], replace(square, color="purple"), *scene.objects[2:])
    )
    with pytest.raises(LookupError, match="no copy"):
        oracle.lookup(png_bytes(render_scene(repainted)))
    assert oracle.lookup(png_bytes(render_scene(scene))) == scene


def test_lossy_copies_of_its_own_images_are_judged(known):
    scenes, oracle = known
    for scene in scenes[:10]:
        image = render_scene(scene)
        for copy in (
            _jpeg(image, 30),
            _jpeg(image.resize((100, 100), Image.Resampling.LANCZOS), 60),
            image.resize((64, 64), Image.Resampling.LANCZOS),
            image.resize((336, 336), Image.Resampling.BICUBIC),
        ):
            assert oracle.lookup(copy) == scene
        reference = reference_caption(scene, random.Random(0))
        outcome = oracle.judge(JudgeRequest(image=_jpeg(image, 50), caption=reference, reference=reference))
        assert isinstance(outcome, Judgement)


@pytest.mark.parametrize("shift", [NEAR_EXACT_TOLERANCE, NEAR_EXACT_TOLERANCE + 1])
def test_the_tolerance_is_the_largest_thumbnail_difference_accepted(known, shift):
    """Darkening one 14x14 block (one cell of the 16x16 thumbnail at 224 px) by ``shift`` moves that
    cell's average by exactly ``shift`` and no other: accepted up to the tolerance, refused beyond."""
    scenes, oracle = known
    scene = scenes[0]
    pixels = np.asarray(render_scene(scene), dtype=np.int16).copy()
    cell = 224 // FINGERPRINT_SIDE
    block = next(
        (r, c)
        for r in range(0, 224, cell)
        for c in range(0, 224, cell)
        if pixels[r : r + cell, c : c + cell].min() >= shift
    )
    r, c = block
    pixels[r : r + cell, c : c + cell] -= shift
    altered = Image.fromarray(pixels.astype(np.uint8))
    if shift <= NEAR_EXACT_TOLERANCE:
        assert oracle.lookup(altered) == scene
    else:
        with pytest.raises(LookupError, match=f"differs by {shift} in its 16x16 thumbnail"):
            oracle.lookup(altered)
