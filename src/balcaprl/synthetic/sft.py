"""``balcaprl synthetic sft``: the warm start. Plain PyTorch teacher forcing of the tiny policy on a
mix of reference and flawed captions.

Why a mix: a policy trained on references alone would leave RL little to fix; with some flawed
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
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from balcaprl.data.format import read_split_rows
from balcaprl.synthetic.evaluation import CaptionScores, evaluate_policy, score_captions
from balcaprl.synthetic.flaws import FLAW_KINDS, flawed_caption
from balcaprl.synthetic.oracle import OracleJudge
from balcaprl.synthetic.policy import PolicySpec, build_policy, load_policy, prompt_messages, save_policy
from balcaprl.synthetic.scenes import Scene

__all__ = ["SFTConfig", "SFTResult", "run_sft"]


@dataclass(frozen=True)
class SFTConfig:
    """Teacher-forcing settings; the defaults take ~2 minutes of training on 2 idle CPU cores."""

    steps: int = 800  # optimizer steps (~2 minutes on 2 idle cores)
    batch_size: int = 32
    lr: float = 5e-4  # higher rates stall on the language-only plateau (notes, pitfall 1)
    vision_lr_scale: float = 1.0  # the vision tower and projector train at lr * this
    warmup_steps: int = 20
    min_lr_ratio: float = 0.1  # cosine decay to lr * min_lr_ratio
    weight_decay: float = 0.0
    flawed_fraction: float = 0.3  # share of targets replaced by a flawed caption of a random kind
    seed: int = 0
    eval_limit: int = 200  # held-out scenes for the closing b-CapScore (0 skips evaluation)
    max_new_tokens: int = 192
    log_every: int = 25

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch_size < 1:
            raise ValueError(f"steps and batch_size must be >= 1, got {self.steps} and {self.batch_size}")
        if not 0.0 <= self.flawed_fraction <= 1.0:
            raise ValueError(f"flawed_fraction must be in [0, 1], got {self.flawed_fraction}")


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
        if self.rng.random() < self.config.flawed_fraction:
            return flawed_caption(self.scenes[row["id"]], self.rng.choice(FLAW_KINDS), self.rng)
        return row["reference"]

    def next(self) -> dict[str, torch.Tensor]:
        idx = [self.rng.randrange(len(self.rows)) for _ in range(self.config.batch_size)]
        captions = [self.target(self.rows[i]) for i in idx]
        ids = self.tok(captions, add_special_tokens=False)["input_ids"]
        seqs = [self.prompt_ids + c + [self.eos] for c in ids]
        width = max(len(s) for s in seqs)
        input_ids = torch.full((len(seqs), width), self.pad, dtype=torch.long)
        labels = torch.full((len(seqs), width), -100, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        n_prompt = len(self.prompt_ids)
        for b, s in enumerate(seqs):
            input_ids[b, : len(s)] = torch.tensor(s)
            mask[b, : len(s)] = 1
            labels[b, n_prompt : len(s)] = input_ids[b, n_prompt : len(s)]
        return {
            "input_ids": input_ids,
            "attention_mask": mask,
            "labels": labels,
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
    on_step: Callable[[int, float], None] | None = None,
    evaluate_before: bool = False,
) -> SFTResult:
    """Fine-tune ``policy`` (a saved policy folder; a fresh random one if None) on ``data_dir``'s
    train split, save to ``out_dir``, and (unless ``config.eval_limit`` is 0) score held-out greedy
    captions after training, and the references, with the oracle; ``evaluate_before`` also scores the
    starting policy (a random one generates the full token budget, so this costs a minute or two)."""
    data_dir, out_dir = Path(data_dir), Path(out_dir)
    torch.manual_seed(config.seed)
    if policy is None:
        model, processor = build_policy(spec, seed=config.seed)
    else:
        model, processor = load_policy(policy)
    rows = read_split_rows(data_dir, "train")
    batches = _Batches(processor, rows, _load_scenes(data_dir), config)

    oracle = OracleJudge.from_dataset(data_dir) if config.eval_limit else None
    result = SFTResult(policy_dir=out_dir, steps=config.steps, wall_s=0.0)

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
        progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
        return config.min_lr_ratio + (1 - config.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    model.train()
    start = time.perf_counter()
    window: list[float] = []
    for step in range(config.steps):
        loss = model(**batches.next()).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        window.append(loss.item())
        if len(window) == config.log_every or step == config.steps - 1:
            result.losses.append(sum(window) / len(window))
            window = []
        if on_step is not None:
            on_step(step + 1, loss.item())
    result.wall_s = time.perf_counter() - start
    model.eval()
    save_policy(model, processor, out_dir, spec if policy is None else None)

    if oracle is not None:
        result.after = held_out_scores()
        eval_rows = read_split_rows(data_dir, "eval")[: config.eval_limit]
        result.references = score_captions(oracle, eval_rows, [r["reference"] for r in eval_rows])
    (out_dir / "sft_result.json").write_text(
        json.dumps({**result.to_json(), "config": asdict(config)}, indent=2) + "\n"
    )
    return result
