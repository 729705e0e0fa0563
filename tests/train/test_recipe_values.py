"""Every recipe value, pass-through ``train.trl_overrides`` included, is checked as TRL will receive it
before anything is written or loaded: a value TRL refuses is one line naming its key (status 2), no
``recipe.yaml`` is written and an earlier run that ``--overwrite`` would replace is left as it was;
the demo checks each variant's whole RL recipe (the batch layout too) before its first stage."""

from __future__ import annotations

import re

import pytest
import yaml
from test_train_cli import RECIPE_3B, tiny_overrides
from train_testkit import ScriptedJudge, tiny_recipe_dict
from typer.testing import CliRunner

from balcaprl.cli import app
from balcaprl.errors import ConfigError
from balcaprl.recipe import recipe_from_dict
from balcaprl.train.trl_backend import grpo_config

SOMETIMES = (
    "train.trl_overrides.eval_strategy: GRPOConfig refuses 'sometimes' (sometimes is not a valid "
    "IntervalStrategy, please select one of ['no', 'steps', 'epoch'])"
)


def _train(args: list[str], tmp_path):
    judge = tmp_path / "judge.yaml"
    judge.write_text(yaml.safe_dump({"base_url": "http://127.0.0.1:9/v1", "model": "m", "api_key_env": None,
                                     "cache_path": None}))  # fmt: skip
    return CliRunner().invoke(
        app, ["train", str(RECIPE_3B), "--judge", str(judge), *args], env={"COLUMNS": "60"}
    )


def test_a_bad_pass_through_value_is_one_line_and_nothing_is_written(tiny_policy, tiny_dataset, tmp_path):
    run = tmp_path / "run"
    overrides = [
        *tiny_overrides(tiny_policy, tiny_dataset, run),
        "train.trl_overrides.eval_strategy=sometimes",
    ]
    result = _train(overrides, tmp_path)
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines() == [f"error: {SOMETIMES}"]
    assert not run.exists()  # no recipe.yaml, no lock, no folder

    # --overwrite of an earlier run: the refusal comes before the old run is moved aside
    (run / "checkpoint-4").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    result = _train([*overrides, "--overwrite"], tmp_path)
    assert result.exit_code == 2 and result.output.strip().splitlines() == [f"error: {SOMETIMES}"]
    assert (run / "checkpoint-4").is_dir() and (run / "metrics.jsonl").read_text() == '{"step": 1}\n'


def test_train_in_python_checks_before_writing_the_recipe(tiny_policy, tiny_dataset, tmp_path):
    from balcaprl.train import train

    out = tmp_path / "run"
    recipe = recipe_from_dict(
        tiny_recipe_dict(
            tiny_policy, tiny_dataset, out, train={"trl_overrides": {"eval_strategy": "sometimes"}}
        )
    )
    with pytest.raises(ConfigError, match=re.escape(SOMETIMES)):
        train(recipe, ScriptedJudge())
    assert not (out / "recipe.yaml").exists()


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("train.optimizer=bogus", "TRL's GRPOConfig refuses optim='bogus', which the recipe sets (bogus is not a "
                                  "valid OptimizerNames"),
        ("train.trl_overrides.lr_scheduler_kwargs=3", "train.trl_overrides.lr_scheduler_kwargs: 3 is not a "
                                                      "dict | str | None (TRL's GRPOConfig)"),
        ("train.trl_overrides.logging_first_step=yes please", "logging_first_step: 'yes please' is not a bool"),
        ("train.trl_overrides.torch_empty_cache_steps=true", "torch_empty_cache_steps: True is not a int | None"),
    ],
)  # fmt: skip
def test_the_key_that_set_a_refused_value_is_named(override, message):
    base = {"model": {"path": "m"}, "data": {"path": "d"}, "run": {"output_dir": "runs/x"}}
    recipe = recipe_from_dict(base, ["train.use_cpu=true", "train.precision=fp32", override])
    with pytest.raises(ConfigError, match=re.escape(message)):
        grpo_config(recipe, world_size=1)


def test_the_demo_checks_every_rl_recipe_before_its_first_stage(tmp_path):
    from balcaprl.demo.config import load_demo_config
    from balcaprl.demo.pipeline import run_demo
    from balcaprl.demo.variants import VARIANTS

    out = tmp_path / "demo"
    # 8 prompts x 8 rollouts / 2 updates = 32 captions per step: micro-batches of 3 do not divide them
    config = load_demo_config(None, [f"output_dir={out}", "recipe.train.per_device_batch_size=3"])
    with pytest.raises(
        ConfigError, match=r"recipe \(variant full\): 32 captions per optimizer step do not split"
    ):
        run_demo(config, [VARIANTS["full"]])
    assert not out.exists()  # no dataset built, no SFT run, nothing written
    config = load_demo_config(
        None, [f"output_dir={out}", "recipe.train.trl_overrides={eval_strategy: sometimes}"]
    )
    with pytest.raises(ConfigError, match=re.escape(f"recipe (variant full): {SOMETIMES}")):
        run_demo(config, [VARIANTS["full"]])
    assert not out.exists()
