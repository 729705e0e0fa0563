"""The synthetic SFT's settings, apart from the training code: the demo's configuration reads its
defaults from here without importing torch or transformers (``balcaprl.synthetic.sft`` does)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SFTConfig:
    """Teacher-forcing settings. The defaults are the demo's (``balcaprl.demo.config.SFTSettings``
    reads them from here, and so does ``balcaprl synthetic sft``): one warm start, whichever way it is
    made; the provenance of each (tuned or free) is in the demo's settings."""

    steps: int = 1500  # optimizer steps
    batch_size: int = 32
    lr: float = 5e-4  # higher rates stall on the language-only plateau (notes, pitfall 1)
    vision_lr_scale: float = 5.0  # the vision tower and projector train at lr * this
    warmup_steps: int = 20
    min_lr_ratio: float = 0.1  # cosine decay to lr * min_lr_ratio
    weight_decay: float = 0.0
    flawed_fraction: float = 0.5  # share of targets replaced by a flawed caption of a random kind
    seed: int = 0
    eval_limit: int = 200  # held-out scenes for the closing b-CapScore (0 skips evaluation)
    max_new_tokens: int = 192
    log_every: int = 25
    # A batch runs as this many parts of similar caption length (the same gradient, ~20% less padding
    # compute; more parts cost more in per-call overhead than they save).
    micro_batches: int = 2

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch_size < 1 or self.micro_batches < 1:
            raise ValueError(
                f"steps, batch_size and micro_batches must be >= 1, got {self.steps}, {self.batch_size} "
                f"and {self.micro_batches}"
            )
        if not 0.0 <= self.flawed_fraction <= 1.0:
            raise ValueError(f"flawed_fraction must be in [0, 1], got {self.flawed_fraction}")
