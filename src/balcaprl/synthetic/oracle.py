"""The oracle judge: the paper's judge, exact, for the synthetic world.

It implements :class:`balcaprl.judge.Judge`: for each request it finds the scene from the image it
is given (file hash, then decoded-pixel hash, then, for a lossy copy such as a JPEG or a resize, a
near-exact match with one scene's own rendering; an image of no scene of the dataset is a failure with a
reason, never the verdict of a look-alike),
parses the caption and the reference against the scene graph (:mod:`~balcaprl.synthetic.parser`),
marks each caption assertion pointable/visible and each reference assertion covered, scores
clarity/fluency/coherency from measurable style facts (:mod:`~balcaprl.synthetic.linguistic`), and
returns a schema-valid :class:`~balcaprl.rewards.Verdict`.

Rubrics: ``training`` is the paper's strict two-part test; ``evaluation`` (b-CapScore) additionally
passes evidence-based inferences ("a simple computer generated illustration"). For every other
assertion the two rubrics agree, because in this world every pointable claim is checkable exactly.
``training_without_pointability`` (the "w/o pointability" ablation) judges like ``training`` but,
as its prompt asks nothing about pointability, marks every caption assertion pointable.

A reference is decomposed whole, as a judge reading it would: every distinct assertion it makes, its
errors and its commentary included. A caption covers a reference assertion when it makes the same
assertion (same key), true or not: so a flawed reference rewards repeating its flaws, as a weak
reference does in the paper's "w/o recap" row. Deciding what a reference's words refer to needs the
scene, so the oracle needs the image for a reference decomposition too (cached-reference mode:
``rubric.reference_image: true``).

Deterministic, pure Python, no model: thousands of verdicts a second on one core (see
``benchmarks/bench_oracle.py``).
"""

from __future__ import annotations

import hashlib
import io
import json
import random
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
from PIL import Image

from balcaprl.data.format import read_card
from balcaprl.judge.protocol import JudgeFailure, Judgement, JudgeOutcome, JudgeRequest, Rubric
from balcaprl.judge.rubrics import VERDICT_RUBRICS
from balcaprl.rewards import Verdict
from balcaprl.synthetic.captions import reference_caption
from balcaprl.synthetic.linguistic import linguistic_scores
from balcaprl.synthetic.parser import Assertion, parse_caption
from balcaprl.synthetic.render import DEFAULT_IMAGE_SIZE, pixel_key, png_bytes, render_scene, thumbnail
from balcaprl.synthetic.scenes import Scene

SCENES_FILE = "scenes.jsonl"
# A lossy copy is the copy of a scene when no RGB value of its 16x16 box thumbnail differs from the
# scene's own rendering by more than NEAR_EXACT_TOLERANCE (0..255). Measured on 3,000 scenes: JPEG at
# quality 30 and resizes to 64..336 px stay within 28; any two scenes of the dataset differ by 62 or more
# (and an 8x8 mean, the old test, let 71 of 200 scenes of another seed pass as look-alikes).
FINGERPRINT_SIDE = 16
NEAR_EXACT_TOLERANCE = 40
# Candidates first: scenes whose stored 8x8 thumbnail is within this of the copy's (copies stay within 7).
THUMB_TOLERANCE = 16
_MAX_CANDIDATES = 8


def _reference_assertions(scene: Scene, reference: str, rubric: Rubric) -> list[Assertion]:
    """Everything the reference asserts, once each (false and non-pointable assertions included:
    the judge decomposes the reference it is given, not the scene); a reference that asserts nothing
    falls back to the scene graph's own description (so recall is always defined)."""
    facts = _unique(parse_caption(reference, scene, rubric).assertions)
    if not facts:
        facts = _unique(parse_caption(reference_caption(scene, random.Random(0)), scene, rubric).assertions)
    return facts


def _unique(assertions: Iterable[Assertion]) -> list[Assertion]:
    seen: set[tuple] = set()
    out = []
    for a in assertions:
        if a.kind != "unclear" and a.key not in seen:  # an unparsable fragment is nothing to cover
            seen.add(a.key)
            out.append(a)
    return out


def oracle_verdict(
    scene: Scene, caption: str, reference: str, rubric: Rubric = "training", *, _ref_cache: dict | None = None
) -> Verdict:
    """The verdict for one (scene, caption, reference): the oracle's whole judgement, no image needed."""
    parsed = parse_caption(caption, scene, rubric)
    cache_key = (scene.id, reference, rubric)
    ref = _ref_cache.get(cache_key) if _ref_cache is not None else None
    if ref is None:
        ref = _reference_assertions(scene, reference, rubric)
        if _ref_cache is not None:
            if len(_ref_cache) > 100_000:  # references are per image, so this only trips on odd use
                _ref_cache.clear()
            _ref_cache[cache_key] = ref
    said = {a.key for a in parsed.assertions}  # same key, same claim: true exactly when the reference's is
    scores = linguistic_scores(parsed)
    judged_pointability = rubric != "training_without_pointability"
    return Verdict(
        caption_assertions=[
            {"text": a.text, "pointable": a.pointable or not judged_pointability, "visible": a.visible}
            for a in parsed.assertions
        ],
        reference_assertions=[{"text": a.text, "covered": a.key in said} for a in ref],
        clarity=scores.clarity,
        fluency=scores.fluency,
        coherency=scores.coherency,
        explanation=scores.explanation,
    )


class SceneRecord(dict):
    """One line of ``scenes.jsonl``: ``id``, ``split``, ``image``, ``image_sha256``, ``pixel_key``,
    ``thumb`` (hex of the 8x8 RGB thumbnail) and ``scene`` (the scene graph)."""


def scene_record(
    scene: Scene, image: Image.Image, encoded: bytes, *, split: str, image_path: str
) -> SceneRecord:
    return SceneRecord(
        id=scene.id,
        split=split,
        image=image_path,
        image_sha256=hashlib.sha256(encoded).hexdigest(),
        pixel_key=pixel_key(image),
        thumb=thumbnail(image).tobytes().hex(),
        scene=scene.to_dict(),
    )


class OracleJudge:
    """A :class:`~balcaprl.judge.Judge` that knows every scene's graph."""

    def __init__(self, records: Iterable[dict], image_size: int = DEFAULT_IMAGE_SIZE) -> None:
        self._image_size = image_size  # the side the scenes were rendered at: a lossy copy is compared to it
        self._fingerprints: dict[int, np.ndarray] = {}  # scene index -> its rendering's 16x16 thumbnail
        self._by_file: dict[str, Scene] = {}
        self._by_pixels: dict[str, Scene] = {}
        thumbs, thumb_scenes = [], []
        for record in records:
            scene = Scene.from_dict(record["scene"])
            self._by_file[record["image_sha256"]] = scene
            self._by_pixels[record["pixel_key"]] = scene
            thumbs.append(np.frombuffer(bytes.fromhex(record["thumb"]), dtype=np.uint8))
            thumb_scenes.append(scene)
        if not thumb_scenes:
            raise ValueError("an oracle judge needs at least one scene")
        self._thumbs = np.stack(thumbs).astype(np.int16)
        self._thumb_scenes = thumb_scenes
        self._ref_cache: dict = {}
        self._decoded: OrderedDict[str, Scene] = OrderedDict()  # file hash -> scene, for re-encoded copies

    # construction -----------------------------------------------------------------------------------
    @classmethod
    def from_dataset(cls, path: Path | str) -> OracleJudge:
        """The oracle for a dataset folder written by ``balcaprl synthetic build``."""
        root = Path(path)
        card = read_card(root)
        name = (card.get("synthetic") or {}).get("scenes_file", SCENES_FILE)
        scenes_path = root / name
        if not scenes_path.is_file():
            raise FileNotFoundError(
                f"{scenes_path} not found: {root} is not a synthetic dataset (build one with "
                "`balcaprl synthetic build --out DIR`); the oracle needs each image's scene graph"
            )
        image_size = (card.get("synthetic") or {}).get("image_size", DEFAULT_IMAGE_SIZE)
        with scenes_path.open() as handle:
            return cls((json.loads(line) for line in handle if line.strip()), image_size=image_size)

    @classmethod
    def from_scenes(cls, scenes: Iterable[Scene], image_size: int = DEFAULT_IMAGE_SIZE) -> OracleJudge:
        """An in-memory oracle (renders each scene once to learn its keys); handy in tests."""
        records = []
        for scene in scenes:
            image = render_scene(scene, image_size)
            records.append(scene_record(scene, image, png_bytes(image), split="", image_path=""))
        return cls(records, image_size=image_size)

    def __len__(self) -> int:
        return len(self._thumb_scenes)

    # lookup -----------------------------------------------------------------------------------------
    def lookup(self, image: Path | str | bytes | Image.Image) -> Scene:
        """The scene an image shows; raises :class:`LookupError` for an image of no known scene."""
        if isinstance(image, Image.Image):
            return self._lookup_decoded(image)
        data = image if isinstance(image, bytes) else Path(image).read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        scene = self._by_file.get(digest) or self._decoded.get(digest)
        if scene is not None:
            return scene
        try:
            decoded = Image.open(io.BytesIO(data))
            decoded.load()
        except Exception as error:  # PIL raises several types for undecodable bytes
            raise LookupError(
                f"the image is not a decodable PNG/JPEG ({type(error).__name__}: {error})"
            ) from None
        scene = self._lookup_decoded(decoded)
        self._decoded[digest] = scene
        if len(self._decoded) > 4096:
            self._decoded.popitem(last=False)
        return scene

    def _lookup_decoded(self, image: Image.Image) -> Scene:
        scene = self._by_pixels.get(pixel_key(image))
        if scene is not None:
            return scene
        thumb_gap = np.abs(self._thumbs - thumbnail(image).astype(np.int16)).max(axis=1)
        nearest = [int(i) for i in np.argsort(thumb_gap, kind="stable")[:_MAX_CANDIDATES]]
        candidates = nearest[:1] + [i for i in nearest[1:] if thumb_gap[i] <= THUMB_TOLERANCE]
        fingerprint = thumbnail(image, FINGERPRINT_SIDE).astype(np.int16)
        gaps = {i: int(np.abs(self._fingerprint(i) - fingerprint).max()) for i in candidates}
        matches = [i for i, gap in gaps.items() if gap <= NEAR_EXACT_TOLERANCE]
        if len(matches) == 1:
            return self._thumb_scenes[matches[0]]
        where = f"image ({image.width}x{image.height})"
        if matches:
            names = ", ".join(self._thumb_scenes[i].id for i in matches)
            raise LookupError(f"{where} is a near-exact copy of several scenes ({names}); refusing to guess")
        raise LookupError(
            f"{where} is no copy of any of the oracle's {len(self)} scenes (the nearest differs by "
            f"{min(gaps.values())} in its 16x16 thumbnail, a copy by at most {NEAR_EXACT_TOLERANCE}); "
            "is it from this dataset?"
        )

    def _fingerprint(self, index: int) -> np.ndarray:
        """The 16x16 thumbnail of scene ``index`` as rendered (renders it the first time it is asked)."""
        known = self._fingerprints.get(index)
        if known is None:
            rendered = render_scene(self._thumb_scenes[index], self._image_size)
            known = self._fingerprints[index] = thumbnail(rendered, FINGERPRINT_SIDE).astype(np.int16)
        return known

    # judging ----------------------------------------------------------------------------------------
    def verdict(self, scene: Scene, caption: str, reference: str, rubric: Rubric = "training") -> Verdict:
        return oracle_verdict(scene, caption, reference, rubric, _ref_cache=self._ref_cache)

    def judge(self, request: JudgeRequest) -> JudgeOutcome:
        """One request, synchronously (the async :meth:`judge_batch` calls this)."""
        if request.rubric not in VERDICT_RUBRICS:
            return JudgeFailure("bad_input", f"unknown rubric {request.rubric!r}")
        if isinstance(request.image, bytes) and not request.image:
            return JudgeFailure(
                "bad_input",
                "no image: the oracle knows a scene only by its image (for a cached-reference "
                "decomposition, set the judge config's rubric.reference_image: true)",
            )
        try:
            scene = self.lookup(request.image)
        except (LookupError, OSError) as error:
            return JudgeFailure("bad_input", str(error))
        verdict = self.verdict(scene, request.caption, request.reference, request.rubric)
        return Judgement(verdict=verdict)

    async def judge_batch(self, requests: Sequence[JudgeRequest]) -> list[JudgeOutcome]:
        return [self.judge(request) for request in requests]
