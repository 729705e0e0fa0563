"""Dataset folder -> TRL rows; reference lengths in the policy's tokenizer; processor and model options."""

from __future__ import annotations

import pytest
from PIL import Image
from train_testkit import SIDE, build_tiny_dataset

from balcaprl.data.format import DatasetSample, write_dataset
from balcaprl.recipe import DataConfig, ImageConfig, ModelConfig
from balcaprl.train.data import count_tokens, prepare_train_dataset, reference_tokens_source
from balcaprl.train.modeling import load_processor, model_init_kwargs, peft_config


@pytest.fixture(scope="module")
def tokenizer(tiny_policy):
    return load_processor(ModelConfig(path=str(tiny_policy))).tokenizer


def test_rows_are_conversational_prompts_with_lazy_images(tiny_dataset, tokenizer):
    ds = prepare_train_dataset(DataConfig(path=str(tiny_dataset)), ImageConfig(), tokenizer, ["policy"])
    assert len(ds) == 8
    row = ds[0]
    assert row["id"] == "scene-000"
    assert row["prompt"] == [{"role": "user", "content": "describe the image"}]
    assert row["image_path"].startswith(str(tiny_dataset)) and row["image_path"].endswith(".png")
    assert (
        isinstance(row["image"], Image.Image)
        and row["image"].mode == "RGB"
        and row["image"].size == (SIDE, SIDE)
    )
    assert row["reference"] == "a red circle on the left ."
    assert row["reference_tokens"] == 7  # words (the policy's tokenizer), not the card's 26 characters


def test_a_batch_of_repeated_prompts_opens_each_image_once(tiny_dataset, tokenizer, monkeypatch):
    # GRPO's sampler repeats each prompt once per rollout: 3 rows x 4 rollouts open 3 images, not 12.
    import balcaprl.train.data as train_data

    opened = []
    real_open = train_data.open_image
    monkeypatch.setattr(train_data, "open_image", lambda path, *a: opened.append(path) or real_open(path, *a))
    ds = prepare_train_dataset(DataConfig(path=str(tiny_dataset)), ImageConfig(), tokenizer, ["policy"])
    rows = [i for i in (0, 1, 2) for _ in range(4)]
    batch = ds[rows]
    assert sorted(opened) == sorted(set(batch["image_path"])) and len(opened) == 3
    images = batch["image"]
    for k, i in enumerate(rows):
        assert images[k] is images[4 * (k // 4)]  # the rollouts of one prompt share its image
        single = ds[i]["image"]
        assert single.size == images[k].size and single.tobytes() == images[k].tobytes()


def test_the_datasets_lengths_are_reused_only_for_the_policys_tokenizer(tmp_path, tokenizer):
    folder = build_tiny_dataset(tmp_path / "same", tokenizer_name="my/policy")
    reused = prepare_train_dataset(DataConfig(path=str(folder)), ImageConfig(), tokenizer, ["my/policy"])
    assert reused[0]["reference_tokens"] == len("a red circle on the left .")  # the column, as stored
    recounted = prepare_train_dataset(
        DataConfig(path=str(folder), reference_tokens="recount"), ImageConfig(), tokenizer, ["my/policy"]
    )
    assert recounted[0]["reference_tokens"] == 7


def test_reference_tokens_source_rules():
    card = {"tokenizer": "org/model"}
    assert reference_tokens_source(DataConfig(path="d"), card, ["org/model"], True) == "dataset"
    assert reference_tokens_source(DataConfig(path="d"), card, ["other"], True) == "recount"
    assert reference_tokens_source(DataConfig(path="d"), card, ["org/model"], False) == "recount"
    assert (
        reference_tokens_source(
            DataConfig(path="d", reference="reference_original"), card, ["org/model"], True
        )
        == "recount"
    )
    assert (
        reference_tokens_source(DataConfig(path="d", reference_tokens="dataset"), card, ["x"], True)
        == "dataset"
    )
    with pytest.raises(match="null reference_tokens"):
        reference_tokens_source(DataConfig(path="d", reference_tokens="dataset"), card, ["x"], False)


def test_original_references_and_sample_limits(tiny_dataset, tokenizer):
    ds = prepare_train_dataset(
        DataConfig(path=str(tiny_dataset), reference="reference_original", max_samples=3),
        ImageConfig(),
        tokenizer,
        ["x"],
    )
    assert len(ds) == 3
    assert ds[0]["reference"] == "red circle" and ds[0]["reference_tokens"] == 2


def test_images_are_downscaled_to_max_side(tmp_path, tokenizer):
    import io

    buffer = io.BytesIO()
    Image.new("L", (300, 120), 128).save(buffer, format="PNG")
    sample = DatasetSample(id="big", image=buffer.getvalue(), prompt="p", reference="a red circle")
    folder = write_dataset(tmp_path / "big", [sample], [], name="big")
    ds = prepare_train_dataset(DataConfig(path=str(folder)), ImageConfig(max_side=150), tokenizer, ["x"])
    assert ds[0]["image"].size == (150, 60) and ds[0]["image"].mode == "RGB"


def test_missing_references_are_refused(tmp_path, tokenizer):
    import io

    buffer = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buffer, format="PNG")
    sample = DatasetSample(
        id="a", image=buffer.getvalue(), prompt="p", reference="a cat", reference_original=None
    )
    folder = write_dataset(tmp_path / "noorig", [sample], [], name="noorig")
    with pytest.raises(match="no 'reference_original' caption"):
        prepare_train_dataset(
            DataConfig(path=str(folder), reference="reference_original"), ImageConfig(), tokenizer, ["x"]
        )
    with pytest.raises(FileNotFoundError, match="not a finished balcaprl dataset"):
        prepare_train_dataset(DataConfig(path=str(tmp_path / "nowhere")), ImageConfig(), tokenizer, ["x"])


def test_count_tokens_leaves_special_tokens_out(tokenizer):
    assert count_tokens(tokenizer, ["a red circle", ""]) == [3, 0]


def test_processor_loads_image_only_and_takes_pixel_limits(tiny_policy):
    processor = load_processor(
        ModelConfig(path=str(tiny_policy), image=ImageConfig(min_pixels=28 * 28, max_pixels=28 * 28 * 4))
    )
    assert type(processor).__name__ == "Qwen2_5_VLProcessor"
    assert processor.tokenizer.padding_side == "left"
    assert processor.image_processor.size["shortest_edge"] == 28 * 28
    assert processor.image_processor.size["longest_edge"] == 28 * 28 * 4


def test_model_options():
    cfg = ModelConfig(path="p", dtype="bfloat16", attn_implementation="sdpa", lora={"r": 4, "alpha": 8})
    assert model_init_kwargs(cfg) == {
        "dtype": "bfloat16",
        "trust_remote_code": False,
        "attn_implementation": "sdpa",
    }
    lora = peft_config(cfg)
    assert (lora.r, lora.lora_alpha, lora.target_modules) == (4, 8, "all-linear")
    assert peft_config(ModelConfig(path="p")) is None
