"""Run by test_server_mode.py under `accelerate launch --multi_gpu --num_processes 2` (torchrun underneath;
CPU, gloo): two steps of balcaprl's trainer, both processes' rollouts from the test's vLLM server on
127.0.0.1, ``judge_overlap: per_rollout``. Writes what each process's judge overlap measured (every
step's ``stage_metrics``) and how many requests its own judge got to OUT/rank<N>.json.

CPU only, in the test set-up: accelerate and transformers are asked for the CPU (gloo) before the trainer
is built (a recipe with a vLLM engine is a GPU recipe: ``train.use_cpu`` is false), and TRL's NCCL weight push to the server is skipped
(test_server_mode.py says why)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))

from accelerate import PartialState  # noqa: E402


def main(policy: Path, dataset: Path, url: str, out: Path) -> None:
    os.environ["ACCELERATE_USE_CPU"] = "true"  # what `accelerate launch --cpu` sets (transformers reads it)
    state = PartialState(cpu=True)  # before balcaprl's first PartialState(cpu=use_cpu), which reuses it
    from engine_kit import StampedJudge
    from train_testkit import tiny_recipe_dict
    from trl.generation.vllm_client import VLLMClient

    from balcaprl.recipe import recipe_from_dict
    from balcaprl.train import build_trainer

    VLLMClient.init_communicator = lambda self, device=0: None
    VLLMClient.update_named_params = lambda self, metadata, params: None
    recipe = recipe_from_dict(
        tiny_recipe_dict(
            policy,
            dataset,
            out,
            rollout={
                "vllm": {"mode": "server", "server_base_url": url},
                "max_caption_tokens": 24,
                "temperature": 1.5,
            },
            # one prompt a step, its 4 rollouts split over the 2 processes: one response holds both's
            train={
                "max_steps": 2,
                "use_cpu": False,
                "judge_overlap": "per_rollout",
                "prompts_per_batch": 1,
                "per_device_batch_size": 2,
            },
        )  # fmt: skip
    )
    judge = StampedJudge()
    trainer = build_trainer(recipe, judge)
    measured: list[dict[str, float]] = []
    stage_metrics = trainer.judge_overlap.stage_metrics

    def recording(asked: float) -> dict[str, float]:
        metrics = stage_metrics(asked)
        measured.append(metrics)
        return metrics

    trainer.judge_overlap.stage_metrics = recording
    trainer.train()
    record = {
        "global_step": trainer.state.global_step,
        "metrics": measured,
        "judged_here": len(judge.requests),
    }
    (out / f"rank{state.process_index}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], Path(sys.argv[4]))
