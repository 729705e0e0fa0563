"""A measured training step on one GPU: `balcaprl train` on a randomly initialised Qwen2.5-VL-3B.

What it does, in order (nothing is downloaded; the GPU machine needs no internet):

1. builds the Qwen2.5-VL-3B architecture from its public config's numbers, written out here and in
   ``balcaprl.train.memory_plan.KNOWN_MODELS`` (no hub), random weights in bf16 (fp32 in the CPU smoke run), with a word-level
   tokenizer over the same 151,936 ids (Qwen's special tokens at Qwen's ids) and a Qwen2.5-VL image
   processor; saves it as a checkpoint folder;
2. writes a dataset in balcaprl's format: synthetic 1280 x 960 images (above ``max_pixels``, so the
   rollout image grid is exercised) with references made of the tokenizer's words;
3. starts the loopback judge (``balcaprl.testing``: the scripted judge behind an OpenAI-compatible
   server, its own process) answering every call after 1 s; the judge client runs with concurrency 128;
4. takes ``--prompts N`` prompts per batch, or else the largest batch the memory plan
   (``balcaprl train --plan``) fits on this GPU, and records the plan's predicted peak; the paper
   recipe's 8 rollouts and 1,024-token caption cap, transformers generation (vLLM is not on the
   machine), one optimizer update per generation batch so every step holds all three phases;
5. runs ``balcaprl train RECIPE --judge JUDGE`` in this process (the command's own code path) for 3
   optimizer steps, timing each step's generation, judge and update; records peak GPU memory, generated
   tokens per second, and checks each step's advantages against ``balcaprl.c_gdpo_advantages`` on the
   rewards the judge returned;
6. writes the figures, the recipe and the exact command to ``benchmarks/results/`` (``--out``).

    python benchmarks/gpu_step.py --prompts 4     # one GPU: 32 captions a step, 7 minutes on an H100
    python benchmarks/gpu_step.py --tiny --out /tmp/gpu-step   # a 2-layer model on CPU: does it run?

The update time is the step's wall time less generation and scoring (judge, old log-probs,
advantages); with a random model every caption runs to the 1,024-token cap (the worst case for
generation). Without vLLM a step grows with the batch (on an H100, 32 captions: about 100 s; 128
captions: 312 s), so the plan's largest batch (hundreds of captions) does not fit one 10-minute run.
Not a timed test: figures, and the plan's predicted peak next to the measured one.
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import os
import platform
import random
import shlex
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results"
PAPER_RECIPE = ROOT / "configs" / "qwen2_5_vl_3b.yaml"
MODEL_ID = "Qwen/Qwen2.5-VL-3B-Instruct"

# Qwen2.5's special tokens at their ids in the real tokenizer.
SPECIAL_IDS = {
    "<|endoftext|>": 151643,
    "<|im_start|>": 151644,
    "<|im_end|>": 151645,
    "<|vision_start|>": 151652,
    "<|vision_end|>": 151653,
    "<|image_pad|>": 151655,
    "<|video_pad|>": 151656,
}
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }} "
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|> {% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant {% endif %}"
)
# The public config's fields beyond the shapes the memory plan reads.
QWEN_3B_EXTRA = {
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 128000,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [16, 24, 24]},
}
QWEN_3B_VISION_EXTRA = {"window_size": 112, "fullatt_block_indexes": [7, 15, 23, 31], "hidden_act": "silu"}


# ------------------------------------------------------------------------------------- the model


def architecture(tiny: bool) -> dict:
    """Text and vision config of Qwen2.5-VL-3B (``tiny``: 2 layers, width 64, for a CPU smoke run)."""
    from balcaprl.train.memory_plan import KNOWN_MODELS

    config, _ = KNOWN_MODELS[MODEL_ID]
    text = {k: v for k, v in config.items() if k not in ("model_type", "vision_config")} | QWEN_3B_EXTRA
    vision = config["vision_config"] | QWEN_3B_VISION_EXTRA
    if tiny:
        text |= {
            "vocab_size": 1024,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "max_position_embeddings": 4096,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [8, 4, 4]},
        }
        vision |= {
            "depth": 2,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 2,
            "out_hidden_size": 64,
            "fullatt_block_indexes": [1],
        }
    return {"text": text, "vision": vision}


def build_policy(folder: Path, tiny: bool, device: str) -> dict:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import (
        GenerationConfig,
        PreTrainedTokenizerFast,
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2_5_VLProcessor,
    )
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from balcaprl.train.modeling import image_only_processor_class

    arch = architecture(tiny)
    vocab_size = arch["text"]["vocab_size"]
    # Qwen's ids; a tiny vocabulary keeps their order at its top end.
    ids = (
        {token: vocab_size - (151657 - i) for token, i in SPECIAL_IDS.items()} if tiny else dict(SPECIAL_IDS)
    )
    vocab = {f"w{i}": i for i in range(vocab_size) if i not in set(ids.values())}
    vocab.update(ids)
    vocab["[UNK]"] = vocab.pop("w0")  # id 0
    raw = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw, unk_token="[UNK]", eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    tokenizer.add_special_tokens({"additional_special_tokens": list(ids)})
    processor = image_only_processor_class(Qwen2_5_VLProcessor)(
        image_processor=Qwen2VLImageProcessorPil(min_pixels=3136, max_pixels=12845056),
        tokenizer=tokenizer,
        chat_template=CHAT_TEMPLATE,
    )
    text = arch["text"] | {"bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids["<|im_end|>"]}
    text |= {"pad_token_id": ids["<|endoftext|>"]}
    config = Qwen2_5_VLConfig(
        text_config=text,
        vision_config=arch["vision"],
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=text["tie_word_embeddings"],
    )
    # on the top-level config too, where trainers compare them with the tokenizer's
    config.eos_token_id, config.pad_token_id = ids["<|im_end|>"], ids["<|endoftext|>"]
    torch.manual_seed(0)
    with torch.device(device):  # random init where the model runs: a 3B init on CPU takes minutes
        model = Qwen2_5_VLForConditionalGeneration._from_config(
            config, dtype=torch.bfloat16 if device == "cuda" else torch.float32
        )
    model.generation_config = GenerationConfig(
        eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"]
    )
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    params = sum(p.numel() for p in model.parameters())
    del model
    return {"parameters": params, "vocab_size": vocab_size, "layers": arch["text"]["num_hidden_layers"]}


def build_dataset(folder: Path, rows: int, size: tuple[int, int], vocab_size: int) -> Path:
    from PIL import Image

    from balcaprl.data.format import DatasetSample, TokenCounter, write_dataset

    rng = random.Random(0)
    words = [f"w{rng.randrange(1, vocab_size - 20)}" for _ in range(400)]

    def png(i: int) -> bytes:
        image = Image.effect_noise(size, 40 + i % 30).convert("RGB")
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        return buffer.getvalue()

    samples = [
        DatasetSample(
            id=f"scene-{i:05d}",
            image=png(i),
            prompt="describe the image",
            reference=" . ".join(" ".join(rng.choices(words, k=6)) for _ in range(8)) + " .",
            source="gpu-step",
        )
        for i in range(rows + 1)
    ]
    counter = TokenCounter(name="words", count=lambda texts: [len(t.split()) for t in texts])
    return write_dataset(folder, samples[:rows], samples[rows:], name="gpu-step", token_counter=counter)


# ------------------------------------------------------------------------------------- the judge


_SERVER = (
    "import sys; from balcaprl.testing.judge_server import serve_forever; "
    "from balcaprl.testing.scripted_judge import ScriptedJudge; "
    "serve_forever(ScriptedJudge(latency_s=float(sys.argv[1])), on_ready=lambda url: print(url, flush=True))"
)


@contextmanager
def loopback_judge(latency_s: float):
    process = subprocess.Popen(
        [sys.executable, "-c", _SERVER, str(latency_s)], stdout=subprocess.PIPE, text=True
    )
    try:
        line = process.stdout.readline() if process.stdout else ""
        if "http://" not in line:
            raise RuntimeError(f"the judge server did not start (printed {line!r})")
        yield line.split()[-1]
    finally:
        process.terminate()
        process.wait(timeout=30)


# ------------------------------------------------------------------------------- the measurement


class StepClock:
    """Times each optimizer step's phases by wrapping the trainer's own methods for the run."""

    def __init__(self, weights, eps):
        self.weights, self.eps = list(weights), eps
        self.phase: dict[str, float] = defaultdict(float)
        self.steps: list[dict] = []
        self._step_start = 0.0

    def _sync(self):
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()

    @contextmanager
    def installed(self):
        from transformers import TrainerCallback

        from balcaprl.train.trl_backend import BalancedGRPOTrainer

        clock = self
        originals = {
            name: getattr(BalancedGRPOTrainer, name)
            for name in ("_generate_single_turn", "_calculate_rewards", "_generate_and_score_completions")
        }

        def timed(name, bucket):
            original = originals[name]

            def wrapper(trainer, *args, **kwargs):
                clock._sync()
                start = time.perf_counter()
                try:
                    result = original(trainer, *args, **kwargs)
                finally:
                    clock._sync()
                    clock.phase[bucket] += time.perf_counter() - start
                if name == "_generate_and_score_completions":
                    clock._check_advantages(trainer, args[0], result)
                return result

            return wrapper

        BalancedGRPOTrainer._generate_single_turn = timed("_generate_single_turn", "generation_s")
        BalancedGRPOTrainer._calculate_rewards = timed("_calculate_rewards", "judge_s")
        BalancedGRPOTrainer._generate_and_score_completions = timed(
            "_generate_and_score_completions", "scoring_s"
        )

        class Callback(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                import torch

                clock._sync()
                if torch.cuda.is_available():
                    torch.cuda.reset_peak_memory_stats()
                clock._step_start = time.perf_counter()

            def on_step_end(self, args, state, control, **kwargs):
                clock._sync()
                clock._close_step(state.global_step, time.perf_counter() - clock._step_start)
                control.should_save = (
                    False  # no checkpoint (the Trainer saves at the end): not part of a step
                )
                return control

        try:
            yield Callback()
        finally:
            for name, method in originals.items():
                setattr(BalancedGRPOTrainer, name, method)

    def _check_advantages(self, trainer, inputs, output):
        from balcaprl import c_gdpo_advantages
        from balcaprl.train.advantages import group_index_from_ids

        rewards = trainer._gathered_rewards.detach().float().cpu()
        groups = group_index_from_ids([row["id"] for row in inputs])
        expected = c_gdpo_advantages(rewards, groups, self.weights, eps=self.eps)
        used = output["advantages"].detach().float().cpu()
        self.phase["advantages_max_abs_diff"] = float((used - expected).abs().max())
        self.phase["generated_tokens"] = float(output["completion_mask"].sum())
        self.phase["captions"] = float(len(inputs))

    def _close_step(self, step: int, wall: float):
        import torch

        phase = dict(self.phase)
        self.phase.clear()
        generation, judge = phase.get("generation_s", 0.0), phase.get("judge_s", 0.0)
        scoring = phase.get("scoring_s", 0.0)
        record = {
            "step": step,
            "wall_s": wall,
            "generation_s": generation,
            "judge_s": judge,
            "old_logprobs_and_advantages_s": max(scoring - generation - judge, 0.0),
            "update_s": max(wall - scoring, 0.0),
            "captions": int(phase.get("captions", 0)),
            "generated_tokens": int(phase.get("generated_tokens", 0)),
            "generated_tokens_per_s": phase.get("generated_tokens", 0.0) / generation if generation else None,
            "advantages_max_abs_diff_vs_c_gdpo": phase.get("advantages_max_abs_diff"),
            "peak_gpu_memory_allocated_gib": torch.cuda.max_memory_allocated() / 2**30
            if torch.cuda.is_available()
            else None,
            "peak_gpu_memory_reserved_gib": torch.cuda.max_memory_reserved() / 2**30
            if torch.cuda.is_available()
            else None,
        }
        self.steps.append(record)
        print(
            f"step {step}: {wall:.1f} s = generation {generation:.1f} + judge {judge:.1f} + "
            f"log-probs/advantages {record['old_logprobs_and_advantages_s']:.1f} + update {record['update_s']:.1f}; "
            f"{record['generated_tokens']} tokens"
            + (
                f", peak {record['peak_gpu_memory_allocated_gib']:.1f} GiB"
                if torch.cuda.is_available()
                else ""
            ),
            flush=True,
        )


# -------------------------------------------------------------------------------------- the run


def predicted_peak_gib(
    recipe_overrides: list[str], base: Path, gpu_gib: float, prompts: int, micro: int
) -> float:
    """The memory plan's (``balcaprl train --plan``) peak for one GPU at this batch."""
    from balcaprl.recipe import load_recipe
    from balcaprl.train.memory_plan import Launcher, plan_memory

    recipe = load_recipe(
        base,
        [*recipe_overrides, f"train.prompts_per_batch={prompts}", f"train.per_device_batch_size={micro}"],
    )
    return plan_memory(recipe, Launcher("single", 1, description="one GPU"), gpu_gib).peak / 2**30


def choose_batch(recipe_overrides: list[str], base: Path, gpu_gib: float, cap: int) -> tuple[int, int, float]:
    """The largest prompts_per_batch (a power of two, at most ``cap``) whose plan fits 90% of the GPU."""
    prompts = cap
    while prompts >= 1:
        micro = min(8, prompts * 8)
        peak = predicted_peak_gib(recipe_overrides, base, gpu_gib, prompts, micro)
        if peak <= 0.9 * gpu_gib:
            return prompts, micro, peak
        prompts //= 2
    raise SystemExit(f"not even one prompt fits {gpu_gib:g} GiB by the memory plan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--tiny", action="store_true", help="a 2-layer model with short captions (CPU smoke run)"
    )
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps (default 3)")
    parser.add_argument("--prompts", type=int, help="prompts per batch (default: the largest the plan fits)")
    parser.add_argument("--latency", type=float, default=1.0, help="the judge's answer latency, seconds")
    parser.add_argument("--concurrency", type=int, default=128, help="judge calls in flight")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where the figures go")
    parser.add_argument("--work", type=Path, help="working folder (default: a temporary one)")
    args = parser.parse_args(argv)

    import torch
    import transformers
    import trl
    import yaml

    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    if not cuda and not args.tiny:
        print("no GPU here: run with --tiny for a CPU smoke run", file=sys.stderr)
        return 2
    gpu_name = torch.cuda.get_device_name(0) if cuda else "cpu"
    gpu_gib = torch.cuda.get_device_properties(0).total_memory / 2**30 if cuda else 16.0
    command = " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv])

    with tempfile.TemporaryDirectory(prefix="balcaprl-gpu-step-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        caption_tokens = 16 if args.tiny else 1024
        max_pixels = 56 * 56 * 4 if args.tiny else 1003520
        overrides = [
            f"model.path={work / 'policy'}",
            f"data.path={work / 'data'}",
            f"run.output_dir={work / 'run'}",
            # bf16 on the GPU; on a CPU (the smoke run) fp32, which CPUs without bf16 units run far faster
            f"model.dtype={'bfloat16' if cuda else 'float32'}",
            f"train.precision={'bf16' if cuda else 'fp32'}",
            f"model.image.max_pixels={max_pixels}",
            "rollout.vllm.mode=off",  # vLLM's wheel is not on the GPU machine: transformers generation
            f"rollout.max_caption_tokens={caption_tokens}",
            "train.updates_per_batch=1",  # every step: generation, judge and update
            f"train.max_steps={args.steps}",
            f"train.use_cpu={str(not cuda).lower()}",
            "run.save_steps=100000",
            "run.save_final_model=false",
            "run.report_to=[]",
            "run.log_rollouts_every=0",
            "run.progress=false",
        ]
        t0 = time.perf_counter()
        model_info = build_policy(work / "policy", args.tiny, device)
        build_s = time.perf_counter() - t0
        if args.prompts:
            prompts, micro = args.prompts, min(8, args.prompts * 8)
            predicted = predicted_peak_gib(overrides, PAPER_RECIPE, gpu_gib, prompts, micro) if cuda else None
        elif args.tiny:
            prompts, micro, predicted = 1, 8, None
        else:
            prompts, micro, predicted = choose_batch(overrides, PAPER_RECIPE, gpu_gib, 256)
        overrides += [f"train.prompts_per_batch={prompts}", f"train.per_device_batch_size={micro}"]
        build_dataset(
            work / "data",
            prompts * args.steps,
            (1280, 960) if not args.tiny else (300, 200),
            model_info["vocab_size"],
        )
        recipe_file = work / "recipe.yaml"
        recipe_file.write_text(
            yaml.safe_dump({"base": str(PAPER_RECIPE)}) + "".join(f"# {o}\n" for o in overrides)
        )

        from balcaprl.cli import app
        from balcaprl.recipe import load_recipe

        recipe = load_recipe(PAPER_RECIPE, overrides)
        clock = StepClock(recipe.rewards.weights.as_list(), recipe.advantage.eps)
        with loopback_judge(args.latency) as base_url:
            judge_file = work / "judge.yaml"
            judge_file.write_text(
                yaml.safe_dump(
                    {
                        "base_url": base_url,
                        "model": "scripted",
                        "api_key_env": None,
                        "concurrency": args.concurrency,
                        "timeout_s": 120,
                        "max_retries": 0,
                        "cache_path": None,
                    }  # fmt: skip
                )
            )
            argv_train = ["train", str(PAPER_RECIPE), *overrides, "--judge", str(judge_file)]
            with clock.installed() as callback:
                import balcaprl.train.trl_backend as trl_backend

                original_build = trl_backend.build_trainer

                def build_with_clock(*a, **k):
                    k["callbacks"] = [*k.get("callbacks", ()), callback]
                    return original_build(*a, **k)

                trl_backend.build_trainer = build_with_clock
                try:
                    start = time.perf_counter()
                    app(argv_train, standalone_mode=False)  # `balcaprl train RECIPE OVERRIDES --judge JUDGE`
                    run_s = time.perf_counter() - start
                finally:
                    trl_backend.build_trainer = original_build

    figures = {
        "command": command,
        "train_command": "balcaprl "
        + " ".join(shlex.quote(a) for a in argv_train[:2])
        + " "
        + " ".join(shlex.quote(o) for o in overrides)
        + " --judge JUDGE.yaml",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "device": gpu_name,
        "gpu_memory_gib": gpu_gib if cuda else None,
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "transformers": transformers.__version__,
            "trl": trl.__version__,
        },
        "model": {
            "architecture": MODEL_ID + (" (tiny: 2 layers, width 64)" if args.tiny else ""),
            **model_info,
            "dtype": recipe.model.dtype,
            "precision": recipe.train.precision,
            "init": "random, seed 0",
            "build_s": build_s,
        },  # fmt: skip
        "batch": {
            "prompts": prompts,
            "rollouts_per_prompt": recipe.rollout.rollouts_per_prompt,
            "per_device_batch_size": micro,
            "max_caption_tokens": caption_tokens,
            "max_pixels": max_pixels,
            "generation": "transformers generate (vLLM off)",
        },  # fmt: skip
        "judge": {
            "latency_s": args.latency,
            "concurrency": args.concurrency,
            "server": "balcaprl.testing loopback",
        },
        "plan_predicted_peak_gib": predicted,
        "run_s": run_s,
        "steps": clock.steps,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    slug = "tiny-cpu" if args.tiny and not cuda else gpu_name.lower().replace(" ", "-")
    target = args.out / f"gpu_step.{slug}.json"
    target.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"wrote {target}")
    worst = max((s["advantages_max_abs_diff_vs_c_gdpo"] or 0.0) for s in clock.steps) if clock.steps else None
    if len(clock.steps) != args.steps or worst is None or worst > 1e-5:
        print(
            f"FAILED: {len(clock.steps)} steps recorded, advantages differ from c_gdpo_advantages by {worst}"
        )
        return 1
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
