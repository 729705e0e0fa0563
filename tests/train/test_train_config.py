"""The recipe schema: paper defaults, clear errors, overrides, base chains, the judge section, and every
shipped recipe."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from balcaprl.config import apply_overrides
from balcaprl.errors import ConfigError
from balcaprl.judge import JudgeConfig
from balcaprl.recipe import Recipe, load_recipe, recipe_from_dict
from balcaprl.rewards import TAU_HIGH, TAU_LOW, RewardConfig

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
MINIMAL = {"model": {"path": "m"}, "data": {"path": "d"}, "run": {"output_dir": "o"}}


def test_defaults_are_the_papers():
    r = recipe_from_dict(MINIMAL)
    assert r.rollout.rollouts_per_prompt == 8
    assert r.train.learning_rate == 5e-6
    assert r.train.prompts_per_batch == 256
    assert r.train.lr_scheduler == "cosine" and r.train.epochs == 1
    assert r.train.kl_beta == 0.0
    assert r.train.clip_epsilon == 0.2 and r.train.dual_clip_c == 3.0
    assert r.train.loss_aggregation == "token_sum_sequence_mean"
    assert r.rewards.weights.as_list() == [0.1, 0.3, 0.3]
    assert (r.rewards.length.mode, r.rewards.length.tau_low, r.rewards.length.tau_high) == ("mask", 0.5, 2.0)
    assert r.rewards.pointability is True
    assert r.advantage.estimator == "c_gdpo" and r.advantage.eps == 1e-6
    assert r.model.gradient_checkpointing is False  # TRL's default is on; here a recipe choice
    assert r.model.lora is None and r.rollout.vllm.mode == "off"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["rewards.length.tua_low=0.5"],
            r"rewards\.length\.tua_low: unknown key; allowed here: linear_strength, mode, tau_high, tau_low",
        ),
        (["trian.learning_rate=1"], r"trian: unknown key; allowed here: .*train"),
        (["rewards.length.tau_low=3"], r"rewards\.length: tau_low \(3\.0\) must not exceed tau_high"),
        (
            ["rollout.rollouts_per_prompt=1"],
            r"rollout\.rollouts_per_prompt: Input should be greater than or equal to 2",
        ),
        (["train.dual_clip_c=1.1"], r"train: dual_clip_c \(1\.1\) must exceed 1 \+ clip epsilon"),
        (["rewards.weights={precision: 0, recall: 0, linguistic: 0}"], r"at least one reward weight"),
        (["advantage.estimator=ppo"], r"advantage\.estimator: Input should be 'c_gdpo' or 'grpo'"),
        (["run.save_steps=3", "train.updates_per_batch=2"], r"save_steps \(3\) must be a multiple"),
        (["model.lora.target_modules=[lm_head]"], r"lm_head cannot carry a LoRA adapter"),
        (["model.image.min_pixels=100", "model.image.max_pixels=10"], r"min_pixels \(100\) must not exceed"),
        (["rollout.vllm.mode=colocate", "train.use_cpu=true"], r"needs a GPU"),
    ],
)
def test_bad_recipes_name_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        recipe_from_dict(MINIMAL, overrides)


def test_missing_required_sections_are_named():
    with pytest.raises(ConfigError, match=r"model: required, but missing"):
        recipe_from_dict({"data": {"path": "d"}, "run": {"output_dir": "o"}})


def test_overrides_parse_yaml_values_and_create_sections():
    r = recipe_from_dict(
        MINIMAL,
        [
            "rewards.weights.precision=0",
            "run.report_to=[tensorboard, wandb]",
            "model.lora.r=8",
            "rollout.vllm.mode=off",  # YAML's `off` is false; the schema reads it as "off"
            "judge.model=gpt-4o-mini",
        ],
    )
    assert r.rewards.weights.precision == 0
    assert r.run.report_to == ["tensorboard", "wandb"]
    assert r.model.lora is not None and r.model.lora.r == 8 and r.model.lora.target_modules == "all-linear"
    assert r.rollout.vllm.mode == "off"
    assert r.judge == JudgeConfig(model="gpt-4o-mini")
    assert recipe_from_dict(MINIMAL, ["model.lora.r=8", "model.lora=null"]).model.lora is None
    with pytest.raises(ConfigError, match="key.sub=value"):
        apply_overrides(MINIMAL, ["rewards.weights"])
    with pytest.raises(ConfigError, match="is a value"):
        apply_overrides(MINIMAL, ["model.path.x=1"])


def test_base_chains_merge_and_loops_are_refused(tmp_path):
    (tmp_path / "a.yaml").write_text(yaml.safe_dump({**MINIMAL, "rewards": {"weights": {"precision": 0.2}}}))
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.yaml").write_text("base: ../a.yaml\nrewards:\n  weights: {recall: 0.5}\n")
    r = load_recipe(tmp_path / "sub" / "b.yaml")
    assert r.rewards.weights.as_list() == [0.2, 0.5, 0.3]
    (tmp_path / "x.yaml").write_text("base: y.yaml\n")
    (tmp_path / "y.yaml").write_text("base: x.yaml\n")
    with pytest.raises(ConfigError, match="loops"):
        load_recipe(tmp_path / "x.yaml")
    with pytest.raises(ConfigError, match="not found"):
        load_recipe(tmp_path / "nope.yaml")
    (tmp_path / "bad.yaml").write_text("model: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_recipe(tmp_path / "bad.yaml")


def test_the_judge_section_is_validated_when_the_recipe_loads(tmp_path):
    with pytest.raises(ConfigError) as info:
        recipe_from_dict({**MINIMAL, "judge": {"model": "m", "temprature": 0}})
    assert "judge.temprature: unknown key; allowed here:" in str(info.value)
    assert "temperature" in str(info.value).split("allowed here:")[1]  # the key meant is listed
    # A judge YAML named by a recipe is relative to that recipe file, through base chains too.
    (tmp_path / "judges").mkdir()
    (tmp_path / "judges" / "local.yaml").write_text("model: local-judge\nconcurrency: 3\n")
    (tmp_path / "base.yaml").write_text(yaml.safe_dump({**MINIMAL, "judge": "judges/local.yaml"}))
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "child.yaml").write_text("base: ../base.yaml\nname: child\n")
    for path in (tmp_path / "base.yaml", tmp_path / "runs" / "child.yaml"):
        judge = load_recipe(path).judge
        assert judge is not None and (judge.model, judge.concurrency) == ("local-judge", 3)
    (tmp_path / "runs" / "bad.yaml").write_text("base: ../base.yaml\njudge: missing.yaml\n")
    with pytest.raises(ConfigError, match=r"judge: judge config not found: .*runs/missing\.yaml"):
        load_recipe(tmp_path / "runs" / "bad.yaml")
    (tmp_path / "judges" / "typo.yaml").write_text("modle: x\n")
    (tmp_path / "runs" / "typo.yaml").write_text("base: ../base.yaml\njudge: ../judges/typo.yaml\n")
    with pytest.raises(ConfigError, match=r"judge\.modle: unknown key"):
        load_recipe(tmp_path / "runs" / "typo.yaml")


def test_the_reward_defaults_are_declared_once():
    r = recipe_from_dict(MINIMAL)
    assert (r.rewards.length.tau_low, r.rewards.length.tau_high) == (TAU_LOW, TAU_HIGH) == (0.5, 2.0)
    assert r.rewards.reward_config() == RewardConfig()  # the recipe's rewards are the reward config's
    assert (
        "max_failed_batches_in_a_row" not in RewardConfig.model_fields
    )  # a run guard, not a scoring setting


def test_a_recipe_round_trips_through_yaml():
    r = recipe_from_dict(MINIMAL, ["model.lora.r=4"])
    again = Recipe.model_validate(yaml.safe_load(r.to_yaml()))
    assert again == r


# Every YAML under configs/ is a recipe except accelerate's launch configs and the demo's own config
# (a DemoConfig, validated by tests/demo/test_demo_pipeline.py).
NOT_RECIPES = {CONFIGS / "demo.yaml"}
ALL_RECIPES = sorted(
    p for p in CONFIGS.rglob("*.yaml") if "accelerate" not in p.parts and p not in NOT_RECIPES
)


@pytest.mark.parametrize("path", ALL_RECIPES, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_every_shipped_recipe_validates(path):
    recipe = load_recipe(path)
    assert recipe.run.output_dir.startswith("runs/")
    assert isinstance(recipe.judge, JudgeConfig) and recipe.judge.model == "gpt-4o-mini"


def test_main_recipes_reproduce_the_paper():
    for name, model in [
        ("qwen2_5_vl_3b", "Qwen/Qwen2.5-VL-3B-Instruct"),
        ("qwen2_5_vl_7b", "Qwen/Qwen2.5-VL-7B-Instruct"),
        ("llava_1_5_7b", "llava-hf/llava-1.5-7b-hf"),
    ]:
        r = load_recipe(CONFIGS / f"{name}.yaml")
        assert r.model.path == model
        assert r.rewards.weights.as_list() == [0.1, 0.3, 0.3]
        assert (r.rewards.length.mode, r.rewards.length.tau_low, r.rewards.length.tau_high) == (
            "mask",
            0.5,
            2.0,
        )
        assert (r.rollout.rollouts_per_prompt, r.train.prompts_per_batch, r.train.learning_rate) == (
            8,
            256,
            5e-6,
        )
        assert (r.train.lr_scheduler, r.train.epochs, r.train.kl_beta, r.train.dual_clip_c) == (
            "cosine",
            1,
            0,
            3,
        )
        assert r.advantage.estimator == "c_gdpo" and r.train.loss_aggregation == "token_sum_sequence_mean"
        assert r.model.gradient_checkpointing and r.train.precision == "bf16"
        assert (256 * 8) % (r.train.per_device_batch_size * 8) == 0  # fits 8 GPUs


def _flatten(data, prefix=""):
    out = {}
    for k, v in data.items():
        if isinstance(v, dict) and v:
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _diff(path: Path, base: Path) -> dict[str, object]:
    """Keys whose values differ from ``base`` (leaving out name and run.output_dir), with the new values."""
    new, old = _flatten(load_recipe(path).to_dict()), _flatten(load_recipe(base).to_dict())
    return {k: v for k, v in new.items() if old.get(k) != v and k not in ("name", "run.output_dir")}


MAIN = CONFIGS / "qwen2_5_vl_3b.yaml"
FULL = CONFIGS / "ablations/leave_one_out/full.yaml"
EQUAL = {"rewards.weights.precision": 0.3}
ABLATION_ROWS = {
    # Table 3: leave one out (equal weights)
    "leave_one_out/full.yaml": (MAIN, EQUAL),
    "leave_one_out/no_cgdpo.yaml": (FULL, {"advantage.estimator": "grpo"}),
    "leave_one_out/no_precision.yaml": (FULL, {"rewards.weights.precision": 0.0}),
    "leave_one_out/no_recall.yaml": (FULL, {"rewards.weights.recall": 0.0}),
    "leave_one_out/no_linguistic.yaml": (FULL, {"rewards.weights.linguistic": 0.0}),
    "leave_one_out/no_pointability.yaml": (FULL, {"rewards.pointability": False}),
    "leave_one_out/no_recap.yaml": (FULL, {"data.reference": "reference_original"}),
    # Table 4: length control
    "length/no_length_penalty.yaml": (FULL, {"rewards.length.mode": "none"}),
    "length/linear_length_penalty.yaml": (FULL, {"rewards.length.mode": "linear"}),
    "length/proposed_mask.yaml": (FULL, {}),
    "length/tau_0_3.yaml": (FULL, {"rewards.length.tau_low": 0.0, "rewards.length.tau_high": 3.0}),
    **{
        f"length/tau_0.5_{hi}.yaml": (FULL, {"rewards.length.tau_high": float(hi)} if hi != 2 else {})
        for hi in (1, 2, 3, 4, 5, 6)
    },
    # Reward weight ablation
    **{
        f"weights/w_prec_{w}.yaml": (MAIN, {"rewards.weights.precision": float(w)} if w != "0.1" else {})
        for w in ("0.0", "0.1", "0.2", "0.3", "0.4")
    },
}


@pytest.mark.parametrize("relative", sorted(ABLATION_ROWS))
def test_each_ablation_changes_exactly_its_row(relative):
    base, expected = ABLATION_ROWS[relative]
    assert _diff(CONFIGS / "ablations" / relative, base) == expected


def test_every_ablation_file_is_a_table_row():
    shipped = {str(p.relative_to(CONFIGS / "ablations")) for p in (CONFIGS / "ablations").rglob("*.yaml")}
    assert shipped == set(ABLATION_ROWS)
    outputs = [load_recipe(CONFIGS / "ablations" / r).run.output_dir for r in ABLATION_ROWS]
    assert len(set(outputs)) == len(outputs)  # no two runs share a folder


@pytest.mark.parametrize("name", ["fsdp.yaml", "deepspeed_zero3.yaml", "multi_gpu.yaml"])
def test_accelerate_configs_load(name):
    from accelerate.commands.config.config_args import load_config_from_file

    config = load_config_from_file(str(CONFIGS / "accelerate" / name))
    assert config.mixed_precision == "bf16" and config.num_processes == 8
    if name == "fsdp.yaml":
        assert config.distributed_type == "FSDP" and config.fsdp_config["fsdp_version"] == 2
    if name == "deepspeed_zero3.yaml":
        assert config.distributed_type == "DEEPSPEED" and config.deepspeed_config["zero_stage"] == 3
