"""The recipe -> GRPOConfig mapping (every value explicit), batch layout, and metric sinks."""

from __future__ import annotations

import importlib.util

import pytest

from balcaprl.recipe import recipe_from_dict
from balcaprl.train.rewards import judge_usage
from balcaprl.train.trl_backend import EpochSeededRepeatSampler, batch_layout, grpo_config


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
    r = recipe_from_dict(
        {"model": {"path": "m"}, "data": {"path": "d"}, "run": {"output_dir": str(tmp_path)}},
        [
            "rollout.vllm.mode=server",
            "rollout.vllm.server_base_url=http://10.0.0.5:8000",
            "train.precision=fp32",
            "train.per_device_batch_size=16",
        ],
    )
    args = grpo_config(r)
    assert (
        args.use_vllm and args.vllm_mode == "server" and args.vllm_server_base_url == "http://10.0.0.5:8000"
    )
    assert args.vllm_importance_sampling_correction is True


def test_batches_that_do_not_split_are_clear_errors():
    with pytest.raises(match="per_device_batch_size"):
        batch_layout(recipe("train.per_device_batch_size=48"), world_size=8)
    with pytest.raises(match="updates_per_batch"):
        batch_layout(
            recipe("train.prompts_per_batch=3", "train.updates_per_batch=16", "run.save_steps=16"),
            world_size=1,
        )
    assert batch_layout(recipe("train.per_device_batch_size=16"), world_size=8) == {
        "gradient_accumulation_steps": 16,  # the 3B recipe on 8 GPUs: 2048 captions / (16 x 8)
        "steps_per_generation": 16,
    }


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is not None, reason="tensorboard is installed")
def test_a_missing_metric_sink_is_named(tmp_path):
    with pytest.raises(match="tensorboard"):
        grpo_config(recipe("run.report_to=[tensorboard]", output_dir=str(tmp_path)), world_size=1)


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
