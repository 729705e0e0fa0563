"""The tiny policy: built locally, saved and loaded through plain from_pretrained, and trainable."""

from __future__ import annotations

import io
import json
import re

import pytest
import torch
from PIL import Image

from balcaprl.data.format import read_split_rows
from balcaprl.progress import Progress
from balcaprl.synthetic.evaluation import evaluate_policy
from balcaprl.synthetic.policy import (
    PolicySpec,
    build_policy,
    caption_token_counts,
    create_policy,
    generate_captions,
    load_policy,
    prompt_messages,
)
from balcaprl.synthetic.sft import SFTConfig, _Batches, _load_scenes, run_sft


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
    # The saved config names the tokenizer's special tokens where trainers look for them (no
    # "new PAD/BOS/EOS tokens" realignment and warning when training starts).
    tok = processor.tokenizer
    assert (model.config.eos_token_id, model.config.pad_token_id) == (tok.eos_token_id, tok.pad_token_id)
    assert getattr(model.config, "bos_token_id", None) == tok.bos_token_id


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


def test_micro_batches_give_the_whole_padded_batch_its_loss_and_gradient(tiny_dataset):
    # Same draws (same seed), split into parts of similar length, each padded to its own longest: the
    # parts' losses (each over the whole batch's target tokens) sum to the padded batch's mean loss,
    # and their gradients to its gradient.
    model, processor = build_policy(seed=2)
    rows, scenes = read_split_rows(tiny_dataset, "train"), _load_scenes(tiny_dataset)

    def loss_and_grads(micro_batches):
        config = SFTConfig(batch_size=8, flawed_fraction=0.5, micro_batches=micro_batches, seed=5)
        parts, targets = _Batches(processor, rows, scenes, config).next()
        model.zero_grad()
        for part in parts:  # labels: the caption and its end token, under the mask; -100 elsewhere
            ids, labels, mask = part["input_ids"], part["labels"], part["attention_mask"].bool()
            assert (
                torch.equal(labels[labels != -100], ids[labels != -100]) and not (labels[~mask] != -100).any()
            )
            ends = mask.sum(dim=1) - 1
            assert (ids[torch.arange(len(ids)), ends] == processor.tokenizer.eos_token_id).all()
            assert ((labels != -100).sum(dim=1) < mask.sum(dim=1)).all()  # the prompt carries no loss
        if micro_batches == 1:  # the reference: the model's own mean over one padded batch
            assert targets == int((parts[0]["labels"] != -100).sum())
            loss = model(**parts[0]).loss
            loss.backward()
            total = loss.item()
        else:
            total = 0.0
            for part in parts:
                part_loss = model(**part, num_items_in_batch=targets).loss
                part_loss.backward()
                total += part_loss.item()
        return (
            len(parts),
            [p["input_ids"].shape[1] for p in parts],
            total,
            {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None},
        )

    _, (full_width,), whole, whole_grads = loss_and_grads(1)
    n_parts, widths, split, split_grads = loss_and_grads(3)
    assert n_parts == 3 and sorted(widths) == widths and widths[0] < full_width == widths[-1]
    assert split == pytest.approx(whole, rel=1e-5)
    scale = max(g.abs().max() for g in whole_grads.values())
    for name, grad in whole_grads.items():
        torch.testing.assert_close(split_grads[name], grad, rtol=1e-4, atol=1e-5 * scale, msg=name)


def test_sft_reports_steps_and_loss_in_a_log(tiny_dataset, tmp_path):
    # Off a terminal: a start line, a line every interval with count, rate, ETA and the running loss,
    # and a closing line. The clock is the step count (10 s a step): nothing depends on real time.
    out = io.StringIO()
    reporter = Progress("sft", unit="steps", stream=out, terminal=False, interval_s=20, heartbeat=False,
                        clock=lambda: 10.0 * reporter.completed)  # fmt: skip
    config = SFTConfig(steps=6, batch_size=2, warmup_steps=1, eval_limit=0, log_every=3)
    with reporter:
        result = run_sft(tiny_dataset, tmp_path / "sft", config=config, progress=reporter)
    lines = out.getvalue().splitlines()
    assert lines[0] == "sft: started"  # the total is set by run_sft, from its config
    loss = r"; loss \d+\.\d{3}"
    expected = [
        rf"sft: 2/6 steps \(33%\), 0\.1 steps/s, elapsed 0:00:20, ETA 0:00:40{loss}",
        rf"sft: 4/6 steps \(67%\), 0\.1 steps/s, elapsed 0:00:40, ETA 0:00:20{loss}",
        rf"sft: 6/6 steps \(100%\), 0\.1 steps/s, elapsed 0:01:00, ETA 0:00:00{loss}",
        rf"sft: done, 6/6 steps in 0:01:00 \(0\.1 steps/s\){loss}",
    ]
    assert len(lines) == 5 and all(
        re.fullmatch(p, line) for p, line in zip(expected, lines[1:], strict=True)
    ), lines
    # the loss shown is the running mean of the current logging window: at step 6, of steps 4-6
    assert lines[-1].endswith(f"loss {result.losses[-1]:.3f}")


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
