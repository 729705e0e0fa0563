"""The memory plan: its arithmetic against hand-computed numbers, its parameter counts against
transformers and peft (a second implementation), the shipped accelerate configs' claims, and
`balcaprl train --plan`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from balcaprl.cli import app
from balcaprl.plan.memory import (
    KNOWN_MODELS,
    GiB,
    Launcher,
    launcher_from_accelerate,
    launcher_from_verl_layout,
    model_shape,
    plan_memory,
    shape_from_config,
)
from balcaprl.recipe import load_recipe

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
QWEN_3B, QWEN_7B, LLAVA = KNOWN_MODELS


def test_per_token_bytes_by_hand():
    q3, q7, llava = (model_shape(name) for name in (QWEN_3B, QWEN_7B, LLAVA))
    # a_layer = 20h + 4kv + 8I + 4 heads + 8 (two RMSNorms 2 x (4h + 4 + 2h + 2h), q k v out 2 (2h + 2kv),
    # lse 4 heads, SwiGLU 4 x 2I): 3B h 2048, kv 2 x 128, I 11008, 16 heads (autograd's count: test_memory_measured).
    assert q3.text.layer_activation_bytes() == 20 * 2048 + 4 * 256 + 8 * 11008 + 4 * 16 + 8 == 130_120
    assert q7.text.layer_activation_bytes() == 20 * 3584 + 4 * 512 + 8 * 18944 + 4 * 28 + 8 == 225_400
    assert llava.text.layer_activation_bytes() == 20 * 4096 + 4 * 4096 + 8 * 11008 + 4 * 32 + 8 == 186_504
    # A padding mask of width L: k and v expanded to every head, and the mask (2 bytes a key) in every layer.
    assert q3.text.layer_activation_bytes(mask_width=2368) == 130_120 + 4 * (2048 - 256) + 2 * 2368
    assert llava.text.layer_activation_bytes(mask_width=1664) == 186_504 + 2 * 1664 == 189_832
    # CLIP: GELU MLP, full attention: 2 (6 x 1024 + 2 x 1024 + 2 x 4096).
    assert llava.vision.layer_activation_bytes() == 32_768
    # KV cache per token: layers x 2 x kv x 2 bytes.
    assert q3.text.kv_bytes_per_token() == 36 * 2 * 256 * 2 == 36 * 1024
    assert q7.text.kv_bytes_per_token() == 56 * 1024 and llava.text.kv_bytes_per_token() == 512 * 1024
    # Image tokens: one per 28 x 28 pixels up to max_pixels (1280 at 1,003,520), 4 patches each in the ViT.
    assert (q3.image_tokens(1003520), q3.vision_tokens(1003520)) == (1280, 5120)
    assert q3.image_tokens(None) == 12845056 // 784  # the checkpoint's own limit: 16,384 tokens
    assert (llava.image_tokens(None), llava.vision_tokens(None)) == (576, 577)


@pytest.mark.parametrize("name", list(KNOWN_MODELS))
def test_parameter_counts_equal_transformers(name):
    """The formula's count against the model transformers builds from the same config (meta device)."""
    import torch
    from transformers import AutoModelForImageTextToText, LlavaConfig, Qwen2_5_VLConfig

    config, preprocessor = KNOWN_MODELS[name]
    if config["model_type"] == "qwen2_5_vl":
        text = {k: v for k, v in config.items() if k not in ("model_type", "vision_config")}
        hf = Qwen2_5_VLConfig(
            text_config=text,
            vision_config=config["vision_config"],
            tie_word_embeddings=config["tie_word_embeddings"],
        )
    else:
        hf = LlavaConfig(
            text_config=config["text_config"],
            vision_config=config["vision_config"],
            image_seq_length=576,
            vision_feature_layer=-2,
        )
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(hf)
    assert shape_from_config(name, config, preprocessor).params == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("fixture", ["tiny_policy", "tiny_llava"])
def test_local_checkpoints_parameters_and_lora_equal_peft(fixture, request):
    """A checkpoint folder's config.json: its parameters, and LoRA's trainable ones against peft."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForImageTextToText

    folder = request.getfixturevalue(fixture)
    shape = model_shape(str(folder))
    model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32)
    assert shape.params == sum(p.numel() for p in model.parameters())
    lora = get_peft_model(model, LoraConfig(r=4, target_modules="all-linear", task_type="CAUSAL_LM"))
    trainable = sum(p.numel() for p in lora.parameters() if p.requires_grad)
    assert shape.lora_params(4) == trainable


def test_static_state_and_activations_by_hand():
    recipe = load_recipe(CONFIGS / "qwen2_5_vl_3b.yaml", ["model.layers_without_recompute=0"])
    params = 3_754_622_976
    ddp = plan_memory(recipe, launcher_from_accelerate(CONFIGS / "accelerate/multi_gpu.yaml"))
    # fp32 weights 4, gradients 4, AdamW m and v 8, DDP buckets 4: 20 bytes per parameter.
    static = sum(
        ddp.update[k] for k in ("weights", "gradients", "optimizer states (AdamW)", "DDP gradient buckets")
    )
    assert static == 20 * params and round(static / GiB) == 70
    fsdp = plan_memory(recipe, launcher_from_accelerate(CONFIGS / "accelerate/fsdp.yaml"))
    assert fsdp.update["weights"] + fsdp.update["gradients"] + fsdp.update["optimizer states (AdamW)"] == (
        16 * params / 8
    )
    # Checkpointed activations of 16 captions of 1280 + 64 + 1024 tokens, packed (the recipe's
    # padding_free: no mask): each layer's input (2h bytes) plus one recomputed layer; the ViT on
    # 16 x 5120 patches likewise (h 1280, 16 heads, I 3420, 32 blocks).
    tokens, patches = 16 * 2368, 16 * 5120
    vit_layer = 20 * 1280 + 4 * 1280 + 8 * 3420 + 4 * 16 + 8
    lm = tokens * (36 * 2 * 2048 + 130_120)
    vit = patches * (32 * 2 * 1280 + vit_layer)
    assert fsdp.update["activations (checkpointed)"] == lm + vit
    assert fsdp.activations["without checkpointing (16 x 2368 tokens)"] == (
        tokens * 36 * 130_120 + patches * 32 * vit_layer
    )
    # Padded rows under sdpa: every layer also keeps k and v at all heads and a 2368-wide mask.
    padded = plan_memory(
        load_recipe(
            CONFIGS / "qwen2_5_vl_3b.yaml", ["model.layers_without_recompute=0", "train.padding_free=false"]
        ),
        launcher_from_accelerate(CONFIGS / "accelerate/fsdp.yaml"),
    )
    masked = 130_120 + 4 * (2048 - 256) + 2 * 2368
    assert padded.update["activations (checkpointed)"] == tokens * (36 * 2 * 2048 + masked) + vit


def test_selective_checkpointing_by_hand():
    """The largest number of decoder layers that keep their activations with 6 GiB of the card free: each
    kept layer trades its 2h-byte input for a whole layer's activations (130,120 bytes a token, 3B)."""
    recipe = load_recipe(CONFIGS / "qwen2_5_vl_3b.yaml")
    plan = plan_memory(recipe, launcher_from_accelerate(CONFIGS / "accelerate/fsdp.yaml"))
    tokens, patches = 16 * 2368, 16 * 5120
    vit = patches * (32 * 2 * 1280 + 20 * 1280 + 4 * 1280 + 8 * 3420 + 4 * 16 + 8)

    def activations(kept):  # 36 - kept layers keep their input, kept + 1 a whole layer (one recomputed)
        return tokens * ((36 - kept) * 2 * 2048 + (kept + 1) * 130_120) + vit

    assert recipe.model.layers_without_recompute == 8
    assert plan.update["activations (checkpointed, last 8 of 36 decoder layers kept)"] == activations(8)
    left = 74 * GiB - sum(v for k, v in plan.update.items() if not k.startswith("activations ("))
    most = plan.layers_without_recompute
    assert activations(most) <= left < activations(most + 1) and most == 8
    assert plan.peak <= 74 * GiB
    assert "up to 8 of the 36 decoder layers can keep their activations at 16 x 2368 tokens" in " ".join(
        plan.notes
    )
    # The whole stack without recompute is plain training without checkpointing.
    assert recipe.model.gradient_checkpointing
    all_kept = load_recipe(CONFIGS / "qwen2_5_vl_3b.yaml", ["model.layers_without_recompute=36"])
    full = plan_memory(all_kept, launcher_from_accelerate(CONFIGS / "accelerate/fsdp.yaml"))
    assert full.update["activations (checkpointed, last 36 of 36 decoder layers kept)"] == (
        tokens * 36 * 130_120 + vit
    )
    assert not full.fits


def test_verls_token_budget_by_hand():
    """verl's micro-batch: the most tokens (a multiple of 1024) whose activations fit 90% of what the static
    state leaves, at the worst case of one image per one-token caption."""
    recipe = load_recipe(CONFIGS / "qwen2_5_vl_3b.yaml")
    plan = plan_memory(recipe, launcher_from_verl_layout("1x8"))
    # LM (checkpointed): each layer's input + one recomputed layer; ViT: 5120 patches of one image, spread
    # over the 1280 + 64 + 1 tokens of its shortest sequence.
    vit_layer = 20 * 1280 + 4 * 1280 + 8 * 3420 + 4 * 16 + 8
    per_token = 36 * 2 * 2048 + 130_120 + 5120 * (32 * 2 * 1280 + vit_layer) / (1280 + 64 + 1)
    static = 16 * 3_754_622_976 / 8 + 2 * 151_936 * 2048 * 2 + 512 * 151_936 * 6 + 3 * GiB
    left = 0.9 * (80 * GiB - static)
    budget = plan.token_budget
    assert budget % 1024 == 0 and budget * per_token <= left < (budget + 1024) * per_token
    assert budget == 80_896
    assert plan.update["activations (checkpointed)"] == pytest.approx(budget * per_token)
    assert plan.fits and "at most 80896 tokens per GPU" in " ".join(plan.notes)
    # TRL keeps per_device_batch_size captions: no budget.
    assert (
        plan_memory(recipe, launcher_from_accelerate(CONFIGS / "accelerate/fsdp.yaml")).token_budget is None
    )


def test_the_engine_sleeps_or_stays():
    recipe = load_recipe(CONFIGS / "qwen2_5_vl_3b.yaml")
    fsdp = launcher_from_accelerate(CONFIGS / "accelerate/fsdp.yaml")
    asleep = plan_memory(recipe, fsdp)
    assert "vLLM engine (0.6 of the GPU, TP 1)" in asleep.rollout
    assert not any(k.startswith("vLLM engine, resident") for k in asleep.update)
    resident = plan_memory(
        load_recipe(CONFIGS / "qwen2_5_vl_3b.yaml", ["rollout.vllm.enable_sleep_mode=false"]), fsdp
    )
    assert resident.update["vLLM engine, resident (0.3 of the GPU)"] == 0.3 * 80 * GiB  # TRL's own default
    # KV cache left: 0.6 x 80 GiB - bf16 weights - 2 GiB engine overhead; per caption 2368 x 36 KiB.
    capacity = 0.6 * 80 * GiB - 2 * 3_754_622_976 - 2 * GiB
    assert f"holds about {int(capacity // (2368 * 36 * 1024))} captions" in " ".join(asleep.notes)


def test_generate_without_vllm_does_not_fit_and_says_why():
    recipe = load_recipe(CONFIGS / "qwen2_5_vl_3b.yaml", ["rollout.vllm.mode=off"])
    plan = plan_memory(recipe, launcher_from_accelerate(CONFIGS / "accelerate/fsdp.yaml"))
    assert not plan.fits
    # TRL generates a GPU's whole share (2048 / 8 = 256 captions) at once, in the fp32 model's dtype.
    assert plan.rollout["KV cache of 256 captions at once (generate)"] == 256 * 2368 * 36 * 2 * 256 * 4
    assert plan.rollout["whole model gathered for generate"] == 4 * 3_754_622_976
    assert any("rollout phase" in w for w in plan.warnings)


def test_launchers():
    assert launcher_from_accelerate(CONFIGS / "accelerate/fsdp.yaml") == Launcher(
        "fsdp", 8, description="fsdp.yaml: FSDP over 8 GPUs"
    )
    assert launcher_from_accelerate(CONFIGS / "accelerate/deepspeed_zero3.yaml").strategy == "zero3"
    assert launcher_from_accelerate(CONFIGS / "accelerate/multi_gpu.yaml", gpus=4).gpus == 4
    verl = launcher_from_verl_layout("4x8")
    assert (verl.strategy, verl.gpus, verl.backend, verl.shards) == ("fsdp", 32, "verl", 32)
    with pytest.raises(ValueError, match="NODESxGPUS"):
        launcher_from_verl_layout("four")


CLAIM = re.compile(
    r"^# plan: (?P<recipe>\S+)(?P<overrides>(?: \S+=\S+)*) (?P<verdict>fits|does not fit) (?P<gib>\d+) GiB GPUs$"
)


def claims():
    found = []
    for path in sorted((CONFIGS / "accelerate").glob("*.yaml")):
        lines = [m for line in path.read_text().splitlines() if (m := CLAIM.match(line))]
        assert lines, f"{path.name} states no memory claim (# plan: ... fits|does not fit N GiB GPUs)"
        found += [(path, m) for m in lines]
    return found


@pytest.mark.parametrize(
    "path, claim", claims(), ids=lambda x: x.name if isinstance(x, Path) else x.group(0)[8:]
)
def test_the_accelerate_configs_claims_agree_with_the_plan(path, claim):
    recipe = load_recipe(CONFIGS.parent / claim["recipe"], claim["overrides"].split())
    plan = plan_memory(recipe, launcher_from_accelerate(path), float(claim["gib"]))
    assert plan.fits == (claim["verdict"] == "fits"), plan.to_text()


def test_plan_on_the_command_line():
    runner = CliRunner(env={"COLUMNS": "200"})
    result = runner.invoke(
        app,
        [
            "train",
            str(CONFIGS / "qwen2_5_vl_3b.yaml"),
            "--plan",
            "--launcher",
            str(CONFIGS / "accelerate/multi_gpu.yaml"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "DOES NOT FIT" in result.output and "warning: the update phase needs" in result.output
    result = runner.invoke(
        app, ["train", str(CONFIGS / "llava_1_5_7b.yaml"), "--plan", "--verl-layout", "1x8"]
    )
    assert result.exit_code == 0 and "fits" in result.output and "TP 2" in result.output
    both = runner.invoke(
        app,
        [
            "train",
            str(CONFIGS / "qwen2_5_vl_3b.yaml"),
            "--plan",
            "--verl-layout",
            "1x8",
            "--launcher",
            __file__,
        ],
    )
    assert both.exit_code == 2 and "pick one" in both.output
    without = runner.invoke(app, ["train", str(CONFIGS / "qwen2_5_vl_3b.yaml"), "--gpus", "8"])
    assert without.exit_code == 2 and "add --plan" in without.output


def test_an_unknown_model_is_named(tmp_path):
    recipe = load_recipe(CONFIGS / "qwen2_5_vl_3b.yaml", [f"model.path={tmp_path / 'nothing'}"])
    with pytest.raises(ValueError, match="no config.json"):
        plan_memory(recipe, Launcher("single", 1))
