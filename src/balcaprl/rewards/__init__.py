"""Verdict schema, verdict -> reward vector, length control and b-CapScore."""

from balcaprl.rewards.bcapscore import b_capscore
from balcaprl.rewards.length import length_ratio, linear_length_penalty, mask_linguistic_by_length
from balcaprl.rewards.scoring import REWARD_NAMES, RewardVector, score_verdict
from balcaprl.rewards.verdict import (
    CaptionAssertion,
    ReferenceAssertion,
    Verdict,
    VerdictError,
    parse_verdict,
)

__all__ = [
    "REWARD_NAMES",
    "CaptionAssertion",
    "ReferenceAssertion",
    "RewardVector",
    "Verdict",
    "VerdictError",
    "b_capscore",
    "length_ratio",
    "linear_length_penalty",
    "mask_linguistic_by_length",
    "parse_verdict",
    "score_verdict",
]
