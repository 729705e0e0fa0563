"""The reward configuration: how a verdict becomes a rollout's rewards, in one object.

Every place that scores verdicts takes a :class:`RewardConfig` whole (the TRL reward functions, verl's
reward workers, ``balcaprl score``, the evaluations, the demo) and hands it to the one scoring function,
:func:`balcaprl.rewards.record.score_rollout`. A recipe's ``rewards:`` section is a RewardConfig (plus
the run's judge-failure guard, which is no scoring setting).

The metric is not a training choice: b-CapScore is always scored as :data:`BCAPSCORE_REWARDS` says
(evaluation rubric, pointability on, no length control), so that an ablation that trains without
pointability or without the length mask is still measured on the same scale as every other row of the
paper's tables. Only the training rewards follow the recipe.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from balcaprl.config import Section, validate_config
from balcaprl.errors import ConfigError
from balcaprl.rewards.length import TAU_HIGH, TAU_LOW

# The length-control modes, declared here only (recipes, the verl reward kwargs and the scorers use it).
LengthMode = Literal["mask", "linear", "none"]


class _Frozen(Section):
    # Frozen: a reward configuration is shared (module constants, verl's per-process scorer cache).
    model_config = ConfigDict(extra="forbid", frozen=True)


class RewardWeights(_Frozen):
    """w_prec, w_rec, w_ling of eq. 2.5. Paper main results: 0.1 / 0.3 / 0.3."""

    precision: float = Field(0.1, ge=0, description="w_prec, the weight of the precision advantage.")
    recall: float = Field(0.3, ge=0, description="w_rec, the weight of the recall advantage.")
    linguistic: float = Field(0.3, ge=0, description="w_ling, the weight of the linguistic advantage.")

    @model_validator(mode="after")
    def _some_weight(self) -> RewardWeights:
        if self.precision == self.recall == self.linguistic == 0:
            raise ValueError("at least one reward weight must be > 0")
        return self

    def as_list(self) -> list[float]:
        """In the order of ``balcaprl.rewards.REWARD_NAMES`` (precision, recall, linguistic)."""
        return [self.precision, self.recall, self.linguistic]


class LengthControlConfig(_Frozen):
    """Length control on rho = l_pred / l_ref, token lengths in the policy's tokenizer.

    ``mask`` (the paper, Sec. 2.3): the linguistic reward is set to 0 outside [tau_low, tau_high].
    ``linear`` (Appendix A, eqs. A.2-A.5): lambda_len * d(rho) is subtracted from the normalised advantage.
    ``none``: no length control (Table 4, 'w/o length penalty').
    """

    mode: LengthMode = Field("mask", description="mask (the paper), linear (Appendix A) or none.")
    tau_low: float = Field(TAU_LOW, ge=0, description="tau_l, the band's lower bound (inclusive).")
    tau_high: float = Field(TAU_HIGH, gt=0, description="tau_u, the band's upper bound (inclusive).")
    linear_strength: float = Field(
        1.0, ge=0, description="lambda_len of eq. A.4, used by mode=linear (value not given by the paper)."
    )

    @model_validator(mode="after")
    def _ordered(self) -> LengthControlConfig:
        if self.tau_low > self.tau_high:
            raise ValueError(f"tau_low ({self.tau_low}) must not exceed tau_high ({self.tau_high})")
        return self

    def in_band(self, ratio: float) -> bool:
        """tau_l <= rho <= tau_u (Sec. 2.3, both bounds inclusive)."""
        return self.tau_low <= ratio <= self.tau_high


class RewardConfig(_Frozen):
    """What turns a verdict into a rollout's three rewards, and how they are weighted (Sec. 2)."""

    weights: RewardWeights = Field(default_factory=RewardWeights, description="Eq. 2.5's weights.")
    pointability: bool = Field(
        True,
        description="Precision counts only assertions that are pointable and visible (eq. 2.3); false is the "
        "'w/o pointability' ablation (visible assertions count whatever their pointability).",
    )
    length: LengthControlConfig = Field(
        default_factory=LengthControlConfig, description="Length control (Sec. 2.3 / Appendix A)."
    )

    def to_json(self) -> str:
        """Compact JSON of exactly the reward settings (what verl's reward workers receive)."""
        return self.model_dump_json(include=set(RewardConfig.model_fields))

    @classmethod
    def from_json(cls, text: str, source: str = "JSON") -> RewardConfig:
        """The inverse of :meth:`to_json`, validated like any config (a :class:`ConfigError` names the key)."""
        import json

        try:
            data = json.loads(text)
        except (TypeError, json.JSONDecodeError) as error:
            raise ConfigError(f"reward config ({source}) is not JSON: {error}") from None
        return validate_config(cls, data, source, "reward config")

    @classmethod
    def metric(cls) -> RewardConfig:
        """The b-CapScore rule: pointability on, no length control (see the module docstring)."""
        return cls(pointability=True, length=LengthControlConfig(mode="none"))


# b-CapScore (Appendix A, eq. A.1) is always scored this way, whatever the training recipe; its
# weights are unused (the metric is the harmonic mean of the three rewards).
BCAPSCORE_REWARDS = RewardConfig.metric()
