"""Judges: the interface, the OpenAI-compatible client with its cache and accounting, and helpers.

Typical use in a trainer::

    from balcaprl.judge import JudgeRequest, SyncJudge, build_judge, rewards_tensor

    judge = build_judge("configs/judge.yaml")            # or a JudgeConfig / a dict
    with SyncJudge(judge) as sync:                        # or `await judge.judge_batch(...)`
        outcomes = sync.judge_batch([JudgeRequest(image, caption, reference) for ...])
    rewards = rewards_tensor(outcomes)                    # (N, 3), NaN rows for failures

Generic calls (evaluation protocols, re-captioning) go through the same call path as the verdict
judge's own (:meth:`JudgeCaller.call`: cache, coalescing, limits, retries, one re-ask; one key
scheme, :func:`cache_key`)::

    async with JudgeCaller("configs/judge.yaml") as caller:
        result = await caller.call_json(messages, MySchema, kind="my_step", temperature=0.0)
        value = result.value if result.ok else None                          # result.failure.reason

Modules: ``client`` (the verdict judge), ``calls`` (how one call is made, top to bottom: cache,
coalescing, rate limits, concurrency bound, HTTP, retries, answer bounds, classification), ``cache``
(sqlite, keys), ``prompt`` (messages), ``schemas`` (answer formats), ``tokens`` (token estimates),
``images``, ``accounting``.

Test doubles (the loopback server, the scripted judge) live in :mod:`balcaprl.testing`.
"""

from balcaprl.judge.accounting import JudgeStats
from balcaprl.judge.cache import JudgeCache, cache_key
from balcaprl.judge.calls import CallResult, JudgeCaller
from balcaprl.judge.client import BatchResult, OpenAICompatibleJudge, build_judge
from balcaprl.judge.config import JudgeConfig, JudgeConfigError, PriceTable, load_judge_config
from balcaprl.judge.outcomes import empty_caption_judgement, rewards_tensor
from balcaprl.judge.protocol import (
    FailureReason,
    Judge,
    JudgeFailure,
    Judgement,
    JudgeOutcome,
    JudgeRequest,
    SupportsDeadline,
    SupportsFixedReference,
)
from balcaprl.judge.sync import SyncJudge

__all__ = [
    "BatchResult",
    "CallResult",
    "FailureReason",
    "Judge",
    "JudgeCache",
    "JudgeCaller",
    "JudgeConfig",
    "JudgeConfigError",
    "JudgeFailure",
    "JudgeOutcome",
    "JudgeRequest",
    "JudgeStats",
    "Judgement",
    "OpenAICompatibleJudge",
    "PriceTable",
    "SupportsDeadline",
    "SupportsFixedReference",
    "SyncJudge",
    "build_judge",
    "cache_key",
    "empty_caption_judgement",
    "load_judge_config",
    "rewards_tensor",
]
