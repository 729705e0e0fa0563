"""Reference and flawed captions: the closed vocabulary holds them, the oracle parses references
perfectly, and each flaw costs exactly the reward it is meant to cost."""

from __future__ import annotations

import random

import pytest

from balcaprl.rewards import score_verdict
from balcaprl.synthetic.captions import reference_caption
from balcaprl.synthetic.flaws import FLAW_KINDS, flawed_caption
from balcaprl.synthetic.lexicon import COLORS, KINDS, words_of
from balcaprl.synthetic.linguistic import word_budget
from balcaprl.synthetic.oracle import oracle_verdict
from balcaprl.synthetic.parser import parse_caption
from balcaprl.synthetic.scenes import SceneSpec, generate_scenes
from balcaprl.synthetic.tokenizer import build_tokenizer

SCENES = generate_scenes(60, seed=7)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def test_scenes_follow_the_world_rules():
    for scene in generate_scenes(200, seed=1):
        assert 2 <= len(scene.objects) <= 7
        assert len({o.cell for o in scene.objects}) == len(scene.objects)  # one shape per cell
        assert len({(o.kind, o.color) for o in scene.objects}) == len(scene.objects)  # unique names
        assert all(o.text is None or o.size != "small" for o in scene.objects)
    assert generate_scenes(5, seed=2) == generate_scenes(5, seed=2)
    assert generate_scenes(5, seed=2) != generate_scenes(5, seed=3)
    with pytest.raises(ValueError, match="max_objects"):
        SceneSpec(min_objects=3, max_objects=10)


def test_a_smaller_world_draws_only_its_words_and_the_full_one_is_unchanged():
    small = SceneSpec(min_objects=2, max_objects=4, kinds=["circle", "star"], colors=("red", "blue"))
    assert small.kinds == ("circle", "star")  # lists (YAML/JSON) become tuples
    scenes = generate_scenes(300, seed=4, spec=small)
    assert {o.kind for s in scenes for o in s.objects} == {"circle", "star"}
    assert {o.color for s in scenes for o in s.objects} == {"red", "blue"}
    # the default subsets are the whole vocabulary, drawn in the same order: seeds keep their scenes
    assert generate_scenes(20, seed=2, spec=SceneSpec(kinds=KINDS, colors=COLORS)) == generate_scenes(
        20, seed=2
    )
    with pytest.raises(ValueError, match="kinds must be distinct.*'blob'"):
        SceneSpec(kinds=("circle", "blob"))
    with pytest.raises(ValueError, match="colors must be distinct"):
        SceneSpec(colors=("red", "red"))
    with pytest.raises(ValueError, match="cannot give 5 shapes"):
        SceneSpec(max_objects=5, kinds=("circle", "star"), colors=("red", "blue"))


def test_references_are_in_vocabulary_parse_fully_and_are_true(tokenizer):
    rng = random.Random(0)
    lengths = []
    for scene in SCENES:
        ref = reference_caption(scene, rng)
        ids = tokenizer(ref, add_special_tokens=False)["input_ids"]
        assert tokenizer.unk_token_id not in ids, ref
        assert len(ids) == len(words_of(ref))  # the documented token count is the policy's
        lengths.append(len(ids))
        parsed = parse_caption(ref, scene)
        assert parsed.unparsed_words == 0, ref
        assert parsed.agreement_errors == 0, ref
        assert all(a.pointable and a.visible for a in parsed.assertions), ref
        # every shape's place, size, colour and kind is in the reference, each a claim of its own
        kinds = {a.kind for a in parsed.assertions}
        assert sum(a.kind == "position" for a in parsed.assertions) == len(scene.objects)
        assert sum(a.kind == "object" for a in parsed.assertions) == 2 * len(scene.objects)
        assert {"object", "size", "position", "count", "background"} <= kinds
        r = score_verdict(oracle_verdict(scene, ref, ref))
        assert (r.precision, r.recall, r.linguistic) == (1.0, 1.0, 1.0)
    lengths.sort()
    assert lengths[len(lengths) // 10] >= 30 and lengths[len(lengths) * 9 // 10] <= 140


def test_references_vary():
    rng = random.Random(0)
    captions = {reference_caption(SCENES[0], rng) for _ in range(10)}
    assert len(captions) >= 8


@pytest.mark.parametrize("kind", FLAW_KINDS)
def test_flaws_are_in_vocabulary(kind, tokenizer):
    rng = random.Random(1)
    for scene in SCENES[:20]:
        caption = flawed_caption(scene, kind, rng)
        assert tokenizer.unk_token_id not in tokenizer(caption, add_special_tokens=False)["input_ids"], (
            caption
        )


def test_each_flaw_costs_its_reward():
    rng = random.Random(2)
    for scene in SCENES:
        ref = reference_caption(scene, rng)
        good = score_verdict(oracle_verdict(scene, reference_caption(scene, rng), ref))
        captions = {kind: flawed_caption(scene, kind, rng) for kind in FLAW_KINDS}
        got = {kind: score_verdict(oracle_verdict(scene, captions[kind], ref)) for kind in FLAW_KINDS}
        assert got["too_short"].recall < 0.5 < good.recall
        assert got["hallucination"].precision < 1.0 == good.precision
        assert got["hallucination"].non_visible_share > 0
        assert got["meta"].precision < 1.0 and got["meta"].non_pointable_share > 0
        if len(words_of(captions["meta"])) <= word_budget(len(scene.objects)):  # only length can cost it
            assert got["meta"].linguistic == good.linguistic
        for kind in ("repetition", "list", "run_on"):
            assert got[kind].linguistic < good.linguistic, kind
            assert got[kind].precision == 1.0, kind  # style flaws tell no lies


def test_unknown_flaw_kind():
    with pytest.raises(ValueError, match="unknown flaw kind"):
        flawed_caption(SCENES[0], "sarcasm", random.Random(0))  # type: ignore[arg-type]
