"""`balcaprl judge serve --oracle DATASET`: the synthetic oracle judge behind the real client.

Skipped when the synthetic world is not installed in this checkout.
"""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
from judge_testkit import config, judge_and_close, judge_serve, png_bytes

from balcaprl.judge import JudgeFailure, Judgement, JudgeRequest, OpenAICompatibleJudge
from balcaprl.rewards import score_verdict

pytest.importorskip("balcaprl.synthetic.oracle")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    from balcaprl.synthetic.build import build_dataset

    return build_dataset(tmp_path_factory.mktemp("synthetic"), n_train=3, n_eval=1, seed=0)


@pytest.fixture(scope="module")
def oracle_url(dataset):
    with judge_serve("--oracle", str(dataset)) as (url, _):
        yield url


@pytest.mark.parametrize("mode", ["joint", "cached-reference"])
def test_oracle_judges_dataset_images_over_http(dataset, oracle_url, mode):
    rows = pq.read_table(dataset / "train.parquet").to_pylist()
    requests = [
        JudgeRequest(image=row["image"], caption=row["reference"], reference=row["reference"]) for row in rows
    ]
    requests.append(JudgeRequest(image=png_bytes(), caption="a red square", reference=rows[0]["reference"]))
    # the oracle splits a reference into its scene's true facts: it needs the image for that too
    cfg = config(oracle_url, reference_mode=mode, rubric={"reference_image": mode == "cached-reference"})
    judge = OpenAICompatibleJudge(cfg, image_root=dataset)
    outcomes = judge_and_close(judge, requests)
    for outcome in outcomes[:-1]:
        # the reference judged against itself: everything covered, and its claims are true
        assert isinstance(outcome, Judgement), outcome
        assert score_verdict(outcome.verdict).recall == 1.0 and score_verdict(outcome.verdict).precision > 0.5
    unknown = outcomes[-1]
    assert isinstance(unknown, JudgeFailure) and unknown.reason == "bad_input"


def _scenes(dataset):
    import json

    from balcaprl.synthetic.scenes import Scene

    lines = (dataset / "scenes.jsonl").read_text().splitlines()
    return {r["id"]: Scene.from_dict(r["scene"]) for r in map(json.loads, lines) if r}


def test_both_reference_modes_give_the_oracles_recall_denominators(dataset):
    """Joint mode splits each reference inside every verdict call; cached-reference mode once, in a
    call of its own, by the same rules. On the oracle, over HTTP, both modes must give every rollout
    the same reference assertions, so the same recall denominator (and the same coverage)."""
    import random

    from balcaprl.synthetic.flaws import FLAW_KINDS, flawed_caption
    from balcaprl.synthetic.oracle import OracleJudge
    from balcaprl.testing.judge_server import JudgeServer

    rows = [r for split in ("train", "eval") for r in pq.read_table(dataset / f"{split}.parquet").to_pylist()]
    scenes, rng = _scenes(dataset), random.Random(0)
    requests = []
    for row in rows:  # each reference with flawed captions of its own scene and the other references
        captions = [flawed_caption(scenes[row["id"]], kind, rng) for kind in FLAW_KINDS]
        captions += [other["reference"] for other in rows]
        requests += [
            JudgeRequest(image=row["image"], caption=c, reference=row["reference"]) for c in captions
        ]

    with JudgeServer(OracleJudge.from_dataset(dataset)) as server:
        outcomes = {}
        for mode in ("joint", "cached-reference"):
            cfg = config(server.base_url, reference_mode=mode, rubric={"reference_image": True})
            outcomes[mode] = judge_and_close(OpenAICompatibleJudge(cfg, image_root=dataset), requests)
        assert server.counters.by_kind["reference_assertions"] == len(rows)  # one split per reference

    for joint, cached in zip(outcomes["joint"], outcomes["cached-reference"], strict=True):
        assert isinstance(joint, Judgement) and isinstance(cached, Judgement)
        j, c = joint.verdict.reference_assertions, cached.verdict.reference_assertions
        assert len(j) == len(c) >= 3 and [a.text for a in j] == [a.text for a in c]
        assert score_verdict(joint.verdict).recall == score_verdict(cached.verdict).recall
    recalls = {score_verdict(o.verdict).recall for o in outcomes["joint"]}
    assert len(recalls) > 3  # the captions cover their references to different degrees


def test_the_oracle_asks_for_the_image_a_text_only_decomposition_lacks(dataset, oracle_url):
    row = pq.read_table(dataset / "train.parquet").to_pylist()[0]
    cfg = config(oracle_url, reference_mode="cached-reference")  # the default: a text-only split
    (outcome,) = judge_and_close(
        OpenAICompatibleJudge(cfg, image_root=dataset),
        [JudgeRequest(image=row["image"], caption=row["reference"], reference=row["reference"])],
    )
    assert isinstance(outcome, JudgeFailure) and outcome.reason == "bad_input"
    assert "rubric.reference_image: true" in outcome.detail
