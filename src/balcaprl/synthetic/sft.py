"""``balcaprl synthetic sft``: the warm start. Plain PyTorch teacher forcing of the tiny policy on a
mix of the base captioner's captions (``synthetic.captioners``: detailed, terse or enumerating) and
flawed ones. Not on the references: they are the re-captioner's, richer than what a base model says.

Why a mix: a policy trained on good captions alone would leave RL little to fix; with some flawed
captions (meta-commentary, repetition, lists, run-ons, hallucinations, too short) in its training
data the warm-started policy still makes those mistakes some of the time, which is what the paper's
rewards are designed to remove. Why these defaults: the notes on the tiny VLM (lr 5e-4 with a short
warm-up escapes the language-only plateau where higher rates get stuck; batch 32) and a budget of a
few minutes on 2 CPU cores, stopping well before the references' quality so RL has room.
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from balcaprl.data.format import read_split_rows
from balcaprl.outputs import present
from balcaprl.progress import Progress
from balcaprl.synthetic.captioners import sft_target
from balcaprl.synthetic.evaluation import CaptionScores, evaluate_policy, score_captions
from balcaprl.synthetic.oracle import OracleJudge
from balcaprl.synthetic.policy import PolicySpec, build_policy, load_policy, prompt_messages, save_policy
from balcaprl.synthetic.scenes import Scene
from balcaprl.synthetic.sft_config import SFTConfig

RESULT_FILE = "sft_result.json"


def policy_results(folder: Path | str) -> list[str]:
    """What in ``folder`` is a saved policy (its config and weights) or an SFT run's record: what a new
    policy written there would replace (``balcaprl.outputs``)."""
    names = ("config.json", "*.safetensors", "pytorch_model*.bin", "balcaprl_policy.json", RESULT_FILE)
    return present(Path(folder), names)


@dataclass
class SFTResult:
    policy_dir: Path
    steps: int
    wall_s: float
    losses: list[float] = field(default_factory=list)  # mean training loss per logging window
    before: CaptionScores | None = None  # the starting policy, held-out
    after: CaptionScores | None = None
    references: CaptionScores | None = None

    def to_json(self) -> dict[str, Any]:
        def scores(s: CaptionScores | None) -> dict[str, Any] | None:
            if s is None:
                return None
            return {
                k: getattr(s, k)
                for k in ("b_capscore", "precision", "recall", "linguistic", "n", "failures", "mean_tokens")
            }

        return {
            "policy_dir": str(self.policy_dir),
            "steps": self.steps,
            "wall_s": round(self.wall_s, 1),
            "losses": [round(x, 4) for x in self.losses],
            "held_out": {
                "before": scores(self.before),
                "after": scores(self.after),
                "references": scores(self.references),
            },
        }


class _Batches:
    """Fixed prompt (image + instruction) followed by a caption and ``<|im_end|>``; loss on the caption."""

    def __init__(
        self, processor: Any, rows: list[dict[str, Any]], scenes: dict[str, Scene], config: SFTConfig
    ) -> None:
        self.tok = processor.tokenizer
        self.rows = rows
        self.scenes = scenes
        self.config = config
        self.rng = random.Random(config.seed)
        images = [Image.open(r["image_path"]).convert("RGB") for r in rows]
        self.pixels = processor.image_processor(images, return_tensors="pt")["pixel_values"]
        text = processor.apply_chat_template(
            prompt_messages(rows[0]["prompt"]), add_generation_prompt=True, tokenize=False
        )
        self.prompt_ids = processor(text=[text], images=[images[0]], return_tensors="pt")["input_ids"][
            0
        ].tolist()
        self.eos = self.tok.eos_token_id
        self.pad = self.tok.pad_token_id

    def target(self, row: dict[str, Any]) -> str:
        # The base captioner's caption (or a flawed one), not the reference: the warm start stands for
        # a base model, whose captions the re-captioned references are richer than.
        return sft_target(self.scenes[row["id"]], self.rng, self.config.flawed_fraction)

    def next(self) -> tuple[list[dict[str, torch.Tensor]], int]:
        """One batch of ``batch_size`` captions, as ``micro_batches`` parts of similar caption length,
        each padded only to its own longest, and the batch's number of target tokens. Padding is on the
        right under a causal mask, so no caption token sees it: the parts' summed losses are the whole
        padded batch's loss, for about a third less compute (captions run from a few tokens to ~100)."""
        idx = [self.rng.randrange(len(self.rows)) for _ in range(self.config.batch_size)]
        captions = [self.target(self.rows[i]) for i in idx]
        ids = self.tok(captions, add_special_tokens=False)["input_ids"]
        order = sorted(range(len(idx)), key=lambda k: len(ids[k]))
        size = math.ceil(len(order) / self.config.micro_batches)
        parts = [order[start : start + size] for start in range(0, len(order), size)]
        targets = sum(len(c) + 1 for c in ids)  # each caption and its <|im_end|>
        return [self._padded([idx[k] for k in part], [ids[k] for k in part]) for part in parts], targets

    def _padded(self, idx: list[int], ids: list[list[int]]) -> dict[str, torch.Tensor]:
        # Built as lists and converted once: row-by-row tensor writes cost as much as a third of a step.
        width = len(self.prompt_ids) + max(len(c) for c in ids) + 1
        prompt_labels = [-100] * len(self.prompt_ids)
        input_ids, labels, mask = [], [], []
        for c in ids:
            pad = width - len(self.prompt_ids) - len(c) - 1
            input_ids.append(self.prompt_ids + c + [self.eos] + [self.pad] * pad)
            labels.append(prompt_labels + c + [self.eos] + [-100] * pad)
            mask.append([1] * (width - pad) + [0] * pad)
        return {
            "input_ids": torch.tensor(input_ids),
            "attention_mask": torch.tensor(mask),
            "labels": torch.tensor(labels),
            "pixel_values": self.pixels[idx],
        }


def _load_scenes(data_dir: Path) -> dict[str, Scene]:
    scenes = {}
    with (data_dir / "scenes.jsonl").open() as handle:
        for line in handle:
            if line.strip():
                record = json.loads(line)
                scenes[record["id"]] = Scene.from_dict(record["scene"])
    return scenes


def run_sft(
    data_dir: Path | str,
    out_dir: Path | str,
    *,
    policy: Path | str | None = None,
    spec: PolicySpec = PolicySpec(),
    config: SFTConfig = SFTConfig(),
    progress: Progress | None = None,
    evaluate_before: bool = False,
    final_dir: Path | str | None = None,
) -> SFTResult:
    """Fine-tune ``policy`` (a saved policy folder; a fresh random one if None) on ``data_dir``'s
    train split, save to ``out_dir``, and (unless ``config.eval_limit`` is 0) score held-out greedy
    captions after training, and the references, with the oracle; ``evaluate_before`` also scores the
    starting policy (a random one generates the full token budget, so this costs a minute or two).
    ``final_dir``: where the policy will live when ``out_dir`` is a folder it is built in before being
    swapped into place (``balcaprl.outputs``); the result names it (default: ``out_dir``).

    ``progress`` (started by the caller) is given the step count as its total, and each optimizer step
    with the mean training loss of the current logging window (``log_every`` steps) as it goes."""
    data_dir, out_dir = Path(data_dir), Path(out_dir)
    torch.manual_seed(config.seed)
    if policy is None:
        model, processor = build_policy(spec, seed=config.seed)
    else:
        model, processor = load_policy(policy)
    rows = read_split_rows(data_dir, "train")
    batches = _Batches(processor, rows, _load_scenes(data_dir), config)

    oracle = OracleJudge.from_dataset(data_dir) if config.eval_limit else None
    result = SFTResult(policy_dir=Path(final_dir or out_dir), steps=config.steps, wall_s=0.0)

    def held_out_scores() -> CaptionScores:
        return evaluate_policy(
            model,
            processor,
            data_dir,
            limit=config.eval_limit,
            max_new_tokens=config.max_new_tokens,
            oracle=oracle,
        )

    if oracle is not None and evaluate_before:
        result.before = held_out_scores()

    vision = [p for n, p in model.named_parameters() if "vision_tower" in n or "multi_modal_projector" in n]
    vision_ids = {id(p) for p in vision}
    language = [p for p in model.parameters() if id(p) not in vision_ids]
    optimizer = torch.optim.AdamW(
        [{"params": language, "lr": config.lr}, {"params": vision, "lr": config.lr * config.vision_lr_scale}],
        weight_decay=config.weight_decay,
    )

    def lr_factor(step: int) -> float:
        if step < config.warmup_steps:
            return (step + 1) / config.warmup_steps
        done = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
        return config.min_lr_ratio + (1 - config.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * done))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    if progress is not None:
        progress.total = config.steps
    model.train()
    start = time.perf_counter()
    window: list[float] = []
    for step in range(config.steps):
        parts, targets = batches.next()
        optimizer.zero_grad(set_to_none=True)
        loss = 0.0  # the batch's mean loss over its target tokens, summed part by part
        for part in parts:
            part_loss = model(**part, num_items_in_batch=targets).loss
            part_loss.backward()
            loss += part_loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        window.append(loss)
        if progress is not None:
            progress.status = f"loss {sum(window) / len(window):.3f}"
            progress.completed = step + 1
        if len(window) == config.log_every or step == config.steps - 1:
            result.losses.append(sum(window) / len(window))
            window = []
    result.wall_s = time.perf_counter() - start
    model.eval()
    save_policy(model, processor, out_dir, spec if policy is None else None)

    if oracle is not None:
        result.after = held_out_scores()
        eval_rows = read_split_rows(data_dir, "eval")[: config.eval_limit]
        result.references = score_captions(oracle, eval_rows, [r["reference"] for r in eval_rows])
    (out_dir / RESULT_FILE).write_text(
        json.dumps({**result.to_json(), "config": asdict(config)}, indent=2) + "\n"
    )
    return result
