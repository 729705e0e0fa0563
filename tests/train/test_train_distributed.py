"""Two processes (torchrun, CPU, gloo): each rank judges only its rollouts, the advantage step sees the
gathered batch, and each rank's loss gets its own slice of exactly c_gdpo_advantages."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from train_testkit import run_on_two_processes

from balcaprl import c_gdpo_advantages
from balcaprl.train.advantages import group_index_from_ids

WORKER = Path(__file__).with_name("train_distributed_worker.py")


@pytest.fixture(scope="module")
def ranks(tiny_policy, tiny_dataset, tmp_path_factory):
    out = tmp_path_factory.mktemp("distributed")
    run_on_two_processes(WORKER, tiny_policy, tiny_dataset, out)
    return {
        case: [json.loads((out / case / f"rank{r}.json").read_text()) for r in (0, 1)]
        for case in ("whole_groups", "split_groups")
    }


@pytest.mark.slow
@pytest.mark.parametrize("case", ["whole_groups", "split_groups"])
def test_two_ranks_share_one_advantage_step(ranks, case):
    rank0, rank1 = ranks[case]
    captions_per_rank = {"whole_groups": 4, "split_groups": 2}[case]
    for rank in (rank0, rank1):
        assert rank["judge_calls"] == 2  # one judge call per rank per step
        assert rank["judge_requests"] == 2 * captions_per_rank  # only its own rollouts
    for b0, b1 in zip(rank0["batches"], rank1["batches"], strict=True):
        assert b0["all_rewards"] == b1["all_rewards"] and b0["all_advantages"] == b1["all_advantages"]
        ids = b0["ids"] + b1["ids"]  # gather order: rank 0 then rank 1
        if case == "split_groups":
            assert b0["ids"] == b1["ids"]  # one prompt, its rollouts on both ranks
        rewards = torch.tensor([[math.nan if v is None else v for v in row] for row in b0["all_rewards"]])
        expected = c_gdpo_advantages(rewards, group_index_from_ids(ids), [0.1, 0.3, 0.3], eps=1e-6)
        torch.testing.assert_close(torch.tensor(b0["all_advantages"]), expected, atol=1e-6, rtol=0)
        n = len(b0["ids"])
        assert b0["local_advantages"] == pytest.approx(b0["all_advantages"][:n], abs=1e-7)
        assert b1["local_advantages"] == pytest.approx(b0["all_advantages"][n:], abs=1e-7)
