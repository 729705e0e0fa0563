"""The smallest `balcaprl demo` config that still runs every stage (about 30 s on 2 cores): a 16-scene
dataset, 6 SFT steps, 3 RL steps through the HTTP oracle judge, 6 held-out captions."""

from __future__ import annotations

from pathlib import Path

TOY_DEMO: dict = {
    "dataset": {"n_train": 16, "n_eval": 6, "seed": 3, "min_objects": 2, "max_objects": 2, "image_size": 84},
    "sft": {"steps": 6, "batch_size": 4, "warmup_steps": 2},
    "evaluation": {"scenes": 6, "max_new_tokens": 12, "bootstrap_samples": 200, "show": 2},
    "recipe": {
        "rollout": {"rollouts_per_prompt": 4, "max_caption_tokens": 12},
        "train": {"prompts_per_batch": 2, "per_device_batch_size": 4, "max_steps": 3, "warmup": 1},
        "run": {"save_steps": 2, "log_rollouts_every": 1, "progress": False},
    },
}


def write_toy_demo_config(path: Path) -> Path:
    """Write :data:`TOY_DEMO` as a demo config YAML at ``path`` and return it."""
    import yaml

    path.write_text(yaml.safe_dump(TOY_DEMO), encoding="utf-8")
    return path
