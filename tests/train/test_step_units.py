"""One recipe, one amount of training: TRL (optimizer steps) and verl (batches) see the same captions,
the same checkpoints and the same warm-up for the recipe's step counts."""

from __future__ import annotations

from pathlib import Path

import pytest

from balcaprl.errors import ConfigError
from balcaprl.recipe import load_recipe
from balcaprl.train.trl_backend import grpo_config
from balcaprl.train.verl_backend.render import render_verl, verl_step_counts

ROOT = Path(__file__).resolve().parents[2]
ON_CPU = ["rollout.vllm.mode=off", "train.use_cpu=true", "train.precision=fp32"]  # what a CPU can build


def trl_schedule(args) -> dict[str, object]:
    """What TRL's GRPOTrainer does with ``args`` over ``max_steps`` optimizer steps, counted by hand from
    its own settings: a generation batch of per_device x steps_per_generation x processes captions feeds
    steps_per_generation x num_iterations / gradient_accumulation_steps optimizer steps."""
    world = 8
    per_batch = args.steps_per_generation * args.num_iterations // args.gradient_accumulation_steps
    batches = args.max_steps // per_batch
    captions = batches * args.per_device_train_batch_size * args.steps_per_generation * world
    saved_after_batch = [
        step // per_batch for step in range(1, args.max_steps + 1) if step % args.save_steps == 0
    ]
    return {
        "captions": captions,
        "checkpoints": saved_after_batch,
        "warmup_batches": args.warmup_steps / per_batch,
    }


def verl_schedule(launch) -> dict[str, object]:
    """What verl does with the rendered overrides: total_training_steps batches of train_batch_size
    prompts x n captions, a checkpoint after every save_freq-th batch (verl's `global_steps %
    save_freq == 0`; it also saves after the last batch, as TRL writes final/)."""
    values = launch.as_dict()
    batches = int(values["trainer.total_training_steps"])
    captions = batches * int(values["data.train_batch_size"]) * int(values["actor_rollout_ref.rollout.n"])
    save_freq = int(values["trainer.save_freq"])
    saved_after_batch = [b for b in range(1, batches + 1) if b % save_freq == 0]
    warmup = int(values.get("actor_rollout_ref.actor.optim.lr_warmup_steps", 0))
    return {"captions": captions, "checkpoints": saved_after_batch, "warmup_batches": warmup}


@pytest.mark.parametrize(
    "overrides",
    [
        ["train.max_steps=400", "run.save_steps=100", "train.warmup=20"],  # the 3B recipe: 4 updates a batch
        [
            "train.max_steps=48",
            "run.save_steps=16",
            "train.warmup=8",
            "train.ppo_epochs=2",
        ],  # 8 steps a batch
        [
            "train.max_steps=12",
            "run.save_steps=4",
            "train.warmup=4",
            "train.updates_per_batch=1",
            "train.per_device_batch_size=32",
        ],
    ],
)
def test_trl_and_verl_see_the_same_captions_checkpoints_and_warmup(overrides):
    recipe = load_recipe(ROOT / "configs" / "qwen2_5_vl_3b.yaml", overrides)
    trl = trl_schedule(
        grpo_config(load_recipe(ROOT / "configs" / "qwen2_5_vl_3b.yaml", [*overrides, *ON_CPU]), 8)
    )
    verl = verl_schedule(render_verl(recipe, nnodes=1, gpus_per_node=8, absolute_paths=False))
    assert trl == verl
    assert trl["captions"] == recipe.train.max_steps // recipe.train.steps_per_batch * 256 * 8
    assert trl["checkpoints"]  # the parametrisation saves at least once


def test_the_issue_example_renders_a_quarter_of_the_steps():
    """`balcaprl verl launch configs/qwen2_5_vl_3b.yaml --dry-run train.max_steps=100` once rendered
    total_training_steps=100: 100 batches, 4x the TRL run's 25."""
    recipe = load_recipe(ROOT / "configs" / "qwen2_5_vl_3b.yaml", ["train.max_steps=100"])
    assert verl_step_counts(recipe) == {
        "total_training_steps": 25,
        "save_freq": 25,  # save_steps 100 optimizer steps = 25 batches
        "lr_warmup_steps": None,
        "lr_warmup_steps_ratio": 0.0,  # a ratio is unit-free
    }


@pytest.mark.parametrize(
    ("override", "key"), [("train.max_steps=102", "train.max_steps"), ("train.warmup=6", "train.warmup")]
)
def test_counts_that_are_not_whole_batches_are_refused_for_verl(override, key):
    recipe = load_recipe(ROOT / "configs" / "qwen2_5_vl_3b.yaml", [override])
    with pytest.raises(ConfigError, match=f"{key}: .* not whole batches of 4"):
        render_verl(recipe, absolute_paths=False)
