"""One vocabulary: on the same batch of rollout records, the TRL trainer logs the same metric names as
verl's advantage step, with the same values, apart from what only TRL's scorer counts (judge calls and
the judge's accounting; verl's reward workers call the judge apart from the trainer).

Runs in the main environment (TRL, no verl): verl's side is the code its trainer hook calls, from
compute_score's rows as verl stores them to the step's metrics (none of it imports verl)."""

from __future__ import annotations

import inspect
import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
from trl import GRPOTrainer

from balcaprl.rewards import REWARD_NAMES, RewardConfig, RolloutRecord
from balcaprl.train.advantages import AdvantageStep
from balcaprl.train.step import BatchStep
from balcaprl.train.trl_backend import TRL_LOGGED, BalancedGRPOTrainer
from balcaprl.train.verl_backend.estimator import batch_step_for, verl_batch_step
from balcaprl.train.verl_backend.reward import RewardSettings, _result

NAN = math.nan


def rollouts() -> tuple[list[str], list[RolloutRecord]]:
    """Two prompts: judged rollouts in and out of the band, a masked one, a failed judge."""

    def judged(group, p, r, raw, ratio, masked=False):
        return RolloutRecord(
            id=group, caption="c", caption_tokens=int(10 * ratio), reference_tokens=10, length_ratio=ratio,
            in_band=0.5 <= ratio <= 2.0, precision=p, recall=r, linguistic_raw=raw,
            linguistic=0.0 if masked else raw, masked=masked, non_pointable_share=0.25, non_visible_share=0.5,
            n_caption_assertions=4, n_reference_assertions=3,
        )  # fmt: skip

    records = [
        judged("a", 0.5, 0.2, 0.9, 1.0),
        judged("a", 0.7, 0.4, 0.8, 3.0, masked=True),
        RolloutRecord(
            id="a",
            caption="c",
            caption_tokens=5,
            reference_tokens=10,
            length_ratio=0.5,
            in_band=True,
            failure="timeout",
            failure_detail="slow",
        ),  # fmt: skip
        judged("b", 1.0, 0.5, 0.6, 1.2),
        judged("b", 0.2, 0.5, 0.6, 0.8),
    ]
    return [r.id for r in records], records


def verl_metrics(uids, records) -> dict[str, float]:
    """What verl's advantage step (BalancedPPOTrainerSync._compute_advantage) adds to verl's metrics: the
    rows compute_score returned, as TransferQueue hands them back (plus a padding row), read back into
    records, through the batch step built from the algorithm section."""
    settings = RewardSettings(rewards=RewardConfig(), tokenizer="policy", judge_factory="x:y")
    extra = [{"reward_extra_info": _result(record, settings)} for record in records]
    keys = [f"{uid}_{i}_0" for i, uid in enumerate(uids)] + ["pad_0_0"]
    tags = [{}] * len(records) + [{"is_padding": True}]
    algorithm = {"balcaprl": {"rewards": RewardConfig().to_json()}}  # a DictConfig on verl, read alike
    read_uids, _, metrics = verl_batch_step(
        batch_step_for(algorithm, "balcaprl_c_gdpo"), keys, tags, extra + extra[:1]
    )
    assert read_uids == [*uids, "pad"]
    return metrics


def trl_metrics(uids, records) -> dict[str, float]:
    """What BalancedGRPOTrainer._generate_and_score_completions logs for the batch (its own step, as
    build_trainer makes it, then _log_batch on a trainer stand-in), and the names TRL logs itself."""
    config = RewardConfig()
    step = BatchStep(AdvantageStep(tuple(config.weights.as_list())), length_mode=config.length.mode)
    result = step(records, uids, judge_calls=1, usage={"prompt_tokens": 120.0})
    trainer = SimpleNamespace(
        _metrics={"train": defaultdict(list)}, _logs={"advantages": []}, model=SimpleNamespace(training=True),
        state=SimpleNamespace(global_step=0), rollout_log=None, last_advantages=result.advantages.float(),
    )  # fmt: skip
    BalancedGRPOTrainer._log_batch(trainer, result, records)
    logged = {key: values[-1] for key, values in trainer._metrics["train"].items()}
    # TRL logs each reward function's mean and std itself, named after the function (REWARD_NAMES).
    source = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    assert 'f"rewards/{reward_func_name}/mean"' in source and 'f"rewards/{reward_func_name}/std"' in source
    assert {f"rewards/{n}/{s}" for n in REWARD_NAMES for s in ("mean", "std")} == TRL_LOGGED
    return logged | {name: result.metrics[name] for name in TRL_LOGGED}


def test_both_backends_log_the_same_metric_names_for_the_same_batch():
    uids, records = rollouts()
    trl, verl = trl_metrics(uids, records), verl_metrics(uids, records)
    assert set(trl) - set(verl) == {"judge/calls", "judge/usage/prompt_tokens"}  # only TRL's scorer counts
    assert set(verl) - set(trl) == set()
    for name in sorted(set(trl) & set(verl)):
        assert trl[name] == pytest.approx(verl[name], nan_ok=True), name
    # A few by hand, so that equal names also mean the right numbers.
    assert verl["judge/failure_share"] == pytest.approx(1 / 5)
    assert verl["length/masked_share"] == pytest.approx(1 / 4)
    assert verl["assertions/non_visible_share"] == pytest.approx(0.5)
    assert verl["rewards/precision/mean"] == pytest.approx((0.5 + 0.7 + 1.0 + 0.2) / 4)
    assert verl["groups/recall_flat_share"] == pytest.approx(1 / 2)  # prompt b: recall 0.5 twice
