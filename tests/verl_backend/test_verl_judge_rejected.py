"""verl stops at once when the judge's endpoint rejects the key (issue 23): the reward function marks
every rollout of such a batch ``judge_rejected`` and the advantage step raises the judge's one-line
error before the update, on the first such batch (not after ``max_failed_batches_in_a_row``)."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("verl")

from balcaprl.errors import UserError  # noqa: E402
from balcaprl.rewards import REWARD_NAMES  # noqa: E402
from balcaprl.train.rewards import JUDGE_REJECTED  # noqa: E402
from balcaprl.train.verl_backend.estimator import RolloutRewards  # noqa: E402
from balcaprl.train.verl_backend.trainer import BalancedPPOTrainerSync  # noqa: E402

REFUSED = "the judge endpoint http://127.0.0.1:9/v1/ rejected the request with HTTP 401 (AuthenticationError)"


def failed_batch(reason: str, n: int = 4) -> tuple[RolloutRewards, list[dict]]:
    columns = RolloutRewards(
        uids=tuple("aabb"[:n]),
        rewards=torch.full((n, len(REWARD_NAMES)), math.nan, dtype=torch.float64),
        length_penalty=torch.zeros(n),
    )
    return columns, [{"failure": reason, "failure_detail": REFUSED}] * n


def test_the_first_batch_the_endpoint_rejected_stops_the_run():
    trainer = BalancedPPOTrainerSync.__new__(BalancedPPOTrainerSync)  # no workers: only the check
    with pytest.raises(UserError, match=r"HTTP 401.*training stopped before this batch's update"):
        trainer._balcaprl_check_judge(*failed_batch(JUDGE_REJECTED))
    assert trainer._balcaprl_failed_in_a_row == 0  # not counted as a judge outage: stopped outright
