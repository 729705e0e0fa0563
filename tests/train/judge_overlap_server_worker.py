"""Run by test_train_judge_overlap.py under `torchrun --nproc_per_node 2` (CPU, gloo): TRL's server-mode
generation itself (``VLLMGeneration.generate``: every process's prompts gathered on the main process,
one request per prompt to the server, the completions broadcast and sliced by process) in front of a
scripted server, with balcaprl's judge overlap around it as the trainer drives it, ``per_rollout`` and
``off``; then the reward functions' scorer on each process's own rollouts. Writes what this process saw
to OUT/<case>/<mode>/rank<N>.json.

The stamps are ``time.monotonic()``: one clock for every process of this machine."""

from __future__ import annotations

import asyncio
import json
import math
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))

from accelerate import PartialState  # noqa: E402
from accelerate.utils import gather_object  # noqa: E402
from fake_vllm import ScriptedServerClient  # noqa: E402
from train_testkit import ScriptedJudge  # noqa: E402
from trl.generation.vllm_generation import VLLMGeneration  # noqa: E402
from trl.trainer.utils import shutdown_event_loop_in_daemon, start_event_loop_in_daemon  # noqa: E402

from balcaprl.recipe import ModelConfig  # noqa: E402
from balcaprl.train.early_judge import EarlyJudge  # noqa: E402
from balcaprl.train.judge_overlap import TrlJudgeOverlap  # noqa: E402
from balcaprl.train.modeling import load_processor  # noqa: E402
from balcaprl.train.rewards import SharedVerdictScorer  # noqa: E402

IMAGE_TOKENS = 4  # the tiny policy's image-token run for a 56 px image
CASES = {  # rows a process holds, rollouts per prompt
    "whole_groups": (4, 2),  # each process holds whole groups
    "split_groups": (2, 4),  # one prompt's group on both processes: one response holds both's rollouts
}
REFERENCE = "a red circle on the left ."


def run(case: str, mode: str, policy: Path, state: PartialState) -> dict:
    size, n = CASES[case]
    rank = state.process_index
    processor = load_processor(ModelConfig(path=str(policy)))
    tokenizer = processor.tokenizer
    words = [i for i in range(len(tokenizer)) if i not in tokenizer.all_special_ids and i > 0]
    image = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    # This process's rows, in TRL's order: rollouts of one prompt side by side (RepeatSampler).
    first = rank * size
    rows = [{"id": f"p{g // n}", "image_path": f"/img/{g // n}.png", "reference": REFERENCE,
             "reference_tokens": len(REFERENCE.split()), "prompt": [{"role": "user", "content": "describe"}]}
            for g in range(first, first + size)]  # fmt: skip
    prompt_ids = [[g // n, *[image] * IMAGE_TOKENS, 7] for g in range(first, first + size)]
    all_prompts = state.num_processes * size // n

    thread, loop, ready = start_event_loop_in_daemon(name=f"rewards-{rank}")
    ready.wait()
    judge = ScriptedJudge(fail_every=3, check_images=False)
    scorer = SharedVerdictScorer(judge, image_column="image_path")
    generation = VLLMGeneration.__new__(VLLMGeneration)  # TRL's generation, its server connection scripted
    generation.__dict__.update(
        accelerator=state, processing_class=processor, mode="server", enable_sleep_mode=False,
        temperature=1.0, top_p=1.0, top_k=0, min_p=0.0, repetition_penalty=1.0, max_completion_length=8,
        logprobs=0, structured_outputs_regex=None, generation_kwargs={},
    )  # fmt: skip
    if state.is_main_process:
        generation.vllm_client = ScriptedServerClient(all_prompts, words, IMAGE_TOKENS)
    trainer = SimpleNamespace(
        async_loop=loop, scorer=scorer, accelerator=state, use_vllm=True, vllm_mode="server",
        vllm_generation=generation, num_generations=n, processing_class=processor,
    )  # fmt: skip
    overlap = TrlJudgeOverlap(trainer, mode)
    submitted: dict[str, float] = {}  # "process/index" -> when its call was handed to the early judge
    if isinstance(scorer.judge, EarlyJudge):
        early = scorer.judge
        start_rollouts, start_held = early.start_rollouts, early.start_held

        def own(by_index):
            submitted.update({f"{rank}/{i}": time.monotonic() for i in by_index})
            return start_rollouts(by_index)

        def held(by_place):
            submitted.update({f"{p}/{i}": time.monotonic() for p, i in by_place})
            return start_held(by_place)

        early.start_rollouts, early.start_held = own, held

    # The trainer's step, in its order: the rows, generation watched, TRL's decode, the rewards.
    overlap.begin_batch(rows)
    with overlap.watching([row["prompt"] for row in rows]):
        _, completion_ids, _, _ = generation.generate(
            prompt_ids, [[f"image {g // n}"] for g in range(first, first + size)], n
        )
    returned = time.monotonic()
    completions = [[{"role": "assistant", "content": text}]
                   for text in processor.batch_decode(completion_ids, skip_special_tokens=True)]  # fmt: skip
    overlap.settle(completions)
    asked = time.perf_counter()
    overlap.share_verdicts()
    columns = {key: [row[key] for row in rows] for key in rows[0] if key != "prompt"}
    batch = asyncio.run_coroutine_threadsafe(
        scorer.score(completions, completion_ids, **columns), loop
    ).result()
    metrics = overlap.stage_metrics(asked)
    overlap.begin_batch(None)
    shutdown_event_loop_in_daemon(thread, loop)
    return {
        "captions": [r.caption for r in batch.rollouts],
        "rewards": [
            [None if math.isnan(v) else v for v in (r.precision, r.recall, r.linguistic)]
            for r in batch.rollouts
        ],  # fmt: skip
        "judged_here": [r.caption for r in judge.requests],
        "usage": batch.usage,
        "submitted": submitted,
        "returned": returned,
        "returned_everywhere": gather_object([returned]),
        "metrics": metrics,
        "mismatched": getattr(scorer.judge, "mismatched", 0),
    }


def main(policy: Path, out: Path) -> None:
    state = PartialState(cpu=True)  # gloo on CPU
    for case in CASES:
        for mode in ("per_rollout", "off"):
            record = run(case, mode, policy, state)
            folder = out / case / mode
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"rank{state.process_index}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
