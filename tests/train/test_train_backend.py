"""The recipe -> GRPOConfig mapping (every value explicit), batch layout, and metric sinks."""

from __future__ import annotations

import importlib.util
import math
import re
from pathlib import Path

import pytest

from balcaprl.recipe import load_recipe, recipe_from_dict
from balcaprl.train.judging import judge_usage
from balcaprl.train.metrics import RolloutLog
from balcaprl.train.trl_backend import EpochSeededRepeatSampler, batch_layout, grpo_config

ROOT = Path(__file__).resolve().parents[2]


def recipe(*overrides, output_dir="runs/x"):
    base = {"model": {"path": "m"}, "data": {"path": "d"}, "run": {"output_dir": output_dir}}
    return recipe_from_dict(base, ["train.use_cpu=true", "train.precision=fp32", *overrides])


def test_paper_recipe_maps_onto_grpo_config(tmp_path):
    args = grpo_config(recipe("train.per_device_batch_size=16", output_dir=str(tmp_path)))  # one process here
    assert args.num_generations == 8
    assert args.per_device_train_batch_size == 16
    assert args.gradient_accumulation_steps == 128 and args.steps_per_generation == 128  # 2048 / 16
    assert args.generation_batch_size == 256 * 8  # one RL batch = 256 prompts x 8 captions
    assert (args.loss_type, args.importance_sampling_level) == ("luspo", "token")
    assert (args.epsilon, args.epsilon_high, args.delta, args.beta) == (0.2, None, 3.0, 0.0)  # high = low
    assert args.learning_rate == 5e-6 and args.lr_scheduler_type == "cosine" and args.num_train_epochs == 1
    assert args.reward_weights == [0.1, 0.3, 0.3]
    assert args.multi_objective_aggregation == "normalize_then_sum"
    assert args.gradient_checkpointing is False  # the name transformers 5.17 and 5.23 both accept
    assert args.logging_steps == 1 and args.save_steps == 50 and args.report_to == []
    assert args.remove_unused_columns is False and args.num_iterations == 1
    assert args.use_vllm is False


def test_options_reach_trl(tmp_path):
    args = grpo_config(
        recipe(
            "model.gradient_checkpointing=true",
            "model.dtype=bfloat16",
            "train.updates_per_batch=2",
            "train.ppo_epochs=2",
            "run.save_steps=4",
            "train.per_device_batch_size=8",
            "train.warmup=10",
            "train.max_steps=7",
            "advantage.estimator=grpo",
            "train.loss_aggregation=token_mean",
            "train.dual_clip_c=null",
            "rollout.max_caption_tokens=300",
            output_dir=str(tmp_path),
        )
    )
    assert args.gradient_checkpointing is True and args.gradient_checkpointing_kwargs == {
        "use_reentrant": False
    }
    assert args.model_init_kwargs["dtype"] == "bfloat16"
    assert args.gradient_accumulation_steps == 128 and args.steps_per_generation == 256  # 2048 / 2 / 8
    assert args.num_iterations == 2 and args.max_steps == 7 and args.warmup_steps == 10
    assert args.multi_objective_aggregation == "sum_then_normalize"
    assert args.loss_type == "dapo" and args.delta is None and args.max_completion_length == 300


def test_vllm_settings_reach_trl(tmp_path):
    base = {"model": {"path": "m"}, "data": {"path": "d"}, "run": {"output_dir": str(tmp_path)}}
    overrides = [
        "rollout.vllm.mode=server",
        "rollout.vllm.server_base_url=http://10.0.0.5:8000",
        "train.precision=fp32",
        "train.per_device_batch_size=16",
    ]
    args = grpo_config(recipe_from_dict(base, overrides))
    assert (
        args.use_vllm and args.vllm_mode == "server" and args.vllm_server_base_url == "http://10.0.0.5:8000"
    )
    # Off unless asked: eq. 2.7 has no such term (TRL's own default is on).
    assert args.vllm_importance_sampling_correction is False
    on = grpo_config(recipe_from_dict(base, [*overrides, "rollout.vllm.importance_sampling_correction=true"]))
    assert on.vllm_importance_sampling_correction is True


def test_batches_that_do_not_split_are_clear_errors():
    with pytest.raises(match="per_device_batch_size"):
        batch_layout(recipe("train.per_device_batch_size=48"), world_size=8)
    with pytest.raises(match="updates_per_batch"):
        batch_layout(
            recipe("train.prompts_per_batch=3", "train.updates_per_batch=16", "run.save_steps=16"),
            world_size=1,
        )
    with pytest.raises(
        match="do not split over 7 training processes; use a number of processes dividing 2048"
    ):
        batch_layout(recipe(), world_size=7)  # e.g. 8 GPUs with one serving vLLM: no batch size can work
    assert batch_layout(recipe("train.per_device_batch_size=16"), world_size=8) == {
        "gradient_accumulation_steps": 16,  # the 3B recipe on 8 GPUs: 2048 captions / (16 x 8)
        "steps_per_generation": 16,
    }


@pytest.mark.skipif(importlib.util.find_spec("wandb") is not None, reason="wandb is installed")
def test_a_missing_metric_sink_is_named(tmp_path):
    with pytest.raises(match="run.report_to includes 'wandb' but the wandb package is not installed"):
        grpo_config(recipe("run.report_to=[wandb]", output_dir=str(tmp_path)), world_size=1)


@pytest.mark.parametrize("name", ["qwen2_5_vl_3b", "qwen2_5_vl_7b", "llava_1_5_7b"])
def test_the_shipped_gpu_recipes_build_on_eight_processes(name):
    """What `accelerate launch -m balcaprl train configs/NAME.yaml` builds on an 8-GPU node after the
    documented install (their metric sink, TensorBoard, comes with the [trl] extra)."""
    on_cpu = ["rollout.vllm.mode=off", "train.use_cpu=true", "train.precision=fp32"]  # what a CPU can build
    shipped = load_recipe(ROOT / "configs" / f"{name}.yaml", on_cpu)
    args = grpo_config(shipped, world_size=8)
    assert args.report_to == ["tensorboard"]
    # every distributed launch (FSDP too, where TRL would leave "auto") loads without a device map
    assert "device_map" in args.model_init_kwargs and args.model_init_kwargs["device_map"] is None
    assert "device_map" not in grpo_config(shipped, world_size=1).model_init_kwargs  # TRL's own choice
    assert args.steps_per_generation == args.gradient_accumulation_steps * shipped.train.updates_per_batch


def test_prompt_order_depends_on_the_epoch_only():
    def order(epoch, warmup_epochs=0):
        sampler = EpochSeededRepeatSampler(list(range(10)), mini_repeat_count=2, batch_size=5, seed=3)
        for e in range(warmup_epochs):  # iterating earlier epochs must not change epoch `epoch`'s order
            sampler.set_epoch(e)
            list(sampler)
        sampler.set_epoch(epoch)
        return list(sampler)

    assert order(1) == order(1, warmup_epochs=1)
    assert order(0) != order(1)
    assert order(0)[:2] == [order(0)[0]] * 2  # each prompt repeated for its rollouts
    # A resumed run on several processes: nobody calls set_epoch; the sampler asks the trainer's state
    # (epoch 1.5: half-way through the second epoch) when its iteration starts.
    resumed = EpochSeededRepeatSampler(
        list(range(10)), mini_repeat_count=2, batch_size=5, seed=3, epoch_source=lambda: math.floor(1.5)
    )
    assert list(resumed) == order(1)


def test_a_batch_is_logged_when_a_step_it_feeds_is_an_nth_step_and_the_first_batch_too(tmp_path):
    every_100 = RolloutLog(tmp_path / "rollouts.jsonl", every=100)
    # 4 updates per batch: batches feed steps 1-4, 5-8, ...; step 100's batch is the one starting at 97.
    assert [first for first in range(1, 1001, 4) if every_100.wants(first, 4)] == [1, *range(97, 1001, 100)]
    every_2 = RolloutLog(tmp_path / "rollouts.jsonl", every=2)
    assert [step for step in range(1, 9) if every_2.wants(step)] == [1, 2, 4, 6, 8]  # one step per batch
    assert [first for first in range(1, 9, 3) if every_2.wants(first, 3)] == [1, 4, 7]
    assert not RolloutLog(tmp_path / "rollouts.jsonl", every=0).wants(1, 4)


def test_judge_usage_reads_client_stats():
    class Stats:
        def as_dict(self, prices):
            return {
                "requests": 4,
                "cache_hits": 1,
                "prompt_tokens": 900,
                "failures": {"timeout": 1},
                "estimated_cost_usd": 0.5 if prices else None,
            }

    class Config:
        price_per_million_tokens = {"prompt": 0.15, "completion": 0.6}

    class ClientLike:
        stats = Stats()
        config = Config()

    assert judge_usage(ClientLike()) == {
        "requests": 4.0,
        "cache_hits": 1.0,
        "prompt_tokens": 900.0,
        "estimated_cost_usd": 0.5,
    }
    assert judge_usage(type("U", (), {"usage": lambda self: {"tokens": 3, "flag": True}})()) == {
        "tokens": 3.0
    }


def test_trl_overrides_pass_settings_the_recipe_does_not_name(tmp_path):
    plain = grpo_config(recipe(output_dir=str(tmp_path)), world_size=1)
    assert plain.logging_first_step is False and plain.torch_empty_cache_steps is None  # TRL's defaults
    args = grpo_config(
        recipe(
            "train.trl_overrides.logging_first_step=true",
            "train.trl_overrides.torch_empty_cache_steps=4",
            output_dir=str(tmp_path),
        ),
        world_size=1,
    )
    assert args.logging_first_step is True and args.torch_empty_cache_steps == 4
    assert args.learning_rate == plain.learning_rate  # nothing else moved


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "train.trl_overrides.logging_first_stp=true",
            "not a field of TRL's GRPOConfig; did you mean logging_first_step",
        ),
        ("train.trl_overrides.learning_rate=1", "the recipe sets it already (learning_rate=5e-06)"),
        (
            "train.trl_overrides.output_dir=/tmp/elsewhere",
            "train.trl_overrides.output_dir: the recipe sets it",
        ),
    ],
)
def test_trl_overrides_refuse_unknown_fields_and_the_recipes_own(tmp_path, override, message):
    from balcaprl.errors import ConfigError

    with pytest.raises(ConfigError, match=re.escape(message)):
        grpo_config(recipe(override, output_dir=str(tmp_path)), world_size=1)
