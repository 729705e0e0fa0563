"""verl's reward function for balcaprl: an ``async`` ``compute_score`` with a dict return.

verl's reward loop (``reward.reward_manager.name=naive``, the default) calls, for every rollout,

    await compute_score(data_source=..., solution_str=<decoded caption>, ground_truth=<reference>,
                        extra_info=<the exported row's extra_info>, **reward.custom_reward_function.reward_kwargs)

inside a reward-loop worker (a Ray actor with one event loop). Rollouts are scored concurrently; each
worker process builds one judge (``balcaprl.judge``: concurrency bound, rate limits, sqlite cache,
coalescing of identical calls, accounting) on first use and keeps it.

Per rollout, exactly as the TRL backend (``balcaprl.train.rewards.SharedVerdictScorer``'s judge call and
per-rollout scoring do the work): one judge call under the rubric the reward config asks for (the
training rubric, or without pointability the ablation's rubric that leaves that test out of the
prompt); the caption's length in the *policy's* tokenizer;
``balcaprl.rewards.score_rollout`` under the recipe's :class:`~balcaprl.rewards.RewardConfig`
(pointability rule, length mask, linear length penalty). The returned dict always has the same keys
(verl requires it), all floats except ``failure``:

    score                       w . (precision, recall, linguistic): verl's scalar, for its metrics only
    precision recall linguistic the reward columns the balcaprl estimator reads (linguistic masked)
    judged                      1.0 judged, 0.0 failed
    failure                     "" or the JudgeFailure reason ("judge_exception" when the judge raised or
                                could not be built, "bad_input" for a bad set-up or row)
    failure_detail              "" or a short description of the failure
    linguistic_raw masked non_pointable_share non_visible_share caption_tokens reference_tokens
                                (non_pointable_share is NaN without pointability: not judged)
    length_ratio length_penalty (p_len = lambda_len * d(rho) in length mode linear, else 0; the estimator
                                subtracts it from the advantage, eq. A.5)

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
    workers              verl's reward.num_workers: the judge's concurrency and rate limits are divided
                         by it, so the whole job respects the judge config
"""

from __future__ import annotations

import importlib
import json
import logging
import math
import time
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator

from balcaprl.config import Section, load_config
from balcaprl.judge.protocol import JudgeRequest
from balcaprl.rewards import RewardConfig
from balcaprl.train.judge_overlap import stamped
from balcaprl.train.rewards import JUDGE_EXCEPTION, ScoredRollout, SharedVerdictScorer, caption_text

__all__ = ["RewardSettings", "compute_score", "gather_results", "result_keys", "scorer_for"]

logger = logging.getLogger(__name__)

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


def result_keys() -> tuple[str, ...]:
    """The keys of every dict ``compute_score`` returns, in order."""
    return (
        "score",
        "precision",
        "recall",
        "linguistic",
        "judged",
        "failure",
        "failure_detail",
        "linguistic_raw",
        "masked",
        "non_pointable_share",
        "non_visible_share",
        "caption_tokens",
        "reference_tokens",
        "length_ratio",
        "length_penalty",
        # when the judging of this rollout started and ended (time.time()): judge/wall_s, judge/exposed_s
        "judge_started_s",
        "judge_finished_s",
    )


# -------------------------------------------------------------------------- one scorer per process


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


def _build_judge(settings: RewardSettings):
    if settings.judge_factory is not None:
        return _load_factory(settings.judge_factory)(image_root=settings.image_root)
    from balcaprl.judge import build_judge, load_judge_config

    config = load_judge_config(Path(settings.judge_config).expanduser())
    if settings.workers > 1:
        # Every reward worker has its own client: share the job-wide limits out between them.
        def share(limit: int | None) -> int | None:
            return None if limit is None else max(1, limit // settings.workers)

        config = config.model_copy(
            update={
                "concurrency": share(config.concurrency),
                "requests_per_minute": share(config.requests_per_minute),
                "tokens_per_minute": share(config.tokens_per_minute),
            }
        )
    return build_judge(config, image_root=settings.image_root, rollouts=True)


class _RolloutScorer(SharedVerdictScorer):
    """The TRL backend's scorer, one rollout per call: its judge call and its per-rollout scoring (verdict ->
    rewards, length gate, shares) are reused as they are. Its batch memo is not (verl calls once per
    rollout, and a memoised failure would stick to that caption for the whole run), nor its "every rollout
    of the batch failed" stop rule, which the trainer applies to whole batches (``trainer.py``)."""

    async def score_rollout(
        self,
        row_id: str,
        caption: str,
        caption_ids: Sequence[int],
        image: str,
        reference: str,
        n_reference: int,
    ) -> ScoredRollout:
        request = JudgeRequest(image=image, caption=caption, reference=reference, rubric=self.rubric)
        (outcome,) = await self._judge([request])
        return self._score_one(row_id, caption, self.count_caption_tokens(caption_ids), n_reference, outcome)


_SCORERS: dict[str, _RolloutScorer] = {}  # keyed by the settings' JSON


def scorer_for(settings: RewardSettings) -> _RolloutScorer:
    """This process's scorer (judge + reward config) for ``settings``; built on first use."""
    key = settings.model_dump_json()
    scorer = _SCORERS.get(key)
    if scorer is None:
        tokenizer = _tokenizer(settings.tokenizer)
        scorer = _RolloutScorer(
            _build_judge(settings),
            settings.rewards,
            special_token_ids=tokenizer.all_special_ids,
            image_column="image",
        )
        _SCORERS[key] = scorer
    return scorer


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


def _as_result(rollout: ScoredRollout, settings: RewardSettings) -> dict[str, Any]:
    nan = math.nan

    def num(value: float | None) -> float:
        return nan if value is None else float(value)

    judged = rollout.failure is None
    rewards = (num(rollout.precision), num(rollout.recall), num(rollout.linguistic))
    weights = settings.rewards.weights.as_list()
    return {
        "score": sum(w * r for w, r in zip(weights, rewards, strict=True)) if judged else nan,
        "precision": rewards[0],
        "recall": rewards[1],
        "linguistic": rewards[2],
        "judged": 1.0 if judged else 0.0,
        "failure": rollout.failure or "",
        "failure_detail": (rollout.failure_detail or "")[:300],
        "linguistic_raw": num(rollout.linguistic_raw),
        "masked": (1.0 if rollout.masked else 0.0) if judged else nan,
        "non_pointable_share": num(rollout.non_pointable_share),
        "non_visible_share": num(rollout.non_visible_share),
        "caption_tokens": float(rollout.caption_tokens),
        "reference_tokens": float(rollout.reference_tokens),
        "length_ratio": float(rollout.length_ratio),
        "length_penalty": float(rollout.length_penalty),
    }


async def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: str,
    extra_info: Mapping[str, Any] | None = None,
    **reward_kwargs: Any,
) -> dict[str, Any]:
    """Judge one rollout; a dict with :func:`result_keys` (NaN rewards for a failed judge).

    Never raises: verl would turn an exception into a silently padded prompt group. A judge that
    cannot be built or raises gives failure ``judge_exception``; a bad set-up or row (unknown
    reward_kwargs, a row not exported by balcaprl, a reference without tokens) gives ``bad_input``. Both
    come back as NaN with ``failure_detail``; the trainer stops a run whose every rollout fails.
    """
    started = time.time()  # verl calls this as soon as the rollout is generated
    extra_info = dict(extra_info or {})
    row_id = str(extra_info.get("id", extra_info.get("index", "")))
    try:
        settings = RewardSettings.from_kwargs(reward_kwargs)
        tokenizer = _tokenizer(settings.tokenizer)
        caption = caption_text(solution_str)
        caption_ids = _count(tokenizer, caption)
        image = _image(settings, extra_info)
        n_reference = _reference_tokens(settings, extra_info, ground_truth)
        if n_reference <= 0:
            raise ValueError("the reference caption has no tokens; no length ratio is possible")
    except Exception as err:  # a set-up or data problem: report it on every rollout it affects
        logger.error("balcaprl compute_score: bad input for row %s: %s", row_id, err)
        return stamped(_failed("bad_input", f"{type(err).__name__}: {err}"), started)
    try:
        scorer = scorer_for(settings)
    except Exception as err:  # e.g. the judge config names an API key variable this worker lacks
        logger.error("balcaprl compute_score: cannot build the judge: %s", err)
        return stamped(
            _failed(JUDGE_EXCEPTION, f"{type(err).__name__}: {err}", len(caption_ids), n_reference), started
        )
    rollout = await scorer.score_rollout(row_id, caption, caption_ids, image, ground_truth, n_reference)
    if rollout.failure == JUDGE_EXCEPTION:
        logger.warning("judge raised for row %s: %s", row_id, rollout.failure_detail)
    return stamped(_as_result(rollout, settings), started)


def _failed(reason: str, detail: str, caption_tokens: float = math.nan, reference_tokens: float = math.nan):
    """The result of a rollout that could not be judged at all."""
    result = dict.fromkeys(result_keys(), math.nan)
    result.update(
        judged=0.0,
        failure=reason,
        failure_detail=detail[:300],
        caption_tokens=float(caption_tokens),
        reference_tokens=float(reference_tokens),
        length_ratio=float(caption_tokens) / float(reference_tokens)
        if reference_tokens == reference_tokens
        else math.nan,
        length_penalty=0.0,
    )
    return result


def gather_results(results: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """Per-key lists from a batch of ``compute_score`` results (what verl stores per key)."""
    return {key: [r[key] for r in results] for key in result_keys()}
