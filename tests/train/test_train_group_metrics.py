"""Which prompts gave a reward no relative signal (all rollouts equal): hand-counted batches."""

from __future__ import annotations

import math

from balcaprl.rewards import RolloutRecord
from balcaprl.train.metrics import flat_group_shares


def rollout(prompt, precision, recall, linguistic):
    return (prompt, RolloutRecord(id=prompt, precision=precision, recall=recall, linguistic=linguistic))


def test_flat_shares_count_prompts_not_rollouts():
    judged = [
        # prompt a: linguistic the same for both rollouts
        rollout("a", 0.5, 0.2, 22 / 27),
        rollout("a", 0.7, 0.4, 22 / 27),
        # prompt b: every reward the same
        rollout("b", 1.0, 0.5, 0.9),
        rollout("b", 1.0, 0.5, 0.9),
        rollout("b", 1.0, 0.5, 0.9),
        # prompt c: nothing flat
        rollout("c", 0.1, 0.2, 0.3),
        rollout("c", 0.2, 0.3, 0.4),
        # prompt d: one judged rollout only (the others failed): no spread to speak of, left out
        rollout("d", 0.3, 0.3, 0.3),
    ]
    assert flat_group_shares(judged) == {
        "groups/precision_flat_share": 1 / 3,
        "groups/recall_flat_share": 1 / 3,
        "groups/linguistic_flat_share": 2 / 3,
        "groups/all_flat_share": 1 / 3,
    }


def test_no_prompt_with_two_judged_rollouts_is_undefined_not_zero():
    shares = flat_group_shares([rollout("a", 1.0, 1.0, 1.0)])
    assert len(shares) == 4 and all(math.isnan(v) for v in shares.values())
