"""Run by test_train_distributed.py under `torchrun --nproc_per_node 2` (CPU, gloo): trains the tiny
policy for 2 steps and writes what this rank judged and handed to the loss to OUT/<case>/rank<N>.json."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from accelerate import PartialState  # noqa: E402
from train_testkit import ScriptedJudge, tiny_recipe_dict  # noqa: E402

from balcaprl.recipe import recipe_from_dict  # noqa: E402
from balcaprl.train import build_trainer  # noqa: E402

CASES = {
    # whole groups on each rank: 2 prompts x 4 rollouts, micro-batches of 2 per rank
    "whole_groups": {"train": {"prompts_per_batch": 2, "per_device_batch_size": 2, "max_steps": 2}},
    # one prompt's 4 rollouts split over the 2 ranks
    "split_groups": {"train": {"prompts_per_batch": 1, "per_device_batch_size": 2, "max_steps": 2}},
}


def main(policy: Path, dataset: Path, out: Path) -> None:
    for case, sections in CASES.items():
        recipe = recipe_from_dict(tiny_recipe_dict(policy, dataset, out / case, **sections))
        judge = ScriptedJudge(fail_every=3)
        trainer = build_trainer(recipe, judge)
        batches = []
        original = trainer._generate_and_score_completions

        def recording(inputs, _original=original, _trainer=trainer, _batches=batches):
            output = _original(inputs)
            _batches.append(
                {
                    "ids": [x["id"] for x in inputs],
                    "local_advantages": output["advantages"].tolist(),
                    "all_advantages": _trainer.last_advantages.tolist(),
                    "all_rewards": [
                        [None if math.isnan(v) else v for v in row]
                        for row in _trainer._gathered_rewards.tolist()
                    ],
                }
            )
            return output

        trainer._generate_and_score_completions = recording
        trainer.train()
        rank = PartialState().process_index
        record = {"judge_calls": judge.calls, "judge_requests": len(judge.requests), "batches": batches}
        (out / case / f"rank{rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main(*map(Path, sys.argv[1:4]))
