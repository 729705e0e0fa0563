"""The tiny policy: built locally, saved and loaded through plain from_pretrained, and trainable."""

from __future__ import annotations

import json

import pytest
import torch
from PIL import Image

from balcaprl.data.format import read_split_rows
from balcaprl.synthetic.evaluation import evaluate_policy
from balcaprl.synthetic.policy import (
    PolicySpec,
    caption_token_counts,
    create_policy,
    generate_captions,
    load_policy,
    prompt_messages,
)
from balcaprl.synthetic.sft import SFTConfig, run_sft


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
    return create_policy(tmp_path_factory.mktemp("policy") / "tiny", seed=1)


def test_policy_loads_through_auto_classes(policy_dir, tiny_dataset):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    model = AutoModelForImageTextToText.from_pretrained(policy_dir)
    processor = AutoProcessor.from_pretrained(policy_dir)
    assert type(model).__name__ == "LlavaForConditionalGeneration"
    assert sum(p.numel() for p in model.parameters()) < 2_000_000
    text = processor.apply_chat_template(prompt_messages(), add_generation_prompt=True, tokenize=False)
    assert text.count("<image>") == 1 and text.endswith("<|im_start|>assistant\n")
    image = Image.open(read_split_rows(tiny_dataset, "eval")[0]["image_path"])
    batch = processor(text=[text], images=[image], return_tensors="pt")
    assert batch["pixel_values"].shape[-1] == PolicySpec().image_size  # resized from 224 px
    assert int((batch["input_ids"] == model.config.image_token_id).sum()) == PolicySpec().image_tokens
    assert processor.tokenizer.unk_token_id not in batch["input_ids"][0].tolist()


def test_save_load_round_trip_keeps_the_outputs(policy_dir, tiny_dataset, tmp_path):
    model, processor = load_policy(policy_dir)
    model.save_pretrained(tmp_path / "copy")
    processor.save_pretrained(tmp_path / "copy")
    again, processor2 = load_policy(tmp_path / "copy")
    image = Image.open(read_split_rows(tiny_dataset, "eval")[0]["image_path"])
    text = processor.apply_chat_template(prompt_messages(), add_generation_prompt=True, tokenize=False)
    batch = processor(text=[text], images=[image], return_tensors="pt")
    with torch.no_grad():
        assert torch.equal(model(**batch).logits, again(**batch).logits)
    assert processor2.tokenizer.get_vocab() == processor.tokenizer.get_vocab()


def test_generation_and_token_counts(policy_dir, tiny_dataset):
    model, processor = load_policy(policy_dir)
    images = [Image.open(r["image_path"]) for r in read_split_rows(tiny_dataset, "eval")[:3]]
    captions = generate_captions(model, processor, images, max_new_tokens=6)
    assert len(captions) == 3 and all(isinstance(c, str) for c in captions)
    assert caption_token_counts(processor, ["A red circle, at the top.", ""]) == [8, 0]


def test_a_tiny_sft_run_lowers_the_loss(tiny_dataset, tmp_path):
    config = SFTConfig(steps=30, batch_size=4, lr=2e-3, warmup_steps=5, eval_limit=0, log_every=10)
    result = run_sft(tiny_dataset, tmp_path / "sft", config=config)
    assert len(result.losses) == 3
    assert result.losses[-1] < 0.75 * result.losses[0]  # ~0.6 in practice, from ln(vocab) ~ 5.7
    model, processor = load_policy(tmp_path / "sft")  # the checkpoint loads like any other
    summary = json.loads((tmp_path / "sft" / "sft_result.json").read_text())
    assert summary["steps"] == 30 and summary["config"]["batch_size"] == 4
    scores = evaluate_policy(model, processor, tiny_dataset, limit=2, max_new_tokens=12)
    assert scores.n == 2 and scores.failures == 0 and 0.0 <= scores.b_capscore <= 100.0


def test_build_counts_reference_tokens_with_a_given_policy(policy_dir, tmp_path):
    from balcaprl.data.format import read_card
    from balcaprl.synthetic.build import build_dataset
    from balcaprl.synthetic.lexicon import words_of

    out = build_dataset(tmp_path / "ds", n_train=2, n_eval=1, seed=0, policy_dir=policy_dir)
    assert read_card(out)["tokenizer"] == str(policy_dir)
    _, processor = load_policy(policy_dir)
    rows = read_split_rows(out, "train")
    assert [r["reference_tokens"] for r in rows] == caption_token_counts(
        processor, [r["reference"] for r in rows]
    )
    assert [r["reference_tokens"] for r in rows] == [len(words_of(r["reference"])) for r in rows]
