"""``balcaprl verl export`` writes verl's multimodal RL rows, and verl's own RLHFDataset loads them with
the tiny policies' processors (images through verl's own vision path)."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

pytest.importorskip("verl")

from omegaconf import OmegaConf  # noqa: E402
from verl.utils.dataset.rl_dataset import RLHFDataset  # noqa: E402
from verl_testkit import ensure_qwen_vl_utils_importable  # noqa: E402

from balcaprl.cli import app  # noqa: E402
from balcaprl.data.format import read_card, read_split_rows  # noqa: E402
from balcaprl.train.verl_backend.export import export_verl, read_export  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def vision_utils_importable():
    """verl's image path imports qwen_vl_utils, which imports torchvision (see verl_testkit)."""
    ensure_qwen_vl_utils_importable()


def dataset_config(cache_dir, **more):
    return OmegaConf.create(
        {
            "prompt_key": "prompt",
            "image_key": "images",
            "max_prompt_length": 256,
            "filter_overlong_prompts": True,  # runs verl's own processor path over every image
            "filter_overlong_prompts_workers": 1,
            "truncation": "error",
            "return_raw_chat": True,
            "cache_dir": str(cache_dir),
            **more,
        }
    )


def test_rows_follow_verls_multimodal_format(tiny_dataset, tmp_path):
    result = export_verl(tiny_dataset, tmp_path / "verl")
    source_rows = read_split_rows(tiny_dataset, "train")
    rows = pq.read_table(result.path("train")).to_pylist()
    assert result.counts == {"train": len(source_rows), "eval": 2}
    row, source = rows[0], source_rows[0]
    assert row["data_source"] == f"balcaprl/{read_card(tiny_dataset)['name']}"
    assert row["prompt"] == [{"role": "user", "content": "<image>" + source["prompt"]}]
    assert row["images"] == [{"image": str((tiny_dataset / source["image"]).resolve())}]
    assert row["reward_model"] == {"style": "model", "ground_truth": source["reference"]}
    info = row["extra_info"]
    assert info["id"] == source["id"] and info["index"] == 0 and info["split"] == "train"
    assert info["image"] == source["image"] and info["image_sha256"] == source["image_sha256"]
    # The dataset counted references in "characters": the stored count travels with its tokenizer's name.
    assert info["reference_tokens"] == len(source["reference"]) and info["tokenizer"] == "characters"
    manifest = read_export(tmp_path / "verl")
    assert manifest["reference"] == "reference" and manifest["counts"]["train"] == len(source_rows)


def test_reference_original_and_a_policy_tokenizer(tiny_dataset, tiny_qwen, tmp_path):
    result = export_verl(
        tiny_dataset, tmp_path / "v", reference="reference_original", tokenizer=str(tiny_qwen)
    )
    rows = pq.read_table(result.path("eval")).to_pylist()
    source = read_split_rows(tiny_dataset, "eval")[0]
    assert rows[0]["reward_model"]["ground_truth"] == source["reference_original"]
    assert rows[0]["extra_info"]["tokenizer"] == str(tiny_qwen)
    assert rows[0]["extra_info"]["reference_tokens"] == len(source["reference_original"].split())


def test_export_refuses_to_overwrite_the_dataset(tiny_dataset):
    with pytest.raises(ValueError, match="must differ"):
        export_verl(tiny_dataset, tiny_dataset)


@pytest.mark.parametrize("embed", [False, True])
def test_verls_rlhf_dataset_loads_the_rows_with_the_tiny_policys_processor(
    tiny_dataset, tiny_policy, tmp_path, embed
):
    from transformers import AutoProcessor, AutoTokenizer

    export = export_verl(tiny_dataset, tmp_path / "verl", embed_images=embed)
    processor = AutoProcessor.from_pretrained(tiny_policy)
    tokenizer = AutoTokenizer.from_pretrained(tiny_policy)
    dataset = RLHFDataset(
        str(export.path("train")), tokenizer, dataset_config(tmp_path / "cache"), processor=processor
    )
    assert len(dataset) == export.counts["train"]  # no row was filtered out by verl's processor pass
    item = dataset[0]
    assert item["data_source"].startswith("balcaprl/")
    message = item["raw_prompt"][0]
    assert [part["type"] for part in message["content"]] == ["image", "text"]
    assert item["extra_info"]["id"] == "scene-000"
    assert item["reward_model"]["ground_truth"]
    # verl's vision path (as its agent loop runs it): images out of the messages, through the processor.
    from verl.utils.tokenizer import build_multimodal_processor_inputs

    images, videos, _ = RLHFDataset._process_multi_modal_info(
        item["raw_prompt"], dataset.image_patch_size, dataset.config
    )
    assert len(images) == 1 and videos is None
    text = processor.apply_chat_template(item["raw_prompt"], add_generation_prompt=True, tokenize=False)
    inputs = build_multimodal_processor_inputs(processor, text=[text], images=images)
    image_token = processor.tokenizer.convert_tokens_to_ids("<image>")
    from balcaprl.synthetic.policy import PolicySpec

    spec = PolicySpec()  # the policy's own numbers, so a change of patch size cannot stale this test
    assert int((inputs["input_ids"][0] == image_token).sum()) == spec.image_tokens
    assert tuple(inputs["pixel_values"].shape[-2:]) == (spec.image_size, spec.image_size)


def test_verls_rlhf_dataset_with_a_tiny_qwen2_5_vl(tiny_dataset, tiny_qwen, tmp_path):
    from balcaprl.recipe import ModelConfig
    from balcaprl.train.modeling import load_processor

    export = export_verl(tiny_dataset, tmp_path / "verl")
    processor = load_processor(ModelConfig(path=str(tiny_qwen)))
    dataset = RLHFDataset(
        str(export.path("train")),
        processor.tokenizer,
        dataset_config(tmp_path / "cache"),
        processor=processor,
    )
    assert len(dataset) == export.counts["train"]
    assert [p["type"] for p in dataset[1]["raw_prompt"][0]["content"]] == ["image", "text"]


def test_export_command(tiny_dataset, tmp_path):
    runner = CliRunner(env={"COLUMNS": "120"})
    result = runner.invoke(app, ["verl", "export", "--data", str(tiny_dataset), "--out", str(tmp_path / "o")])
    assert result.exit_code == 0, result.output
    assert "rows to" in result.output
    assert json.loads((tmp_path / "o" / "export.json").read_text())["counts"]["eval"] == 2
    bad = runner.invoke(app, ["verl", "export", "--data", str(tiny_dataset), "--reference", "caption"])
    assert bad.exit_code != 0
