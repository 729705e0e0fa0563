"""balcaprl: balanced reinforcement learning of image captioners.

The pinned public API: the method's arithmetic, the verdict schema and its scoring. The names are
loaded on first use (PEP 562), so ``import balcaprl`` (and with it ``balcaprl --help``) does not
import torch; ``from balcaprl import c_gdpo_advantages`` works as usual.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> the module that defines it
_EXPORTS = {
    "c_gdpo_advantages": "balcaprl.advantages",
    "grpo_advantages": "balcaprl.advantages",
    "CaptionAssertion": "balcaprl.rewards",
    "ReferenceAssertion": "balcaprl.rewards",
    "RewardVector": "balcaprl.rewards",
    "Verdict": "balcaprl.rewards",
    "VerdictError": "balcaprl.rewards",
    "b_capscore": "balcaprl.rewards",
    "linear_length_penalty": "balcaprl.rewards",
    "mask_linguistic_by_length": "balcaprl.rewards",
    "score_verdict": "balcaprl.rewards",
}

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

if TYPE_CHECKING:  # what type checkers and IDEs see
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


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'balcaprl' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
