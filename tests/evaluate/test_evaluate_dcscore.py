"""DCScore: the trial arithmetic by hand, and the whole protocol over the loopback server on a
fixture in DeCapBench's own formats (annotation JSONL, caption JSONL with image_path)."""

from __future__ import annotations

import json

import pytest
from evaluate_testkit import DECAP_ORACLE, ProtocolJudge, judge_config, write_decapbench

from balcaprl.evaluate.dcscore import DCScoreSection, caption_scores, run_dcscore, score_trial
from balcaprl.evaluate.formats import read_caption_sets, read_decapbench
from balcaprl.judge import JudgeCaller


def test_one_trial_by_hand():
    # 4 predicted facts, 3 oracle facts. Facts 0 and 1 both match oracle fact 1 (k = 2); facts 2 and
    # 3 match nothing. Verified: 0, 2, 3. Relevant: 0 and 3.
    t = score_trial([True, False, False, True], [1, 1, None, None], [True, False, True, True], n_oracle=3)
    # precision 3/4; recall: fact 0 earns 1/2, the two verified unmatched earn 1 each and join the
    # denominator -> 2.5 / (3 + 2)
    assert (t.precision, t.recall, t.total_facts) == (0.75, 0.5, 5)
    assert t.f1 == pytest.approx(2 * 0.75 * 0.5 / 1.25)
    # relevant: facts 0 and 3 both verified -> precision 1; fact 0 still earns 1/2 because, as in the
    # official code, k is counted over all predicted facts; fact 3 earns 1 and joins -> 1.5 / 4
    assert (t.precision_relevant, t.recall_relevant, t.total_facts_relevant) == (1.0, 0.375, 4)
    assert t.f1_relevant == pytest.approx(2 * 0.375 / 1.375)
    scores = caption_scores([t])
    assert scores["dcscore"] == pytest.approx((0.6 + 0.75 / 1.375) / 2)


def test_nothing_predicted_scores_zero_and_no_trial_is_an_error():
    t = score_trial([], [], [], n_oracle=3)
    assert (t.precision, t.recall, t.f1, t.f1_relevant) == (0.0, 0.0, 0.0, 0.0)
    t = score_trial([False], [None], [True], n_oracle=2)  # no relevant fact at all
    assert t.precision == 1.0 and t.recall == pytest.approx(1 / 3) and t.f1_relevant == 0.0
    with pytest.raises(ValueError):
        caption_scores([])
    with pytest.raises(ValueError):
        score_trial([True], [None, None], [True], n_oracle=1)


CAPTION = "A red door on the left, a purple elephant, a cozy scene."
FACTS = [
    ("There is a red door", "door_0", True),
    ("The door is on the left", "door_0", True),
    ("A purple elephant stands nearby", "elephant_0", True),
    ("The scene feels cozy", "", False),
]
ORACLE = DECAP_ORACLE["iiw_001.jpg"]["oracle_facts"]


def judge_for_caption() -> ProtocolJudge:
    return ProtocolJudge(
        facts={CAPTION: FACTS},
        # the n-th matching call answers with the n-th entry: trials a, b, a
        matches={
            "There is a red door": [ORACLE[0]],
            "The door is on the left": [ORACLE[1], ORACLE[0], ORACLE[1]],
        },
        # verification trials x, y, y
        verified={
            "There is a red door": [True],
            "The door is on the left": [True],
            "The scene feels cozy": [True, False, False],
        },  # fmt: skip
    )


# By hand (n = 4 facts, 3 oracle facts; relevance T T T F):
#   match a = [1, 2, -, -], match b = [1, 1, -, -]; verify x = [T T F T], verify y = [T T F F]
#   (a,x): P 3/4, R 3/4 -> F1 3/4;       relevant P 2/3, R 2/3 -> 2/3
#   (a,y): P 1/2, R 2/3 -> F1 4/7;       relevant 2/3
#   (b,x): P 3/4, R (1/2+1/2+1)/4 = 1/2 -> F1 3/5;   relevant P 2/3, R 1/3 -> 4/9
#   (b,y): P 1/2, R 1/3 -> F1 2/5;       relevant 4/9
#   trials: a twice, b once; x once, y twice -> weights (a,x) 2, (a,y) 4, (b,x) 1, (b,y) 2 of 9
F1 = (2 * 3 / 4 + 4 * 4 / 7 + 3 / 5 + 2 * 2 / 5) / 9
F1_REL = (6 * 2 / 3 + 3 * 4 / 9) / 9
PRECISION = (3 * 3 / 4 + 6 * 1 / 2) / 9


def test_protocol_over_http_then_resume(tmp_path, eval_server):
    annotations, images = write_decapbench(tmp_path)
    captions_file = tmp_path / "model.decapbench.jsonl"
    captions_file.write_text(
        json.dumps({"image_path": "iiw_001.jpg", "caption": CAPTION}) + "\n"
        + json.dumps({"image_path": "iiw_002.jpg", "caption": "FAULTY caption"}) + "\n"
    )  # fmt: skip
    handler = judge_for_caption()
    server = eval_server(handler, rules={"FAULTY": ["server_error"]})
    cfg = judge_config(server.base_url, cache_path=tmp_path / "cache.sqlite")
    items = read_decapbench(annotations)
    sets = read_caption_sets([captions_file])
    assert set(sets) == {"decapbench"}  # recognised by its image_path field

    result = run_dcscore(
        JudgeCaller(cfg, image_root=images),
        items,
        sets["decapbench"],
        tmp_path / "d1",
        DCScoreSection(images=images),
    )
    assert result.score == pytest.approx(100 * (F1 + F1_REL) / 2, rel=1e-6)
    assert result.metrics["precision"] == pytest.approx(100 * PRECISION)
    assert result.metrics["f1"] == pytest.approx(100 * F1, rel=1e-6)
    assert result.failures == {"server_error": 1} and result.n_scored == 1 and not result.complete
    assert server.counters.by_kind == {"dcscore_extract": 2, "dcscore_match": 3, "dcscore_verify": 3}
    verify_call = next(c for c in handler.seen if c.kind == "dcscore_verify")
    assert len(verify_call.images) == 1 and DECAP_ORACLE["iiw_001.jpg"]["oracle_caption"] in verify_call.text
    assert verify_call.temperature == 0.3 and verify_call.max_tokens == 2000
    rows = [json.loads(line) for line in (tmp_path / "d1" / "items.jsonl").read_text().splitlines()]
    assert rows[0]["n_facts"] == 4 and len(rows[0]["trials"]) == 9
    assert rows[1]["failure"] == "server_error" and "extract" in rows[1]["detail"]

    # A re-run pays only for what failed: the other caption's 7 calls come from the cache. The FAULTY
    # caption now reaches the judge, which finds no fact in it: the official formulas are undefined
    # (precision = 0 / 0), so, as the official scorer does, its extraction is sampled again up to 5
    # times, then the caption is invalid: left out of the mean and counted.
    server.counters.by_kind.clear()
    again = run_dcscore(
        JudgeCaller(cfg, image_root=images),
        items,
        sets["decapbench"],
        tmp_path / "d2",
        DCScoreSection(images=images),
    )
    assert server.counters.by_kind == {"dcscore_extract": 5}
    assert again.complete and again.n_scored == 1
    assert again.metrics["n_invalid"] == 1 and again.metrics["invalid"] == {"iiw_002.jpg": "no fact"}
    # before (a degenerate caption scored 0 and kept): 100 x (F1 + F1_REL) / 4; after: / 2
    assert again.score == pytest.approx(100 * (F1 + F1_REL) / 2, rel=1e-6)
    # our stricter rule is one option away: one extraction, the caption scored 0 and kept in the mean
    server.counters.by_kind.clear()
    strict = run_dcscore(
        JudgeCaller(cfg, image_root=images), items, sets["decapbench"], tmp_path / "d3",
        DCScoreSection(images=images, degenerate_captions="zero"),
    )  # fmt: skip
    assert server.counters.by_kind == {} and strict.n_scored == 2 and strict.metrics["n_invalid"] == 0
    assert strict.score == pytest.approx(100 * (F1 + F1_REL) / 4, rel=1e-6)


def test_invalid_match_answers_are_reasked_then_fail(tmp_path, eval_server):
    annotations, images = write_decapbench(tmp_path)

    class BadIds(ProtocolJudge):
        def __call__(self, call):
            answer = super().__call__(call)
            if call.kind == "dcscore_match":
                answer["matches"] = answer["matches"][:-1]  # one fact left out
            return answer

    handler = BadIds(facts={CAPTION: FACTS})
    server = eval_server(handler)
    captions = read_caption_sets([_write(tmp_path / "c.json", {"iiw_001.jpg": CAPTION})])[None]
    result = run_dcscore(
        JudgeCaller(judge_config(server.base_url)), read_decapbench(annotations), captions,
        tmp_path / "out", DCScoreSection(images=images, n_match=1, n_verify=1),
    )  # fmt: skip
    assert result.failures == {"schema_violation": 1} and result.score is None
    assert result.missing == ["iiw_002.jpg"]
    # asked and re-asked once in each of the caption's 5 tries (max_attempts), then given up
    assert handler.calls["dcscore_match"] == 2 * 5 and handler.calls["dcscore_extract"] == 5


def _write(path, value):
    path.write_text(json.dumps(value))
    return path
