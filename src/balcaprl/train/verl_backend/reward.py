"""verl's reward function for balcaprl: an ``async`` ``compute_score`` with a dict return.

verl's reward loop (``reward.reward_manager.name=naive``, the default) calls, for every rollout,

    await compute_score(data_source=..., solution_str=<decoded caption>, ground_truth=<reference>,
                        extra_info=<the exported row's extra_info>, **reward.custom_reward_function.reward_kwargs)

inside a reward-loop worker (a Ray actor with one event loop). Rollouts are scored concurrently; each
worker process builds one judge (``balcaprl.judge``: concurrency bound, rate limits, sqlite cache,
coalescing of identical calls, accounting) on first use and keeps it.

Per rollout, exactly as the TRL backend: the caption's length from the token ids the policy generated
(``extra_info["response_ids"]``, which balcaprl's reward manager adds, ``reward_manager.py``; under
verl's plain ``naive`` manager, the decoded caption re-encoded with the policy's tokenizer), then
``balcaprl.train.judging.judge_rollouts`` (the function TRL's reward functions call too): one judge
call under the rubric the reward config asks for, and the rollout's record under the recipe's
:class:`~balcaprl.rewards.RewardConfig` (pointability rule, length mask, linear length penalty). The
returned dict is verl's ``score`` (w . (precision, recall, linguistic), for verl's own metrics only),
the record's row form (:meth:`~balcaprl.rewards.RolloutRecord.row`) and when the judging started and
finished (``judge_started_s``, ``judge_finished_s``: the judge stage's metrics), the same keys for
every rollout (verl requires it); the batch step reads the records back from it (``trainer.py``).

A failed judge gives NaN for ``score`` and the three rewards, never 0: the balcaprl estimator leaves the
rollout out and gives it advantage 0. What verl 0.9.1 itself does, and why this function never raises:
the ``naive`` and ``gdpo`` managers pass the returned dict through unchanged (NaN stays NaN, also in
``rm_scores``); an *exception* escapes the reward loop, the agent loop logs it and tags the prompt
"failure", and the V1 replay buffer keeps such groups sampleable with their missing rollouts padded
downstream (its docstring), i.e. the failure disappears from the statistics instead of being counted. The
``rate_limited`` manager turns timeouts and exceptions into reward 0.0 (plus extra keys the others lack),
exactly the fake reward the contract forbids: do not use it (the judge has its own rate limits).

reward_kwargs (what ``balcaprl verl launch`` renders), validated as :class:`RewardSettings`:
    rewards              the recipe's RewardConfig as JSON (``RewardConfig.to_json``), validated by the same
                         model here; the estimator reads its weights from the same string (the rendering
                         points ``algorithm.balcaprl.rewards`` at it), so the weights reach verl once
    tokenizer            the policy checkpoint (caption and reference lengths are counted with it)
    judge_config         a judge YAML, or
    judge_factory        "package.module:callable" returning a Judge, called with image_root= (tests, the
                         synthetic oracle)
    image_root           the dataset folder; the row's relative image path is resolved against it
    workers              verl's reward.num_workers: the judge's concurrency and rate limits are shared
                         by them (``build_judge(processes=workers)``), so the whole job respects the
                         judge config
"""

from __future__ import annotations

import importlib
import json
import logging
import math
import time
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator

from balcaprl.config import Section, load_config
from balcaprl.files import unicode_refusal
from balcaprl.judge.protocol import Judge
from balcaprl.rewards import RewardConfig, RolloutRecord, failed_rollout
from balcaprl.train.early_judge import stamped
from balcaprl.train.judging import (
    JUDGE_EXCEPTION,
    RolloutToJudge,
    caption_text,
    count_caption_tokens,
    judge_rollouts,
)

logger = logging.getLogger(__name__)

# extra_info key of the rollout's generated token ids (reward_manager.BalcaprlRewardManager).
RESPONSE_IDS = "response_ids"

# Keys verl's reward managers add to the call by themselves; accepted and ignored.
_VERL_KWARGS = frozenset({"reward_router_address", "reward_model_tokenizer"})


class RewardSettings(Section):
    """verl's ``reward_kwargs`` as the reward function receives them: the recipe's reward config and
    the worker's set-up (one scorer per distinct settings)."""

    rewards: RewardConfig = Field(description="RewardConfig.to_json() of the recipe's rewards section.")
    tokenizer: str = Field(
        min_length=1, description="The policy checkpoint (token counts use its tokenizer)."
    )
    judge_config: str | None = Field(None, description="A judge YAML.")
    judge_factory: str | None = Field(None, description="'package.module:callable' returning a Judge.")
    image_root: str | None = Field(
        None, description="The dataset folder the rows' image paths are relative to."
    )
    workers: int = Field(
        1, ge=1, description="verl's reward.num_workers (the judge's limits are shared out)."
    )

    @field_validator("rewards", mode="before")
    @classmethod
    def _from_json(cls, value: Any) -> Any:
        # The JSON's keys, validated as this RewardConfig field: errors read rewards.<key>.
        if not isinstance(value, str):
            return value
        try:
            return json.loads(value)
        except json.JSONDecodeError as error:
            raise ValueError(f"not JSON (RewardConfig.to_json() renders it): {error}") from None

    @model_validator(mode="after")
    def _one_judge(self) -> RewardSettings:
        if (self.judge_config is None) == (self.judge_factory is None):
            raise ValueError("give exactly one of reward_kwargs.judge_config and reward_kwargs.judge_factory")
        return self

    @classmethod
    def from_kwargs(cls, kwargs: Mapping[str, Any]) -> RewardSettings:
        """Validated settings from verl's reward kwargs (the keys verl adds by itself are ignored)."""
        ours = {k: v for k, v in kwargs.items() if k not in _VERL_KWARGS}
        return load_config(
            cls, data=ours, source="reward.custom_reward_function.reward_kwargs", what="reward_kwargs"
        )


# -------------------------------------------------------------------------- one judge per process


@lru_cache(maxsize=8)
def _tokenizer(name: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(name)


def _load_factory(spec: str):
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"judge_factory must look like 'package.module:callable', got {spec!r}")
    target: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        target = getattr(target, part)
    return target


_JUDGES: dict[str, Judge] = {}  # keyed by the settings' JSON


def judge_for(settings: RewardSettings) -> Judge:
    """This process's judge for ``settings``, built on first use. Every reward worker has its own
    client: ``build_judge(processes=workers)`` shares the job-wide limits out between them."""
    key = settings.model_dump_json()
    judge = _JUDGES.get(key)
    if judge is None:
        if settings.judge_factory is not None:
            judge = _load_factory(settings.judge_factory)(image_root=settings.image_root)
        else:
            from balcaprl.judge import build_judge

            path = Path(settings.judge_config).expanduser()  # type: ignore[arg-type]
            judge = build_judge(
                path, image_root=settings.image_root, processes=settings.workers, rollouts=True
            )
        _JUDGES[key] = judge
    return judge


def _count(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _reference_tokens(settings: RewardSettings, extra_info: Mapping[str, Any], reference: str) -> int:
    """The reference's length in the policy's tokens: the exported count when it was made with the
    policy's tokenizer, else a recount (as ``balcaprl.train.data`` decides for the TRL backend)."""
    stored = extra_info.get("reference_tokens")
    if stored is not None and extra_info.get("tokenizer") == settings.tokenizer:
        return int(stored)
    return len(_count(_tokenizer(settings.tokenizer), reference))


def _image(settings: RewardSettings, extra_info: Mapping[str, Any]) -> str:
    if settings.image_root is not None and extra_info.get("image"):
        return str(Path(settings.image_root) / str(extra_info["image"]))
    path = extra_info.get("image_path")
    if not path:
        raise KeyError(
            "extra_info has no image path; export the dataset with `balcaprl verl export` (it writes "
            "extra_info.image and extra_info.image_path)"
        )
    return str(path)


def _result(rollout: RolloutRecord, settings: RewardSettings | None) -> dict[str, Any]:
    """verl's ``score`` and the record's row form."""
    score = math.nan
    if rollout.judged and settings is not None:
        weights = settings.rewards.weights.as_list()
        score = sum(w * r for w, r in zip(weights, rollout.as_tuple(), strict=True))
    return {"score": score, **rollout.row()}


async def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: str,
    extra_info: Mapping[str, Any] | None = None,
    **reward_kwargs: Any,
) -> dict[str, Any]:
    """Judge one rollout: verl's ``score`` and the rollout's record as a row (NaN rewards for a failed
    judge).

    Never raises: verl would turn an exception into a silently padded prompt group. A judge that
    cannot be built or raises gives failure ``judge_exception``; a bad set-up or row (unknown
    reward_kwargs, a row not exported by balcaprl, a reference without tokens) gives ``bad_input``. Both
    come back as NaN with ``failure_detail``; the batch step stops a run whose every rollout fails.
    """
    started = time.time()  # verl calls this as soon as the rollout is generated
    extra_info = dict(extra_info or {})
    row_id = str(extra_info.get("id", extra_info.get("index", "")))
    try:
        settings = RewardSettings.from_kwargs(reward_kwargs)
        caption = caption_text(solution_str)
        # a text that is no valid Unicode cannot be counted by a tokenizer nor sent: the line that
        # judge_rollouts gives such a rollout, before the tokenizer fails on it with a TypeError
        refusal = unicode_refusal([("caption", caption), ("reference", ground_truth)], f"row {row_id!r}")
        if refusal is not None:
            return stamped(
                _result(failed_rollout("bad_input", refusal, RewardConfig(), id=row_id), None), started
            )
        tokenizer = _tokenizer(settings.tokenizer)
        generated = extra_info.get(RESPONSE_IDS)
        token_ids = list(generated) if generated is not None else _count(tokenizer, caption)
        rollout = RolloutToJudge(
            id=row_id,
            caption=caption,
            caption_tokens=count_caption_tokens(token_ids, frozenset(tokenizer.all_special_ids)),
            image=_image(settings, extra_info),
            reference=ground_truth,
            reference_tokens=_reference_tokens(settings, extra_info, ground_truth),
        )
        if rollout.reference_tokens <= 0:
            raise ValueError("the reference caption has no tokens; no length ratio is possible")
    except Exception as err:  # a set-up or data problem: report it on every rollout it affects
        logger.error("balcaprl compute_score: bad input for row %s: %s", row_id, err)
        # No token counts: the config's length terms are not used.
        failed = failed_rollout("bad_input", f"{type(err).__name__}: {err}", RewardConfig(), id=row_id)
        return stamped(_result(failed, None), started)
    try:
        judge = judge_for(settings)
    except Exception as err:  # e.g. the judge config names an API key variable this worker lacks
        logger.error("balcaprl compute_score: cannot build the judge: %s", err)
        counts = (rollout.caption_tokens, rollout.reference_tokens)
        failed = failed_rollout(JUDGE_EXCEPTION, f"{type(err).__name__}: {err}", settings.rewards, *counts,
                                id=row_id, caption=caption)  # fmt: skip
        return stamped(_result(failed, settings), started)
    (record,) = (await judge_rollouts(judge, [rollout], settings.rewards)).records
    if record.failure == JUDGE_EXCEPTION:
        logger.warning("judge raised for row %s: %s", row_id, record.failure_detail)
    return stamped(_result(record, settings), started)
