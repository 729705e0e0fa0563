"""The balcaprl V1 trainer step and the plugin on a real (local, CPU) Ray cluster with TransferQueue:

- the rendered Ray runtime environment makes every Ray worker import the balcaprl plugin (estimators and
  trainer mode registered there, not only in the driver);
- verl's own V1 advantage step (``PPOTrainer._compute_advantage``: TransferQueue in, TransferQueue out),
  wrapped by ``BalancedPPOTrainerSync``, writes exactly ``c_gdpo_advantages`` per rollout, with verl's
  padding rows left out.

Starts one local Ray instance for the module (about 20 s on 2 cores)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

pytest.importorskip("verl")
pytest.importorskip("transfer_queue")

import ray  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from verl_testkit import crafted_batch  # noqa: E402

from balcaprl import c_gdpo_advantages  # noqa: E402
from balcaprl.rewards import REWARD_NAMES, RewardConfig, RewardWeights, RolloutRecord  # noqa: E402
from balcaprl.train.advantages import group_index_from_ids  # noqa: E402
from balcaprl.train.verl_backend.estimator import (  # noqa: E402
    batch_step_for,
    rollout_records,
    verl_batch_step,
)
from balcaprl.train.verl_backend.render import PLUGIN_MODULE, render_verl  # noqa: E402
from balcaprl.train.verl_backend.trainer import (  # noqa: E402
    TRAINER_MODE,
    BalancedPPOTrainerSync,
)

WEIGHTS = [0.1, 0.3, 0.3]


def info(precision, recall, linguistic, failure=None):
    """A row's extra_fields as verl stores them: compute_score's dict (verl's score, the record's row)."""
    record = RolloutRecord(
        id="row", caption="a red circle", caption_tokens=3, reference_tokens=3, length_ratio=1.0, in_band=True,
        precision=precision, recall=recall, linguistic=linguistic, linguistic_raw=linguistic, failure=failure,
        non_pointable_share=0.0, non_visible_share=0.0, n_caption_assertions=2,
    )  # fmt: skip
    return {"reward_extra_info": {"score": 0.0, **record.row()}}


def test_rollout_records_read_compute_score_dicts_and_drop_padding():
    keys = ["u1_0_0", "u1_1_0", "u2_0_0", "padabc_0_0"]
    tags = [{}, {}, {}, {"is_padding": True}]
    extra = [
        info(0.5, 0.2, 0.9),
        info(math.nan, math.nan, math.nan, "timeout"),
        info(1.0, 0.0, 0.5),
        info(0.5, 0.2, 0.9),
    ]
    uids, rollouts = rollout_records(keys, tags, extra)
    assert uids == ["u1", "u1", "u2", "padabc"]
    assert rollouts[0].as_tuple() == (0.5, 0.2, 0.9) and rollouts[3] is None  # padding: left out, not a copy
    assert rollouts[1].failure == "timeout" and not rollouts[1].judged
    trainer = bare_trainer()
    step = batch_step_for(trainer.config.algorithm, trainer.config.algorithm.adv_estimator)
    assert verl_batch_step(step, keys, tags, extra)[0] == uids
    _, advantages, metrics = verl_batch_step(step, keys, tags, extra)
    assert advantages[1] == 0 and advantages[3] == 0  # a failed judge and a padding row
    assert metrics["judge/requests"] == 3.0
    assert metrics["judge/failure_share"] == pytest.approx(1 / 3)
    assert metrics["judge/failures/timeout"] == 1.0
    assert metrics["rewards/precision/mean"] == pytest.approx(0.75)
    with pytest.raises(KeyError, match="compute_score"):
        rollout_records(["u_0_0"], [{}], [{"reward_extra_info": {"acc": 1.0}}])


def test_batch_metrics_carry_the_judges_share_of_the_step():
    # compute_score stamps each rollout: judging started (generation done) and finished
    extra = [info(0.5, 0.2, 0.9), info(1.0, 0.0, 0.5), info(0.5, 0.5, 0.5)]
    for row, (started, finished) in zip(extra, [(100.0, 103.0), (101.0, 102.0), (104.0, 106.5)], strict=True):
        row["reward_extra_info"].update(judge_started_s=started, judge_finished_s=finished)
    step = batch_step_for(bare_trainer().config.algorithm, "balcaprl_c_gdpo")
    _, _, metrics = verl_batch_step(step, ["u1_0_0", "u1_1_0", "u2_0_0"], [{}, {}, {}], extra)
    assert metrics["judge/wall_s"] == 6.5  # 100 -> 106.5
    assert metrics["judge/exposed_s"] == 2.5  # the last rollout generated at 104, judged at 106.5


# ------------------------------------------------------------------------ on a local Ray cluster


@pytest.fixture(scope="module")
def ray_cluster():
    """Ray started exactly as verl's run_ppo starts it, with the runtime env balcaprl renders."""
    from pathlib import Path

    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env

    from balcaprl.recipe import load_recipe

    launch = render_verl(load_recipe(Path(__file__).resolve().parents[2] / "configs" / "qwen2_5_vl_3b.yaml"))
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=launch.overrides)
    ray_init = cfg.ray_kwargs.get("ray_init", {})
    runtime_env = OmegaConf.merge(get_ppo_ray_runtime_env(cfg), ray_init.get("runtime_env", {}))
    kwargs = OmegaConf.to_container(OmegaConf.create({**ray_init, "runtime_env": runtime_env}))
    kwargs.update(num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray.init(**kwargs)
    import transfer_queue as tq

    tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
    yield tq
    tq.close()
    ray.shutdown()


@ray.remote(num_cpus=0)
class Probe:
    """A Ray actor like verl's TaskRunner and workers: it imports verl, nothing of balcaprl."""

    def registered(self):
        import os
        import sys

        import verl  # noqa: F401  (VERL_USE_EXTERNAL_MODULES is read here)
        from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, POLICY_LOSS_REGISTRY
        from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

        return {
            "env": os.environ.get("VERL_USE_EXTERNAL_MODULES"),
            "plugin_imported": PLUGIN_MODULE in sys.modules,
            "estimators": sorted(n for n in ADV_ESTIMATOR_REGISTRY if n.startswith("balcaprl")),
            "trainer": TRAINER_MODE in TRAINER_REGISTRY,
            "policy_losses": sorted(n for n in POLICY_LOSS_REGISTRY if n.startswith("balcaprl")),
        }


def test_the_plugin_reaches_ray_workers(ray_cluster):
    report = ray.get(Probe.remote().registered.remote())
    assert report == {
        "env": PLUGIN_MODULE,
        "plugin_imported": True,
        "estimators": ["balcaprl_c_gdpo", "balcaprl_grpo"],
        "trainer": True,
        "policy_losses": ["balcaprl_dual_clip"],
    }


def trainer_config():
    return OmegaConf.create(
        {
            "algorithm": {
                "adv_estimator": "balcaprl_c_gdpo",
                "gamma": 1.0,
                "lam": 1.0,
                "norm_adv_by_std_in_grpo": True,
                "use_kl_in_reward": False,
                "gdpo_reward_keys": list(REWARD_NAMES),
                # as rendered: the estimator reads the reward function's reward config (one JSON string)
                "balcaprl": {
                    "eps": 1e-6,
                    "max_failed_batches_in_a_row": 2,
                    "rewards": "${reward.custom_reward_function.reward_kwargs.rewards}",
                },
            },
            "reward": {
                "custom_reward_function": {
                    "reward_kwargs": {
                        "rewards": RewardConfig(
                            weights=RewardWeights(**dict(zip(REWARD_NAMES, WEIGHTS, strict=True)))
                        ).to_json()
                    }
                }
            },
            "actor_rollout_ref": {"rollout": {"n": 8}},
            "trainer": {"v1": {"trainer_mode": TRAINER_MODE}},
        }
    )


def put_batch(tq, uids, rewards, mask, partition, padding=0):
    """Rollouts stored as verl's agent loop stores them (one key per rollout, jagged per-token fields),
    plus `padding` synthetic rows as verl's padding_utils builds them (copied rewards, empty mask)."""
    from transfer_queue import KVBatchMeta
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    keys, fields, tags = [], [], []
    sessions: dict[str, int] = {}
    for i, uid in enumerate(uids):
        session = sessions.setdefault(uid, 0)
        sessions[uid] += 1
        length = int(mask[i].sum())
        keys.append(f"{uid}_{session}_0")
        fields.append(
            {
                "uid": uid,
                "response_mask": torch.ones(length, dtype=torch.int64),
                "rm_scores": torch.zeros(length),
                "old_log_probs": torch.zeros(length),
                "extra_fields": info(
                    *rewards[i].tolist(), "timeout" if bool(rewards[i].isnan().all()) else None
                ),
            }
        )
        tags.append({})
    for p in range(padding):
        keys.append(f"padxyz_{p}_0")
        fields.append(
            {
                **fields[0],
                "uid": "padxyz",
                "response_mask": torch.zeros(1, dtype=torch.int64),
                "rm_scores": torch.zeros(1),
                "old_log_probs": torch.zeros(1),
            }
        )
        tags.append({"is_padding": True})
    tq.kv_batch_put(keys=keys, partition_id=partition, fields=list_of_dict_to_tensordict(fields), tags=tags)
    return KVBatchMeta(keys=keys, tags=tags, partition_id=partition)


def bare_trainer():
    trainer = BalancedPPOTrainerSync.__new__(BalancedPPOTrainerSync)  # no workers: only the advantage step
    trainer.config = trainer_config()
    return trainer


def test_verls_v1_advantage_step_writes_the_contracts_advantages(ray_cluster):
    tq = ray_cluster
    uids, rewards, mask = crafted_batch(7)
    batch = put_batch(tq, list(uids), rewards, mask, "train", padding=3)
    metrics: dict = {}
    out = bare_trainer()._compute_advantage(batch, metrics)
    data = tq.kv_batch_get(keys=out.keys, partition_id="train", select_fields=["advantages", "returns"])
    advantages = data["advantages"]
    per_rollout = torch.stack([row[0] if row.numel() else torch.tensor(0.0) for row in advantages.unbind(0)])
    for row, value in zip(advantages.unbind(0), per_rollout, strict=True):
        assert torch.all(row == value)  # one value on every token of a rollout
    expected = c_gdpo_advantages(rewards, group_index_from_ids(uids), WEIGHTS)
    assert torch.allclose(per_rollout[: len(uids)].double(), expected, atol=1e-6, rtol=0)
    assert per_rollout[len(uids) :].tolist() == [0.0, 0.0, 0.0]  # padding rows
    assert metrics["judge/requests"] == len(uids)
    assert metrics["judge/failure_share"] == pytest.approx(3 / len(uids))


def test_the_run_stops_when_the_judge_fails_on_whole_batches(ray_cluster):
    tq = ray_cluster
    uids = np.array(["a", "a", "b", "b"], dtype=object)
    failed = torch.full((4, 3), float("nan"), dtype=torch.float64)
    mask = torch.ones(4, 3)
    trainer = bare_trainer()
    trainer._compute_advantage(put_batch(tq, list(uids), failed, mask, "f1"), {})
    with pytest.raises(RuntimeError, match="every rollout of 2 batches in a row"):
        trainer._compute_advantage(put_batch(tq, list(uids), failed, mask, "f2"), {})
    ok = torch.rand(4, 3, dtype=torch.float64)
    trainer._compute_advantage(put_batch(tq, list(uids), ok, mask, "f3"), {})
    assert trainer._balcaprl_step.failed_in_a_row == 0
