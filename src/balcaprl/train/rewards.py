"""TRL's three reward functions over one judge verdict per rollout.

TRL calls each reward function separately (async ones together, on its event-loop thread). The paper's
three rewards come out of *one* verdict, so the three functions here share a :class:`SharedVerdictScorer`:
the first function called for a batch starts the judge call (:func:`balcaprl.train.judging.judge_rollouts`,
the function verl's reward function calls too), the other two await the same result (a memo keyed by the
batch's (row id, caption) pairs, for one generation batch). No triple billing; a test counts the calls.

A failed judge gives ``None`` for all three rewards, which TRL turns into NaN, so the advantage step
leaves the rollout out; never a 0.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from balcaprl.judge.protocol import Judge, JudgeRequest
from balcaprl.judge.rubrics import training_rubric_name
from balcaprl.rewards import REWARD_NAMES, RewardConfig, RolloutRecord
from balcaprl.train.judging import (
    RolloutToJudge,
    caption_text,
    count_caption_tokens,
    judge_requests,
    judge_rollouts,
)


@dataclass
class ScoredBatch:
    """The rollouts of one reward call (one process's share of a generation batch), in TRL's order."""

    rollouts: list[RolloutRecord]
    judge_calls: int = 0
    usage: dict[str, float] = field(default_factory=dict)  # judge accounting spent on this batch


class _RewardFunction:
    """One of the three TRL reward functions; an async callable TRL runs on its event loop."""

    def __init__(self, scorer: SharedVerdictScorer, name: str):
        self.scorer = scorer
        self.__name__ = name  # TRL names the metric rewards/<name>/mean after it

    async def __call__(self, prompts, completions, completion_ids, **columns) -> list[float | None]:
        batch = await self.scorer.score(completions, completion_ids, **columns)
        return [None if math.isnan(v := getattr(r, self.__name__)) else v for r in batch.rollouts]

    def __repr__(self) -> str:
        return f"<reward {self.__name__} (shared verdict)>"


class SharedVerdictScorer:
    """Judges each rollout once and serves precision, recall and linguistic from that one verdict.

    Args:
        judge: any :class:`balcaprl.judge.Judge`.
        rewards: the recipe's reward configuration (pointability rule, length control), whole.
        special_token_ids: the policy tokenizer's special ids, left out of the caption token count.
        image_column / reference_column / reference_tokens_column: dataset columns TRL passes along.
    """

    def __init__(
        self,
        judge: Judge,
        rewards: RewardConfig | None = None,
        *,
        special_token_ids: Sequence[int] = (),
        image_column: str = "image_path",
        reference_column: str = "reference",
        reference_tokens_column: str = "reference_tokens",
    ):
        if not hasattr(judge, "judge_batch"):
            raise TypeError(f"{type(judge).__name__} is not a Judge: it has no async judge_batch(requests)")
        self.judge = judge
        self.rewards = rewards if rewards is not None else RewardConfig()
        self.special_token_ids = frozenset(int(i) for i in special_token_ids)
        self.image_column = image_column
        self.reference_column = reference_column
        self.reference_tokens_column = reference_tokens_column
        self.rubric = training_rubric_name(self.rewards.pointability)  # what judge_rollouts asks for
        self.judge_calls = 0  # judge_batch invocations over the run
        self.judge_requests = 0  # rollouts sent over the run
        self.last_batch: ScoredBatch | None = None
        self._memo: tuple[tuple, asyncio.AbstractEventLoop, asyncio.Future] | None = None

    def reward_functions(self) -> list[_RewardFunction]:
        """precision, recall, linguistic: in REWARD_NAMES order, for ``GRPOTrainer(reward_funcs=...)``."""
        return [_RewardFunction(self, name) for name in REWARD_NAMES]

    def begin_batch(self) -> None:
        """Forget the previous batch: the memo lives for one generation batch (the trainer calls this)."""
        self._memo = None
        self.last_batch = None

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

    @property
    def request_columns(self) -> tuple[str, str, str]:
        """The dataset columns a rollout's judge request is built from: image, reference, its token count."""
        return (self.image_column, self.reference_column, self.reference_tokens_column)

    def rollouts_to_judge(
        self,
        ids: Sequence[str],
        captions: Sequence[str],
        completion_ids: Sequence[Sequence[int]],
        columns: Mapping[str, Any],
    ) -> list[RolloutToJudge]:
        """The rollouts as ``judge_rollouts`` takes them, from the dataset columns TRL passes (a batch's,
        or one rollout's as the engine finishes it); caption length from the generated ids."""
        names = self.request_columns
        for needed in names:
            if needed not in columns:
                raise KeyError(
                    f"the reward functions need the dataset column {needed!r}; prepare the dataset with "
                    "balcaprl.train.data.prepare_train_dataset (TRL passes dataset columns as keyword arguments)"
                )
        images, references, reference_tokens = (columns[name] for name in names)
        return [
            RolloutToJudge(
                str(row_id),
                caption,
                count_caption_tokens(token_ids, self.special_token_ids),
                str(image),
                reference,
                int(n_reference),
            )  # fmt: skip
            for row_id, caption, token_ids, image, reference, n_reference in zip(
                ids, captions, completion_ids, images, references, reference_tokens, strict=True
            )
        ]

    def requests(
        self, ids: Sequence[str], captions: Sequence[str], columns: Mapping[str, Any]
    ) -> list[JudgeRequest]:
        """The judge requests the reward functions will send for these rollouts (``judge_requests``)."""
        no_ids: list[list[int]] = [[] for _ in captions]  # the caption length plays no part in a request
        return judge_requests(self.rollouts_to_judge(ids, captions, no_ids, columns), self.rewards)

    async def _score_uncached(
        self,
        ids: list[str],
        captions: list[str],
        completion_ids: Sequence[Sequence[int]],
        columns: Mapping[str, Any],
    ) -> ScoredBatch:
        rollouts = self.rollouts_to_judge(ids, captions, completion_ids, columns)
        self.judge_calls += 1
        self.judge_requests += len(rollouts)
        judged = await judge_rollouts(self.judge, rollouts, self.rewards)
        self.last_batch = ScoredBatch(rollouts=judged.records, judge_calls=1, usage=judged.usage)
        return self.last_batch
