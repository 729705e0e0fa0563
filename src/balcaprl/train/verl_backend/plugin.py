"""What every verl process of a balcaprl run imports: registers the balcaprl pieces with verl.

verl imports the modules listed in ``VERL_USE_EXTERNAL_MODULES`` (comma-separated) at the end of
``import verl``, in every process that imports it: the driver, the TaskRunner and every Ray worker.
``balcaprl verl launch`` puts this module there through the job's Ray runtime environment
(``+ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES=...``), which Ray applies to
every worker of the job on every node, so nothing depends on how ``ray start`` was run.

Registered here:
- advantage estimators ``balcaprl_c_gdpo`` and ``balcaprl_grpo`` (``core_algos.register_adv_est``);
- the policy loss ``balcaprl_dual_clip`` (``core_algos.register_policy_loss``): verl's dual-clip PPO loss
  with the importance-ratio metrics (``policy_loss.py``);
- the V1 trainer mode ``balcaprl_sync`` (``trainer.ppo.v1.register_trainer``), when TransferQueue (which
  verl's V1 trainer needs) is installed.

The reward function needs no registration: verl loads it from ``reward.custom_reward_function.path``
(``pkg://balcaprl.train.verl_backend.reward``). Importing this module twice is harmless.
"""

from __future__ import annotations

import importlib.util
import logging

import balcaprl.train.verl_backend.policy_loss  # noqa: F401  (registers loss mode balcaprl_dual_clip)
from balcaprl.train.verl_backend.estimator import register_estimators

MODULE = __name__
logger = logging.getLogger(__name__)

register_estimators()

if importlib.util.find_spec("transfer_queue") is not None:
    import balcaprl.train.verl_backend.trainer  # noqa: F401  (registers trainer mode balcaprl_sync)
else:  # verl's V1 trainer cannot run here either; say why the mode will be missing
    logger.warning(
        "transfer_queue is not installed: trainer mode 'balcaprl_sync' is not registered "
        "(pip install 'verl[verl-core]' or transferqueue)"
    )


def registered() -> dict[str, bool]:
    """Which balcaprl names this process's verl knows (for checks on Ray workers)."""
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, POLICY_LOSS_REGISTRY

    from balcaprl.train.verl_backend.policy_loss import LOSS_MODE

    trainers: set[str] = set()
    if importlib.util.find_spec("transfer_queue") is not None:
        from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

        trainers = set(TRAINER_REGISTRY)
    return {
        "balcaprl_c_gdpo": "balcaprl_c_gdpo" in ADV_ESTIMATOR_REGISTRY,
        "balcaprl_grpo": "balcaprl_grpo" in ADV_ESTIMATOR_REGISTRY,
        LOSS_MODE: LOSS_MODE in POLICY_LOSS_REGISTRY,
        "balcaprl_sync": "balcaprl_sync" in trainers,
    }
