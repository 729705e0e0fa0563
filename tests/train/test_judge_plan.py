"""The judge's cost plan (``balcaprl.plan.judge_cost``): calls, tokens, dollars and minutes by hand,
and where ``balcaprl train --plan`` prints it."""

from __future__ import annotations

import math
from pathlib import Path

from typer.testing import CliRunner

from balcaprl.cli import app
from balcaprl.judge.rubrics import load_rubric
from balcaprl.judge.tokens import approx_tokens
from balcaprl.plan.judge_cost import ANSWER_TOKENS, CALL_LATENCY_S, REFERENCE_TOKENS, plan_judge
from balcaprl.recipe import load_recipe, recipe_from_dict

ROOT = Path(__file__).resolve().parents[2]


def _recipe(tmp_path, **judge):
    return recipe_from_dict({
        "name": "plan", "model": {"path": "m"}, "data": {"path": str(tmp_path / "no-data")},
        "rollout": {"rollouts_per_prompt": 8, "max_caption_tokens": 1024},
        "train": {"prompts_per_batch": 256, "updates_per_batch": 4, "max_steps": 400},
        "run": {"output_dir": str(tmp_path / "run"), "save_steps": 100},
        "judge": {"model": "gpt-4o-mini", "max_image_side": 1024, "concurrency": 256, **judge},
    })  # fmt: skip


def test_a_paper_sized_batch_by_hand(tmp_path):
    plan = plan_judge(_recipe(tmp_path, price_per_million_tokens={"prompt": 0.15, "completion": 0.6}))
    image = 2833 + 5667 * 4  # gpt-4o-mini, 1024 px: 2 x 2 tiles at its own rate
    prompt = approx_tokens(load_rubric("training", "joint").text) + REFERENCE_TOKENS + 1024 + image
    assert (plan.calls_per_step, plan.image_tokens_per_call, plan.prompt_tokens_per_call) == (
        2048,
        image,
        prompt,
    )
    assert plan.completion_tokens_per_call == ANSWER_TOKENS
    assert plan.steps == 100  # 400 optimizer steps, 4 per batch
    assert math.isclose(plan.usd_per_step, 2048 * (prompt * 0.15 + ANSWER_TOKENS * 0.6) / 1e6)
    # 2,048 calls at 256 in flight: 8 waves of a median call
    assert math.isclose(plan.minutes_per_step, 8 * CALL_LATENCY_S / 60) and "8 waves" in plan.bound_by
    text = plan.to_text()
    assert "2,048" in text and "204,800" in text and "gpt-4o-mini" in text  # calls per batch, per run


def test_rate_limits_bind_when_they_are_slower_than_the_waves(tmp_path):
    plan = plan_judge(_recipe(tmp_path, requests_per_minute=1000, tokens_per_minute=10_000_000))
    tokens = 2048 * (plan.prompt_tokens_per_call + ANSWER_TOKENS)
    assert math.isclose(plan.minutes_per_step, max(2048 / 1000, tokens / 10_000_000))
    assert plan.bound_by.startswith("tokens_per_minute")
    assert plan.usd_per_step is None and any("price" in note for note in plan.notes)
    assert plan.to_text().count("-") >= 2  # no dollars per batch, none per run


def test_an_unknown_model_and_an_unknown_run_length_are_said(tmp_path):
    recipe = _recipe(tmp_path, model="gpt-5.4")
    recipe = recipe.model_copy(update={"train": recipe.train.model_copy(update={"max_steps": None})})
    plan = plan_judge(recipe)
    assert plan.steps is None and "not in the image-cost table" in plan.image_rule
    assert any("per run" in note for note in plan.notes)


def test_train_plan_prints_the_judge_plan_after_the_memory_plan():
    result = CliRunner(env={"COLUMNS": "60"}).invoke(
        app, ["train", str(ROOT / "configs" / "qwen2_5_vl_3b.yaml"), "--plan"]
    )
    assert result.exit_code == 0, result.output
    memory, judge = result.output.index("memory plan"), result.output.index("judge plan for gpt-4o-mini")
    assert memory < judge
    recipe = load_recipe(ROOT / "configs" / "qwen2_5_vl_3b.yaml", [])
    assert f"{plan_judge(recipe).calls_per_step:,}" in result.output[judge:]


def test_concurrency_auto_plans_with_the_calls_the_limits_allow(tmp_path):
    plan = plan_judge(_recipe(tmp_path, concurrency="auto", requests_per_minute=600))
    # 10 calls a second x 6 s x 1.25 = 75 in flight: 28 waves; 2,048 calls at 600 a minute take longer
    assert "auto: 75" in plan.bound_by or plan.bound_by.startswith("requests_per_minute")
    assert math.isclose(plan.minutes_per_step, max(2048 / 600, math.ceil(2048 / 75) * CALL_LATENCY_S / 60))
