"""One judge call per rollout, three reward functions.

TRL calls each reward function separately (async ones together, on its event-loop thread). The paper's
three rewards come out of *one* verdict, so the three functions here share a :class:`SharedVerdictScorer`:
the first function called for a batch starts the judge call, the other two await the same result (a
memo keyed by the batch's (row id, caption) pairs). No triple billing; a test counts the calls.

For every rollout the scorer:
1. sends one ``JudgeRequest(image, caption, reference, rubric)``: the training rubric, or for the
   "w/o pointability" ablation (``RewardConfig.pointability = False``) the training rubric with the
   pointability test removed from the judge's prompt, as the paper's ablation removes it
   (:func:`~balcaprl.judge.rubrics.training_rubric_name`);
2. counts the caption's tokens with the policy's tokenizer;
3. scores the verdict with :func:`balcaprl.rewards.score_rollout` under the recipe's
   :class:`~balcaprl.rewards.RewardConfig`: eq. 2.3 with its pointability rule, the length mask on
   the linguistic reward (Sec. 2.3), and the linear length penalty that the advantage step subtracts
   (eq. A.5) when the recipe chose it.

A failed judge (``JudgeFailure``, or an exception from the judge) gives ``None`` for all three
rewards, which TRL turns into NaN, so the advantage step leaves the rollout out; never a 0. The length
control acts on judged rollouts only: a rollout without a verdict has no reward at all.

One failure is not a rollout's but the run's: an endpoint that rejects the judge's configuration (a
revoked or wrong API key, 401/403; an unknown model, 404) fails every later call too. Its rollouts
are marked ``judge_rejected``, and :meth:`SharedVerdictScorer.check_batch_failures` stops the run at
that batch with the judge's one-line error (a :class:`~balcaprl.errors.UserError`: exit status 2),
before any update: the checkpoints written so far stay, and no final model is saved.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from balcaprl.errors import ConfigError, UserError
from balcaprl.judge.protocol import Judge, JudgeFailure, Judgement, JudgeRequest
from balcaprl.judge.rubrics import training_rubric_name
from balcaprl.rewards import REWARD_NAMES, RewardConfig, length_gate, score_rollout

__all__ = [
    "JUDGE_EXCEPTION",
    "JUDGE_REJECTED",
    "ScoredBatch",
    "ScoredRollout",
    "SharedVerdictScorer",
    "caption_text",
    "judge_usage",
]

logger = logging.getLogger(__name__)

# Failure reason recorded when the judge raised instead of returning a JudgeFailure.
JUDGE_EXCEPTION = "judge_exception"
# Failure reason of every rollout of a batch whose judge raised a UserError: the endpoint rejected the
# key, the permissions or the model (see the module docstring); the run stops on it.
JUDGE_REJECTED = "judge_rejected"


@dataclass
class ScoredRollout:
    """Everything the trainer logs about one rollout's reward."""

    id: str
    caption: str
    caption_tokens: int  # policy tokenizer, special tokens (EOS, padding) excluded
    reference_tokens: int  # policy tokenizer (see train/data.py)
    length_ratio: float  # rho = caption_tokens / reference_tokens
    in_band: bool  # tau_low <= rho <= tau_high
    length_penalty: float = 0.0  # p_len (eq. A.4) in length mode "linear"; the advantage step subtracts it
    failure: str | None = None  # JudgeFailure.reason, or None when judged
    failure_detail: str = ""
    precision: float | None = None
    recall: float | None = None
    linguistic_raw: float | None = None  # the judge's linguistic score, before the length mask
    linguistic: float | None = None  # after the mask (what the optimiser sees)
    masked: bool = False  # the mask set linguistic to 0
    non_pointable_share: float | None = None  # meta-commentary (NaN: not judged, the ablation's rubric)
    non_visible_share: float | None = None  # hallucination
    n_caption_assertions: int | None = None
    truncated_input: bool = False

    def rewards(self) -> tuple[float, float, float]:
        """(precision, recall, linguistic) with NaN for a failed judge: one row of the (N, K) tensor."""
        values = (self.precision, self.recall, self.linguistic)
        return tuple(math.nan if v is None else float(v) for v in values)  # type: ignore[return-value]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ScoredBatch:
    """The rollouts of one reward call (one process's share of a generation batch), in TRL's order."""

    rollouts: list[ScoredRollout]
    judge_calls: int = 0
    usage: dict[str, float] = field(default_factory=dict)  # judge accounting spent on this batch

    def rewards(self) -> torch.Tensor:
        """(N, 3) float32 in REWARD_NAMES order, NaN where the judge failed."""
        return torch.tensor([r.rewards() for r in self.rollouts], dtype=torch.float32).reshape(
            -1, len(REWARD_NAMES)
        )


def caption_text(completion: Any) -> str:
    """The caption of a TRL completion: a string, or a conversational ``[{"role": "assistant", ...}]``."""
    if isinstance(completion, str):
        return completion.strip()
    if isinstance(completion, list) and completion:
        content = completion[-1].get("content", "")
        if isinstance(content, list):  # structured content blocks
            content = "".join(part.get("text", "") for part in content if part.get("type") == "text")
        return str(content).strip()
    raise TypeError(f"unexpected completion format: {type(completion).__name__}")


def judge_usage(judge: Judge) -> dict[str, float]:
    """Cumulative accounting a judge offers (tokens, cost, cache hits, ...), else ``{}``.

    Duck-typed so any judge can take part: a ``usage()`` method or ``usage`` mapping of cumulative
    numeric counters, or (``balcaprl.judge.OpenAICompatibleJudge``) a ``stats`` object with
    ``as_dict(prices)``, priced with ``judge.config.price_per_million_tokens`` when set. The trainer
    logs per-step differences under ``judge/usage/<name>``.
    """
    usage = getattr(judge, "usage", None)
    if callable(usage):
        usage = usage()
    if usage is None and hasattr(getattr(judge, "stats", None), "as_dict"):
        prices = getattr(getattr(judge, "config", None), "price_per_million_tokens", None)
        usage = judge.stats.as_dict(prices)
    if not isinstance(usage, Mapping):
        return {}
    return {
        str(k): float(v) for k, v in usage.items() if isinstance(v, int | float) and not isinstance(v, bool)
    }


class _RewardFunction:
    """One of the three TRL reward functions; an async callable TRL runs on its event loop."""

    def __init__(self, scorer: SharedVerdictScorer, name: str):
        self.scorer = scorer
        self.__name__ = name  # TRL names the metric rewards/<name>/mean after it

    async def __call__(self, prompts, completions, completion_ids, **columns) -> list[float | None]:
        batch = await self.scorer.score(completions, completion_ids, **columns)
        return [getattr(rollout, self.__name__) for rollout in batch.rollouts]

    def __repr__(self) -> str:
        return f"<reward {self.__name__} (shared verdict)>"


class SharedVerdictScorer:
    """Judges each rollout once and serves precision, recall and linguistic from that one verdict.

    Args:
        judge: any :class:`balcaprl.judge.Judge`.
        rewards: the recipe's reward configuration (pointability rule, length control), whole.
        special_token_ids: the policy tokenizer's special ids, left out of the caption token count.
        max_failed_batches_in_a_row: raise after this many consecutive batches in which every rollout failed.
        check_failures: count those batches as they are scored here; False when the caller calls
            :meth:`check_batch_failures` on the batch gathered from every process (the TRL trainer does,
            so that all processes stop together and one process's share of a batch is not a batch).
        image_column / reference_column / reference_tokens_column: dataset columns TRL passes along.
    """

    def __init__(
        self,
        judge: Judge,
        rewards: RewardConfig | None = None,
        *,
        special_token_ids: Sequence[int] = (),
        max_failed_batches_in_a_row: int = 3,
        check_failures: bool = True,
        image_column: str = "image_path",
        reference_column: str = "reference",
        reference_tokens_column: str = "reference_tokens",
        on_batch: Callable[[ScoredBatch], None] | None = None,
    ):
        if not hasattr(judge, "judge_batch"):
            raise TypeError(f"{type(judge).__name__} is not a Judge: it has no async judge_batch(requests)")
        self.judge = judge
        self.rewards = rewards if rewards is not None else RewardConfig()
        self.rubric = training_rubric_name(self.rewards.pointability)  # what the judge is asked to apply
        self.special_token_ids = frozenset(int(i) for i in special_token_ids)
        self.max_failed_batches_in_a_row = max_failed_batches_in_a_row
        self.check_failures = check_failures
        self.image_column = image_column
        self.reference_column = reference_column
        self.reference_tokens_column = reference_tokens_column
        self.on_batch = on_batch
        self.judge_calls = 0  # judge_batch invocations over the run
        self.judge_requests = 0  # rollouts sent over the run
        self.last_batch: ScoredBatch | None = None
        self._memo: tuple[tuple, asyncio.AbstractEventLoop, asyncio.Future] | None = None
        self._failed_in_a_row = 0

    def reward_functions(self) -> list[_RewardFunction]:
        """precision, recall, linguistic: in REWARD_NAMES order, for ``GRPOTrainer(reward_funcs=...)``."""
        return [_RewardFunction(self, name) for name in REWARD_NAMES]

    def begin_batch(self) -> None:
        """Forget the previous batch: the memo lives for one generation batch (the trainer calls this)."""
        self._memo = None
        self.last_batch = None

    # -- the shared call ---------------------------------------------------------------------------

    async def score(
        self, completions: Sequence[Any], completion_ids: Sequence[Sequence[int]], **columns
    ) -> ScoredBatch:
        """Score a batch once; later calls with the same (row id, caption) pairs get the same result."""
        captions = [caption_text(c) for c in completions]
        ids = [str(i) for i in columns.get("id", range(len(captions)))]
        key = (tuple(ids), tuple(captions))
        loop = asyncio.get_running_loop()
        if self._memo is not None and self._memo[0] == key:
            _, memo_loop, task = self._memo
            if task.done():
                return task.result()
            if memo_loop is loop:  # the first function's call is in flight: wait for it
                return await asyncio.shield(task)
        task = loop.create_task(self._score_uncached(ids, captions, completion_ids, columns))
        self._memo = (key, loop, task)
        return await asyncio.shield(task)

    async def _score_uncached(
        self,
        ids: list[str],
        captions: list[str],
        completion_ids: Sequence[Sequence[int]],
        columns: Mapping[str, Any],
    ) -> ScoredBatch:
        for needed in (self.image_column, self.reference_column, self.reference_tokens_column):
            if needed not in columns:
                raise KeyError(
                    f"the reward functions need the dataset column {needed!r}; prepare the dataset with "
                    "balcaprl.train.data.prepare_train_dataset (TRL passes dataset columns as keyword arguments)"
                )
        images = columns[self.image_column]
        references = columns[self.reference_column]
        reference_tokens = [int(n) for n in columns[self.reference_tokens_column]]
        caption_tokens = [self.count_caption_tokens(ids_) for ids_ in completion_ids]

        requests = [
            JudgeRequest(image=image, caption=caption, reference=reference, rubric=self.rubric)
            for image, caption, reference in zip(images, captions, references, strict=True)
        ]
        usage_before = judge_usage(self.judge)
        outcomes = await self._judge(requests)
        usage_after = judge_usage(self.judge)

        rollouts = [
            self._score_one(row_id, caption, n_caption, n_reference, outcome)
            for row_id, caption, n_caption, n_reference, outcome in zip(
                ids, captions, caption_tokens, reference_tokens, outcomes, strict=True
            )
        ]
        batch = ScoredBatch(
            rollouts=rollouts,
            judge_calls=1,
            usage={k: usage_after[k] - usage_before.get(k, 0.0) for k in usage_after},
        )
        if self.check_failures:
            self.check_batch_failures(batch.rollouts)
        self.last_batch = batch
        if self.on_batch is not None:
            self.on_batch(batch)
        return batch

    async def _judge(self, requests: list[JudgeRequest]) -> list[Judgement | JudgeFailure]:
        self.judge_calls += 1
        self.judge_requests += len(requests)
        try:
            outcomes = list(await self.judge.judge_batch(requests))
        except UserError as err:  # not this batch's failure but the configuration's: stop the run
            return [JudgeFailure(JUDGE_REJECTED, str(err))] * len(requests)  # type: ignore[arg-type]
        except Exception as err:  # a judge should return failures, but a crash must not become a reward
            logger.exception(
                "the judge raised on a batch of %d rollouts; they count as failed", len(requests)
            )
            return [JudgeFailure(JUDGE_EXCEPTION, f"{type(err).__name__}: {err}")] * len(requests)
        if len(outcomes) != len(requests):
            raise RuntimeError(
                f"{type(self.judge).__name__}.judge_batch returned {len(outcomes)} outcomes for {len(requests)} "
                "requests; the Judge protocol requires exactly one outcome per request, in order"
            )
        return outcomes

    # -- one rollout -------------------------------------------------------------------------------

    def count_caption_tokens(self, token_ids: Sequence[int]) -> int:
        """Caption length in the policy's tokens: generated ids minus special ones (EOS, padding)."""
        return sum(1 for t in token_ids if int(t) not in self.special_token_ids)

    def _score_one(
        self, row_id: str, caption: str, n_caption: int, n_reference: int, outcome: Judgement | JudgeFailure
    ) -> ScoredRollout:
        # The length terms are known for every rollout (logged); they act on judged rollouts only.
        gate = length_gate(self.rewards.length, n_caption, n_reference)  # raises for an empty reference
        rollout = ScoredRollout(
            id=row_id,
            caption=caption,
            caption_tokens=n_caption,
            reference_tokens=n_reference,
            length_ratio=gate.ratio,
            in_band=gate.in_band,
        )
        if isinstance(outcome, JudgeFailure):
            rollout.failure, rollout.failure_detail = outcome.reason, outcome.detail
            return rollout
        if not isinstance(outcome, Judgement):
            raise TypeError(
                f"judge outcome must be a Judgement or a JudgeFailure, got {type(outcome).__name__}"
            )
        scores = score_rollout(outcome.verdict, self.rewards, n_caption, n_reference)
        rollout.precision = scores.precision
        rollout.recall = scores.recall
        rollout.linguistic_raw = scores.linguistic_raw
        rollout.linguistic = scores.linguistic
        rollout.masked = scores.masked
        rollout.length_penalty = scores.length_penalty
        # Without pointability the judge is not asked about it (every claim comes back pointable):
        # the share of meta-commentary is unknown, not 0.
        rollout.non_pointable_share = scores.non_pointable_share if self.rewards.pointability else math.nan
        rollout.non_visible_share = scores.non_visible_share
        rollout.n_caption_assertions = scores.n_caption_assertions
        rollout.truncated_input = outcome.truncated_input
        return rollout

    def check_batch_failures(self, rollouts: Sequence[ScoredRollout | Mapping[str, Any]]) -> None:
        """Count a batch whose every rollout failed; raise after ``max_failed_batches_in_a_row`` in a row,
        and at once (:class:`~balcaprl.errors.ConfigError`) when the endpoint rejected the judge.

        ``rollouts`` are :class:`ScoredRollout` objects or their ``as_dict()`` records.
        """

        def value_of(rollout: ScoredRollout | Mapping[str, Any], name: str) -> Any:
            return rollout[name] if isinstance(rollout, Mapping) else getattr(rollout, name)

        failures = [value_of(r, "failure") for r in rollouts]
        rejected = next(
            (value_of(r, "failure_detail") for r in rollouts if value_of(r, "failure") == JUDGE_REJECTED),
            None,
        )
        if rejected is not None:  # every process sees the same gathered batch, so all stop here
            raise ConfigError(
                f"{rejected}; training stopped before this batch's update: fix the judge, then run again "
                "(--resume continues from the newest checkpoint, if one was written; none is removed)"
            )
        if failures and all(f is not None for f in failures):
            self._failed_in_a_row += 1
            reasons = sorted(set(failures))
            logger.warning("the judge failed on all %d rollouts of this batch (%s)", len(failures), reasons)
            if self._failed_in_a_row >= self.max_failed_batches_in_a_row:
                detail = next((d for r in rollouts if (d := value_of(r, "failure_detail"))), "")
                raise RuntimeError(
                    f"the judge failed on every rollout of {self._failed_in_a_row} batches in a row (reasons: "
                    f"{', '.join(reasons)}; e.g. {detail!r}). Check the judge endpoint, then resume with --resume."
                )
        else:
            self._failed_in_a_row = 0
