"""What the judge will cost a training run, before it runs: calls, tokens, dollars and minutes.

``balcaprl train CONFIG --plan`` prints this next to the memory plan. Per RL batch (a "step" of the
paper: one generation batch, ``prompts_per_batch x rollouts_per_prompt`` captions) and per run:

- calls: one per rollout (joint mode); cached-reference mode adds at most one reference
  decomposition per prompt;
- tokens per call, from :mod:`balcaprl.judge.tokens` (the same arithmetic as the client's token
  limiter): the rubric's text, a reference and a caption of ``rollout.max_caption_tokens`` (an upper
  bound: captions stop at it), and the image at ``max_image_side`` square at the judge model's own
  image rate (an upper bound: smaller images cost less). The answer is :data:`ANSWER_TOKENS`, an
  assumption (a verdict lists each assertion once), never more than ``max_tokens``;
- dollars, with the judge config's ``price_per_million_tokens``;
- minutes: the larger of what the rate limits allow (``requests_per_minute``,
  ``tokens_per_minute``) and what the calls in flight (:func:`~balcaprl.judge.throughput.calls_in_flight`,
  the client's own rule, ``auto`` included) at :data:`CALL_LATENCY_S` each allow, and which binds.

All of it is an estimate for planning, not a bill: the judge's real answers and images decide.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from balcaprl.judge.config import JudgeConfig
from balcaprl.judge.throughput import calls_in_flight
from balcaprl.judge.tokens import approx_tokens, image_cost_rule
from balcaprl.recipe import Recipe

ANSWER_TOKENS = 800  # a verdict: ~20 caption and ~15 reference assertions, ~20 tokens each, and the scores
REFERENCE_TOKENS = 300  # a re-captioned reference (the paper's references are long, detailed captions)
CALL_LATENCY_S = 6.0  # median call of a hosted judge with an image and a long caption (docs/judge.md)


@dataclass(frozen=True)
class JudgePlan:
    model: str
    image_rule: str  # where the image cost comes from (or that the model is not in the table)
    calls_per_step: int
    prompt_tokens_per_call: int
    image_tokens_per_call: int
    completion_tokens_per_call: int
    steps: int | None  # RL batches in the run; None when it cannot be known before the data exists
    minutes_per_step: float
    bound_by: str  # what sets the minutes: the concurrency, or a rate limit
    usd_per_step: float | None
    notes: list[str] = field(default_factory=list)

    @property
    def prompt_tokens_per_step(self) -> int:
        return self.calls_per_step * self.prompt_tokens_per_call

    @property
    def completion_tokens_per_step(self) -> int:
        return self.calls_per_step * self.completion_tokens_per_call

    def to_text(self) -> str:
        def per_run(value: float, fmt: str) -> str:
            return "-" if self.steps is None else format(value * self.steps, fmt)

        usd = self.usd_per_step
        lines = [
            f"judge plan for {self.model} (estimates; per RL batch and per run of "
            f"{'an unknown number of' if self.steps is None else self.steps} batches)",
            f"  {'':<40} {'per batch':>14} {'per run':>16}",
            f"  {'calls':<40} {self.calls_per_step:>14,} {per_run(self.calls_per_step, ',.0f'):>16}",
            f"  {'prompt tokens (images included)':<40} {self.prompt_tokens_per_step:>14,} "
            f"{per_run(self.prompt_tokens_per_step, ',.0f'):>16}",
            f"  {'  of which images':<40} {self.calls_per_step * self.image_tokens_per_call:>14,} "
            f"{per_run(self.calls_per_step * self.image_tokens_per_call, ',.0f'):>16}",
            f"  {'completion tokens':<40} {self.completion_tokens_per_step:>14,} "
            f"{per_run(self.completion_tokens_per_step, ',.0f'):>16}",
            f"  {'USD':<40} {'-' if usd is None else format(usd, ',.2f'):>14} "
            f"{'-' if usd is None else per_run(usd, ',.2f'):>16}",
            f"  {'minutes at the configured limits':<40} {self.minutes_per_step:>14.1f} "
            f"{per_run(self.minutes_per_step, ',.0f'):>16}",
            f"  bound by: {self.bound_by}",
            f"  image tokens: {self.image_rule}",
        ]
        lines.extend(f"  note: {note}" for note in self.notes)
        return "\n".join(lines)


def _train_rows(recipe: Recipe) -> int | None:
    from balcaprl.data.format import read_card
    from balcaprl.errors import UserError

    try:
        rows = read_card(Path(recipe.data.path).expanduser()).get("counts", {}).get("train")
    except (UserError, OSError):
        return None
    if not isinstance(rows, int):
        return None
    return min(rows, recipe.data.max_samples) if recipe.data.max_samples else rows


def _run_batches(recipe: Recipe) -> int | None:
    """RL batches in the run: ``max_steps`` counts optimizer steps (each batch feeds
    updates_per_batch x ppo_epochs of them), else the epochs over the training rows."""
    t = recipe.train
    if t.max_steps is not None:
        return math.ceil(t.max_steps / (t.updates_per_batch * t.ppo_epochs))
    rows = _train_rows(recipe)
    return None if rows is None else math.ceil(t.epochs * rows / t.prompts_per_batch)


def plan_judge(recipe: Recipe, judge: JudgeConfig | None = None) -> JudgePlan | None:
    """The judge's cost plan for ``recipe`` (with ``judge``, else the recipe's own judge section);
    None when there is no judge config to plan with."""
    from balcaprl.judge.rubrics import load_rubric, training_rubric_name

    cfg = judge if judge is not None else recipe.judge
    if cfg is None:
        return None
    notes: list[str] = []
    prompts = recipe.train.prompts_per_batch
    calls = prompts * recipe.rollout.rollouts_per_prompt
    if cfg.reference_mode == "cached-reference":
        calls += prompts
        notes.append("cached-reference: one reference decomposition per prompt counted (fewer when cached)")
    rule = image_cost_rule(cfg.model)
    image = rule.tokens(cfg.max_image_side, cfg.max_image_side)
    rubric = load_rubric(training_rubric_name(recipe.rewards.pointability), cfg.reference_mode)
    # ~4 characters a token for the rubric; the caption and reference in the judge's tokens are taken
    # as their policy-token counts (both tokenizers are BPE over similar text).
    prompt = approx_tokens(rubric.text) + REFERENCE_TOKENS + recipe.rollout.max_caption_tokens + image
    completion = min(ANSWER_TOKENS, cfg.max_tokens)
    steps = _run_batches(recipe)
    if steps is None:
        notes.append("per run: no train.max_steps and no dataset card at data.path to count the batches")

    rate_minutes = {}
    if cfg.requests_per_minute:
        rate_minutes[f"requests_per_minute ({cfg.requests_per_minute:,})"] = calls / cfg.requests_per_minute
    if cfg.tokens_per_minute:
        tokens = calls * (prompt + completion)
        rate_minutes[f"tokens_per_minute ({cfg.tokens_per_minute:,})"] = tokens / cfg.tokens_per_minute
    concurrency = calls_in_flight(cfg, CALL_LATENCY_S, prompt + completion)  # the client's own rule
    waves = math.ceil(calls / concurrency)
    latency_minutes = waves * CALL_LATENCY_S / 60
    name = f"auto: {concurrency}" if cfg.concurrency_auto else str(concurrency)
    bound, minutes = f"concurrency ({name}: {waves} waves of {CALL_LATENCY_S:g} s calls)", latency_minutes
    for name, value in rate_minutes.items():
        if value > minutes:
            bound, minutes = name, value
    if not rate_minutes:
        notes.append(
            "no requests_per_minute / tokens_per_minute set: the endpoint's own limits may bind first"
        )

    prices = cfg.price_per_million_tokens
    usd = None
    if prices is not None:
        usd = (calls * prompt * prices.prompt + calls * completion * prices.completion) / 1e6
    else:
        notes.append("no price_per_million_tokens in the judge config: no dollar estimate")
    source = rule.source if not rule.known else f"{rule.kind}, {rule.source}"
    return JudgePlan(
        model=cfg.model, image_rule=f"{image:,} per image at {cfg.max_image_side} px ({source})",
        calls_per_step=calls, prompt_tokens_per_call=prompt, image_tokens_per_call=image,
        completion_tokens_per_call=completion, steps=steps, minutes_per_step=minutes, bound_by=bound,
        usd_per_step=usd, notes=notes,
    )  # fmt: skip
