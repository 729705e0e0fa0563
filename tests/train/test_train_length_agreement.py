"""Both backends count a caption's length from the token ids the policy generated, so the length mask
(Sec. 2.3) decides the same on both: the same rollouts go through TRL's reward functions
(``SharedVerdictScorer``) and verl's ``compute_score`` (with the ids balcaprl's reward manager hands it),
and every rollout's count, ratio, band and mask decision is compared. The policy here has a BPE
tokenizer, where a generated sequence need not be the one its text re-encodes to ("a" "b" decodes to
"ab", which encodes as one token): re-encoding, verl's former count, decides differently at the band's
edges, which the last test shows."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

import pytest
from train_testkit import ScriptedJudge

from balcaprl.rewards import RewardConfig
from balcaprl.train.rewards import SharedVerdictScorer
from balcaprl.train.verl_backend.reward import RESPONSE_IDS, compute_score

PIECES = ["a", "b", "c", "ab", "bc", "abc", " "]
MERGES = [("a", "b"), ("b", "c"), ("ab", "c")]


def judge(image_root=None):  # compute_score's judge_factory
    return ScriptedJudge(fail_every=None, check_images=False)


@pytest.fixture(scope="module")
def bpe_policy(tmp_path_factory) -> Path:
    """A tokenizer folder: byte-free BPE over a, b, c (merges ab, bc, abc), EOS and padding."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {piece: i for i, piece in enumerate(PIECES)}
    raw = Tokenizer(models.BPE(vocab=vocab, merges=MERGES))
    raw.decoder = decoders.Fuse()  # tokens joined as they are, as byte-level BPE decodes
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="</s>", pad_token="<pad>")
    out = tmp_path_factory.mktemp("bpe-policy")
    tokenizer.save_pretrained(out)
    return out


def rollouts(tokenizer) -> list[list[int]]:
    """Generated id sequences: the non-canonical split of each piece, and random ones (seeded), EOS last."""
    rng = random.Random(0)
    ids = {piece: tokenizer.convert_tokens_to_ids(piece) for piece in PIECES}
    crafted = [[ids["a"], ids["b"]], [ids["a"], ids["b"], ids["c"]], [ids["ab"], ids["c"]], [ids["abc"]]]
    drawn = [[rng.choice([ids[p] for p in "abc"]) for _ in range(rng.randint(1, 8))] for _ in range(40)]
    return [seq + [tokenizer.eos_token_id] for seq in crafted + drawn]


def _trl(tokenizer, sequences, reference_tokens, rewards):
    scorer = SharedVerdictScorer(judge(), rewards, special_token_ids=tokenizer.all_special_ids)
    captions = tokenizer.batch_decode(sequences, skip_special_tokens=True)  # as TRL's _generate decodes
    columns = {"id": [f"r{i}" for i in range(len(sequences))], "image_path": ["x.png"] * len(sequences),
               "reference": ["abc"] * len(sequences), "reference_tokens": [reference_tokens] * len(sequences)}  # fmt: skip
    return asyncio.run(scorer.score(captions, sequences, **columns)).rollouts


def _verl(tokenizer, policy, sequences, reference_tokens, rewards, with_ids=True):
    kwargs = {"rewards": rewards.to_json(), "tokenizer": str(policy), "judge_factory": f"{__name__}:judge"}
    rows = []
    for i, ids in enumerate(sequences):
        text = tokenizer.decode(ids, skip_special_tokens=True)  # as verl's naive manager decodes
        extra = {
            "id": f"r{i}",
            "image_path": "x.png",
            "reference_tokens": reference_tokens,
            "tokenizer": str(policy),
        }
        if with_ids:
            extra[RESPONSE_IDS] = ids
        rows.append(asyncio.run(compute_score("balcaprl", text, "abc", extra, **kwargs)))
    return rows


DECISIONS = ("caption_tokens", "length_ratio", "in_band", "masked")


@pytest.mark.parametrize("reference_tokens", [2, 3, 4, 5])
def test_both_backends_make_every_mask_decision_alike(bpe_policy, reference_tokens):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(bpe_policy)
    sequences = rollouts(tokenizer)
    rewards = RewardConfig()
    trl = _trl(tokenizer, sequences, reference_tokens, rewards)
    verl = _verl(tokenizer, bpe_policy, sequences, reference_tokens, rewards)
    assert all(r.judged for r in trl) and all(row["failure"] is None for row in verl)
    for record, row in zip(trl, verl, strict=True):
        assert {k: getattr(record, k) for k in DECISIONS} == {k: row[k] for k in DECISIONS}
    assert [r.caption_tokens for r in trl] == [len(ids) - 1 for ids in sequences]  # all but EOS


def test_re_encoding_the_text_would_decide_differently_at_the_bands_edge(bpe_policy):
    """Without the generated ids (verl's plain naive manager) "a" "b" counts as one token: with a
    reference of 4 tokens the ratio is 0.25 instead of 0.5, masked instead of in the band."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(bpe_policy)
    sequences = rollouts(tokenizer)[:1]  # "a" "b" + EOS
    rewards = RewardConfig()
    (record,) = _trl(tokenizer, sequences, 4, rewards)
    (row,) = _verl(tokenizer, bpe_policy, sequences, 4, rewards, with_ids=False)
    assert (record.caption_tokens, record.masked) == (2, False)
    assert (row["caption_tokens"], row["masked"]) == (1, True)
    assert json.loads(rewards.to_json())["length"]["tau_low"] == 0.5
