"""Verdict schema, the reward configuration, verdict -> rewards, length control, b-CapScore and the
record of one judged rollout."""

from balcaprl.rewards.bcapscore import b_capscore
from balcaprl.rewards.config import (
    BCAPSCORE_REWARDS,
    LengthControlConfig,
    LengthMode,
    RewardConfig,
    RewardWeights,
)
from balcaprl.rewards.length import (
    TAU_HIGH,
    TAU_LOW,
    length_ratio,
    linear_length_penalty,
    mask_linguistic_by_length,
)
from balcaprl.rewards.record import RolloutRecord, failed_rollout, score_rollout
from balcaprl.rewards.scoring import REWARD_NAMES, RewardVector, score_verdict
from balcaprl.rewards.verdict import (
    CaptionAssertion,
    ReferenceAssertion,
    Verdict,
    VerdictError,
    parse_verdict,
)

__all__ = [
    "BCAPSCORE_REWARDS",
    "REWARD_NAMES",
    "TAU_HIGH",
    "TAU_LOW",
    "LengthControlConfig",
    "LengthMode",
    "RewardConfig",
    "RewardWeights",
    "RolloutRecord",
    "CaptionAssertion",
    "ReferenceAssertion",
    "RewardVector",
    "Verdict",
    "VerdictError",
    "b_capscore",
    "length_ratio",
    "linear_length_penalty",
    "mask_linguistic_by_length",
    "failed_rollout",
    "parse_verdict",
    "score_rollout",
    "score_verdict",
]
