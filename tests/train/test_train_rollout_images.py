"""Rollouts see the trainer's images: for an image above model.image.max_pixels, the image-token count in
the prompt TRL hands to the rollout engine equals what the engine's own processor makes of the image
it is handed, whether the engine got the trainer's limits (colocate) or runs at its checkpoint's
defaults (a vLLM server started without them). The engine is a stand-in for vLLM (tests/train/fake_vllm.py)
built into TRL's real colocate path; without the pre-resize the same setting is refused, as vLLM would."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image
from train_testkit import ScriptedJudge, tiny_recipe_dict

from balcaprl.data.format import DatasetSample, TokenCounter, write_dataset
from balcaprl.errors import ConfigError
from balcaprl.recipe import recipe_from_dict
from balcaprl.train.modeling import ImageGrid, image_grid

CHECKPOINT_MAX_PIXELS = 12_845_056  # Qwen2.5-VL-3B/7B-Instruct's preprocessor_config.json
TRAINER_MAX_PIXELS = 56 * 56 * 4  # 12,544 pixels: at most 16 image tokens
IMAGE = (300, 200)  # 60,000 pixels, above the trainer's limit


@pytest.fixture(scope="module")
def policy_like_the_hub(tiny_policy, tmp_path_factory) -> Path:
    """The tiny policy with the real checkpoints' processor limits (3,136 to 12,845,056 pixels)."""
    folder = tmp_path_factory.mktemp("policy-hub-limits") / "policy"
    shutil.copytree(tiny_policy, folder)
    config = json.loads((folder / "processor_config.json").read_text())
    config["image_processor"]["size"] = {"shortest_edge": 3136, "longest_edge": CHECKPOINT_MAX_PIXELS}
    (folder / "processor_config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def large_images(tmp_path_factory) -> Path:
    def png(i: int) -> bytes:
        buffer = io.BytesIO()
        Image.new("RGB", IMAGE, ((i * 60) % 256, 90, 30)).save(buffer, format="PNG")
        return buffer.getvalue()

    samples = [
        DatasetSample(
            id=f"large-{i}",
            image=png(i),
            prompt="describe the image",
            reference="a red circle .",
            source="test",
        )
        for i in range(4)
    ]
    counter = TokenCounter(name="characters", count=lambda texts: [len(t) for t in texts])
    return write_dataset(
        tmp_path_factory.mktemp("large") / "d", samples[:3], samples[3:], name="large", token_counter=counter
    )


def colocated_run(policy, dataset, out):
    from balcaprl.train import build_trainer

    recipe = recipe_from_dict(
        tiny_recipe_dict(
            policy,
            dataset,
            out,
            model={"image": {"max_pixels": TRAINER_MAX_PIXELS}},
            rollout={"vllm": {"mode": "colocate"}},
            train={"use_cpu": False, "max_steps": 1, "prompts_per_batch": 2},
        )
    )
    trainer = build_trainer(recipe, ScriptedJudge(fail_every=None, check_images=False))
    trainer.train()
    return trainer


def trainer_tokens(policy) -> int:
    """What the trainer's own processor makes of the image: smart_resize under the recipe's limit."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    processor = Qwen2VLImageProcessorPil.from_pretrained(policy, max_pixels=TRAINER_MAX_PIXELS)
    grid = processor(images=[Image.new("RGB", IMAGE)], return_tensors="pt")["image_grid_thw"]
    return int(grid.prod()) // 4


@pytest.mark.parametrize("engine_gets_the_limits", [True, False], ids=["colocate", "engine-defaults"])
def test_the_rollout_engine_counts_the_trainers_image_tokens(
    engine_gets_the_limits, policy_like_the_hub, large_images, fake_vllm, tmp_path
):
    fake_vllm.honour_processor_kwargs = engine_gets_the_limits
    colocated_run(policy_like_the_hub, large_images, tmp_path / "run")
    (engine,) = fake_vllm.instances
    # The engine was built with the trainer's pixel limits (TRL's LLM(...) has no such argument of its own).
    assert engine.kwargs["mm_processor_kwargs"] == {"min_pixels": 3136, "max_pixels": TRAINER_MAX_PIXELS}
    assert engine.loaded_weights  # TRL pushed the policy's weights into it
    expected = trainer_tokens(policy_like_the_hub)
    assert 0 < expected < ImageGrid(28, 3136, CHECKPOINT_MAX_PIXELS).tokens(*IMAGE)  # the limit binds
    assert len(engine.counts) == 8  # 2 prompts x 4 rollouts
    assert all(in_prompt == made == expected for in_prompt, made in engine.counts), engine.counts
    assert set(engine.image_sizes) == {ImageGrid(28, 3136, TRAINER_MAX_PIXELS).size(*IMAGE)}


def test_without_the_pre_resize_an_engine_at_its_defaults_disagrees(
    policy_like_the_hub, large_images, fake_vllm, tmp_path, monkeypatch
):
    """The control: the raw image to an engine that does not know the trainer's limits."""
    import balcaprl.train.trl_backend as trl_backend

    monkeypatch.setattr(trl_backend, "image_grid", lambda processor: None)
    fake_vllm.honour_processor_kwargs = False
    with pytest.raises(ValueError, match="image placeholder tokens"):
        colocated_run(policy_like_the_hub, large_images, tmp_path / "run")
    (in_prompt, made), *_ = fake_vllm.instances[0].counts
    assert in_prompt == trainer_tokens(policy_like_the_hub) and made == ImageGrid(
        28, 3136, CHECKPOINT_MAX_PIXELS
    ).tokens(*IMAGE)


def test_vllm_mode_without_vllm_is_a_clear_error(tiny_policy, tiny_dataset, tmp_path):
    from trl.generation import vllm_generation

    from balcaprl.train import build_trainer

    if vllm_generation.is_vllm_available():
        pytest.skip("vLLM is installed here")
    recipe = recipe_from_dict(
        tiny_recipe_dict(
            tiny_policy,
            tiny_dataset,
            tmp_path,
            rollout={"vllm": {"mode": "colocate"}},
            train={"use_cpu": False},
        )
    )
    with pytest.raises(ConfigError, match=r"needs vLLM.*gpu-one-node.txt"):
        build_trainer(recipe, ScriptedJudge())


# -- the grid itself ---------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    width=st.integers(28, 700),
    height=st.integers(28, 700),
    max_tokens=st.integers(8, 400),  # max_pixels >= 2 min_pixels; closer limits can have no fixed point
)
def test_a_resized_image_is_left_alone_by_any_processor_whose_limits_contain_it(width, height, max_tokens):
    """Pre-resizing to the trainer's grid gives the trainer's token count under the trainer's limits and
    under the checkpoint's wider ones (what an engine at its defaults uses)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    if max(width, height) / min(width, height) > 200:
        return
    grid = ImageGrid(28, 3136, max_tokens * 784)
    resized = grid.resize(Image.new("RGB", (width, height)))
    assert (
        resized.size == grid.size(width, height) and grid.size(*resized.size) == resized.size
    )  # a fixed point
    for limits in ((3136, max_tokens * 784), (3136, CHECKPOINT_MAX_PIXELS)):
        processor = Qwen2VLImageProcessorPil(min_pixels=limits[0], max_pixels=limits[1])
        made = int(processor(images=[resized], return_tensors="pt")["image_grid_thw"].prod()) // 4
        assert made == grid.tokens(width, height)


def test_image_grid_reads_the_processor(tiny_policy, tiny_llava):
    from balcaprl.recipe import ModelConfig
    from balcaprl.train.modeling import load_processor

    qwen = load_processor(ModelConfig(path=str(tiny_policy), image={"max_pixels": 12544, "min_pixels": 3136}))
    assert image_grid(qwen) == ImageGrid(28, 3136, 12544)
    assert (
        image_grid(load_processor(ModelConfig(path=str(tiny_llava)))) is None
    )  # a fixed crop: nothing to match


def test_a_vllm_server_with_other_limits_is_stopped_before_pairing():
    """Server mode: the server's image features (their lengths) against the trainer's prompt, before TRL
    re-places them at the trainer's image-token runs."""
    from balcaprl.train.trl_backend import BalancedGRPOTrainer, image_token_runs

    placed = []
    generation = SimpleNamespace(_place_features=lambda features, ids: placed.append(ids) or features)
    trainer = SimpleNamespace(
        vllm_generation=generation,
        processing_class=SimpleNamespace(image_token_id=9),
        image_grid=ImageGrid(28, 3136, 12544),
        model=SimpleNamespace(name_or_path="Qwen/Qwen2.5-VL-3B-Instruct"),
        args=SimpleNamespace(bf16=True, fp16=False),
    )
    BalancedGRPOTrainer._check_served_image_tokens(trainer)
    prompt = [1, 2, 9, 9, 9, 3, 9, 9, 4]
    assert image_token_runs(prompt, 9) == [3, 2]
    same = {"mm_placeholders": {"image": [{"offset": 0, "length": 3}, {"offset": 9, "length": 2}]}}
    assert generation._place_features(same, prompt) == same and placed == [prompt]
    other = {"mm_placeholders": {"image": [{"offset": 0, "length": 70}, {"offset": 90, "length": 2}]}}
    with pytest.raises(ConfigError) as error:
        generation._place_features(other, prompt)
    message = " ".join(str(error.value).split())
    assert "[70, 2] image tokens" in message and "[3, 2]" in message
    assert """--mm-processor-kwargs '{"min_pixels": 3136, "max_pixels": 12544}'""" in message
    # the whole line a colocated engine's settings make (rollout_engine.server_command)
    assert """--dtype bfloat16 --limit-mm-per-prompt '{"image": 1, "video": 0}'""" in message
    assert generation._place_features(None, prompt) is None  # a prompt without images passes
