"""balcaprl: balanced reinforcement learning of image captioners.

The pinned public API (see DESIGN.md): the method's arithmetic, the verdict schema and its scoring.
"""

from balcaprl.advantages import c_gdpo_advantages, grpo_advantages
from balcaprl.rewards import (
    CaptionAssertion,
    ReferenceAssertion,
    RewardVector,
    Verdict,
    VerdictError,
    b_capscore,
    linear_length_penalty,
    mask_linguistic_by_length,
    score_verdict,
)

__version__ = "0.1.0"

__all__ = [
    "CaptionAssertion",
    "ReferenceAssertion",
    "RewardVector",
    "Verdict",
    "VerdictError",
    "b_capscore",
    "c_gdpo_advantages",
    "grpo_advantages",
    "linear_length_penalty",
    "mask_linguistic_by_length",
    "score_verdict",
]
