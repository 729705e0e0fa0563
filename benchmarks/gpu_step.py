"""A measured training step on one GPU: `balcaprl train` on a randomly initialised Qwen2.5-VL-3B.

What it does, in order (nothing is downloaded; the GPU machine needs no internet):

1. builds the Qwen2.5-VL-3B architecture from its public config's numbers, written out here and in
   ``balcaprl.plan.memory.KNOWN_MODELS`` (no hub), random weights in bf16 (fp32 in the CPU smoke run), with a word-level
   tokenizer over the same 151,936 ids (Qwen's special tokens at Qwen's ids) and a Qwen2.5-VL image
   processor; saves it as a checkpoint folder;
2. writes a dataset in balcaprl's format: synthetic 1280 x 960 images (above ``max_pixels``, so the
   rollout image grid is exercised) with references made of the tokenizer's words;
3. starts the loopback judge (``balcaprl.testing``: the scripted judge behind an OpenAI-compatible
   server, its own process) answering every call after 1 s; the judge client runs with concurrency 128;
4. takes ``--prompts N`` prompts per batch, or else the largest batch the memory plan
   (``balcaprl train --plan``) fits on this GPU, and records the plan's predicted peak; the paper
   recipe's 8 rollouts, 1,024-token caption cap and 4 optimizer updates per generation batch
   (``--updates-per-batch``), transformers generation (vLLM is not on the machine);
5. runs ``balcaprl train RECIPE --judge JUDGE`` in this process (the command's own code path) once per
   variant (``--variants``): ``before`` (transformers' per-window vision attention, every decoder layer
   recomputed) and ``after`` (``model.vision_attention=varlen_sdpa`` and the memory plan's
   ``model.layers_without_recompute``), one generation batch each (``--steps``, default the updates of
   one batch), timing each step's generation, judge and update; records peak GPU memory, generated
   tokens per second, the update's model FLOPs and MFU (``--peak-tflops``; H100/H200 bf16 dense:
   989.4), and checks each step's advantages against ``balcaprl.c_gdpo_advantages`` on the rewards the
   judge returned;
6. profiles the last update of each variant with ``torch.profiler``: the device-busy share of its wall
   time, the top kernels, and the count and time of attention calls in the vision tower and in the
   language model (told apart by head size);
7. writes the figures, the recipe and the exact command to ``benchmarks/results/`` (``--out``).

    python benchmarks/gpu_step.py --prompts 4     # one GPU: before and after, about 6 minutes on an H100
    python benchmarks/gpu_step.py --tiny --out /tmp/gpu-step   # a 2-layer model on CPU: does it run?

MFU counts model FLOPs only (forward and backward, 3 passes; a recomputed layer's forward is not
counted): 2 x parameters per token for the language model's layers over every real prompt and caption
token, the LM head over the caption tokens (TRL computes log-probs only there), the vision blocks'
parameters over its patches and the merger's over the merged patches, causal attention scores
(2 x layers x hidden x length per token) and the vision tower's (windows of 64 patches, whole images in
its 4 full-attention layers). ``--variants before,after,padded`` adds ``after`` on padded rows.
Each variant records the memory plan of what it runs (its kept layers, packed or padded rows) beside
its measured peak. ``--lengths FILE`` (``[[prompt, caption], ...]`` token counts, written from a
prepared dataset by ``python -m balcaprl.plan.token_share``) sizes the images so the prompts follow
that mix. A random model's captions all run to the cap; the ``mix`` variant (``after``'s settings, run
by default beside it) cuts each generated caption to a length drawn from the mix's caption lengths
(seeded; the file's, else the shipped stand-in mix ``STAND_IN_CAPTION_MIX``), so its update sees the
padding and the token count of real data, while ``after`` measures the all-at-the-cap batch. The
loopback judge needs the ``[serve]`` extra.

The update time is the step's wall time less generation and scoring (judge, old log-probs,
advantages); with 4 updates per batch only a batch's first step generates and judges. With a random
model every caption runs to the 1,024-token cap (the worst case for generation). Without vLLM a step grows with the batch (on an H100, 32 captions: about 100 s; 128
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
    from balcaprl.plan.memory import KNOWN_MODELS

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
    groups = {"language_model_layers": 0, "vision_tower": 0, "vision_blocks": 0, "vision_merger": 0}
    for name, parameter in model.named_parameters():
        if ".language_model.layers." in name:
            groups["language_model_layers"] += parameter.numel()
        elif ".visual." in name or name.startswith("visual."):
            groups["vision_tower"] += parameter.numel()
            groups["vision_merger" if ".merger." in name else "vision_blocks"] += parameter.numel()
    del model
    return {
        "parameters": params,
        "vocab_size": vocab_size,
        "layers": arch["text"]["num_hidden_layers"],
        "hidden_size": arch["text"]["hidden_size"],
        "parameters_by_part": groups,
        "vision_layers": arch["vision"]["depth"],
        "vision_full_attention_layers": len(arch["vision"]["fullatt_block_indexes"]),
        "vision_hidden_size": arch["vision"]["hidden_size"],
        "vision_head_dim": arch["vision"]["hidden_size"] // arch["vision"]["num_heads"],
        "text_head_dim": arch["text"]["hidden_size"] // arch["text"]["num_attention_heads"],
    }


PEAK_BF16_TFLOPS = {"H100": 989.4, "H200": 989.4}  # dense bf16, SXM (NVIDIA's data sheets)


def peak_tflops(gpu_name: str) -> float | None:
    return next((value for key, value in PEAK_BF16_TFLOPS.items() if key in gpu_name), None)


def batch_flops(model_info: dict, lengths: list[int], completion_tokens: int, patches: int) -> float:
    """Model FLOPs of one forward and backward over a generation batch (module docstring)."""
    layers, hidden = model_info["layers"], model_info["hidden_size"]
    parts = model_info["parameters_by_part"]
    tokens = sum(lengths)
    forward = 2 * parts["language_model_layers"] * tokens
    forward += 2 * model_info["vocab_size"] * hidden * completion_tokens  # the LM head, caption tokens
    forward += 2 * parts["vision_blocks"] * patches
    forward += 2 * parts["vision_merger"] * patches // 4  # the merger runs on 2 x 2 merged patches
    forward += sum(2 * layers * hidden * n * n for n in lengths)  # causal attention scores and values
    forward += vision_attention_flops(model_info, patches, images=len(lengths))
    return 3.0 * forward


def vision_attention_flops(model_info: dict, patches: int, images: int) -> float:
    """Forward FLOPs of the vision tower's attention scores and values: 4 x hidden x (keys a query sees)
    per patch and layer; windows of at most 64 patches (112 px) in all layers but the full-attention
    ones (whole image)."""
    hidden, depth = model_info["vision_hidden_size"], model_info["vision_layers"]
    full = model_info.get("vision_full_attention_layers", 4)
    per_image = patches / max(1, images)
    return 4 * hidden * patches * ((depth - full) * min(64, per_image) + full * per_image)


def build_dataset(
    folder: Path, rows: int, size: tuple[int, int] | list[tuple[int, int]], vocab_size: int
) -> Path:
    """``rows`` training samples (and one for evaluation) with random images of ``size`` (or of each
    size in turn) and references of the tokenizer's words."""
    from PIL import Image

    from balcaprl.data.format import DatasetSample, TokenCounter, write_dataset

    rng = random.Random(0)
    words = [f"w{rng.randrange(1, vocab_size - 20)}" for _ in range(400)]

    def png(i: int) -> bytes:
        shape = size[i % len(size)] if isinstance(size, list) else size
        image = Image.effect_noise(shape, 40 + i % 30).convert("RGB")
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


# Caption lengths (tokens) for the ``mix`` variant when no ``--lengths`` file is given: the 1,024-token
# cap's realistic spread is unknown without prepared data, so a stand-in that the docs call one: most
# captions between a third and two thirds of the cap, a few at it (scaled to the tiny run's cap).
STAND_IN_CAPTION_MIX = (300, 380, 450, 520, 600, 680, 760, 1024)


def cut_to_mix(completion_ids, logprobs, lengths, eos_id: int, seed: int = 0):
    """Each caption cut to a length drawn (seeded) from ``lengths``, ending in ``eos_id`` as a caption
    the policy finished there would; a caption already shorter is kept. ``logprobs`` (vLLM's, or None)
    are cut alike."""
    rng = random.Random(seed)
    cut_ids, cut_logprobs = [], None if logprobs is None else []
    for i, ids in enumerate(completion_ids):
        n = max(1, rng.choice(lengths))
        ids = list(ids)
        if len(ids) > n:
            ids = [*ids[: n - 1], eos_id]
        cut_ids.append(ids)
        if cut_logprobs is not None:
            cut_logprobs.append(list(logprobs[i])[: len(ids)])
    return cut_ids, cut_logprobs


class StepClock:
    """Times each optimizer step's phases by wrapping the trainer's own methods for the run."""

    def __init__(
        self,
        weights,
        eps,
        model_info=None,
        updates_per_batch=1,
        profile_step=None,
        peak=None,
        caption_mix=None,
    ):
        self.caption_mix = caption_mix  # lengths the captions are cut to (the ``mix`` variant), or None
        self._batches_cut = 0
        self.weights, self.eps = list(weights), eps
        self.phase: dict[str, float] = defaultdict(float)
        self.steps: list[dict] = []
        self._step_start = 0.0
        self.model_info, self.updates_per_batch = model_info, updates_per_batch
        self.profile_step, self.peak_tflops = profile_step, peak
        self.batch_flops: float | None = None  # of the latest generation batch, forward and backward
        self.profile: dict | None = None
        self._profiler = None

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
                if name == "_generate_single_turn" and clock.caption_mix:
                    # generation is timed at the cap; what follows (judge, update) sees the mix
                    clock._batches_cut += 1
                    result = cut_to_mix(
                        *result, clock.caption_mix, trainer.eos_token_ids[0], clock._batches_cut
                    )
                if name == "_generate_and_score_completions":
                    clock._check_advantages(trainer, args[0], result)
                return result

            return wrapper

        BalancedGRPOTrainer._generate_single_turn = timed("_generate_single_turn", "generation_s")
        # the judge wait left when TRL asks for the rewards (its calls may have started with the captions)
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
                if state.global_step + 1 == clock.profile_step:
                    clock._start_profiler()
                clock._step_start = time.perf_counter()

            def on_step_end(self, args, state, control, **kwargs):
                clock._sync()
                wall = time.perf_counter() - clock._step_start
                if clock._profiler is not None:
                    clock._stop_profiler(state.global_step, wall)
                clock._close_step(state.global_step, wall)
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
        if self.model_info is not None:
            lengths = (output["prompt_mask"].sum(1) + output["completion_mask"].sum(1)).tolist()
            grid = output.get("image_grid_thw")
            patches = int(grid.prod(-1).sum()) if grid is not None else 0
            self.batch_flops = batch_flops(
                self.model_info, [int(n) for n in lengths], int(output["completion_mask"].sum()), patches
            )

    def _start_profiler(self):
        import torch
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        self._profiler = profile(activities=activities, record_shapes=True)
        self._profiler.__enter__()

    def _stop_profiler(self, step: int, wall: float):
        profiler, self._profiler = self._profiler, None
        profiler.__exit__(None, None, None)
        self.profile = profile_summary(profiler, step, wall, self.model_info)

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
            "profiled": step == self.profile_step,
            "peak_gpu_memory_allocated_gib": torch.cuda.max_memory_allocated() / 2**30
            if torch.cuda.is_available()
            else None,
            "peak_gpu_memory_reserved_gib": torch.cuda.max_memory_reserved() / 2**30
            if torch.cuda.is_available()
            else None,
        }
        if self.batch_flops is not None:
            flops = self.batch_flops / self.updates_per_batch  # one optimizer step: a mini-batch of the batch
            record["update_model_tflop"] = flops / 1e12
            record["update_tflops_per_s"] = flops / 1e12 / record["update_s"] if record["update_s"] else None
            record["update_mfu"] = (
                record["update_tflops_per_s"] / self.peak_tflops
                if self.peak_tflops and record["update_tflops_per_s"]
                else None
            )
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


def _device_time(event) -> float:
    """Microseconds of device (kernel) time an event itself spent (names differ across torch versions)."""
    for name in ("self_device_time_total", "self_cuda_time_total"):
        if hasattr(event, name):
            return float(getattr(event, name))
    return 0.0


def profile_summary(profiler, step: int, wall: float, model_info: dict | None, top: int = 10) -> dict:
    """Device-busy share, top kernels (top ops on a CPU), and attention calls by tower."""
    import torch

    on_gpu = torch.cuda.is_available()
    events = profiler.key_averages()
    busy_us = sum(_device_time(e) for e in events) if on_gpu else None
    ranked = sorted(events, key=(lambda e: _device_time(e)) if on_gpu else (lambda e: e.self_cpu_time_total))
    ranked = [e for e in reversed(ranked) if (_device_time(e) if on_gpu else e.self_cpu_time_total) > 0][:top]
    heads = {
        "vision": (model_info or {}).get("vision_head_dim"),
        "text": (model_info or {}).get("text_head_dim"),
    }
    attention = {
        "vision": {"calls": 0, "time_ms": 0.0},
        "text": {"calls": 0, "time_ms": 0.0},
        "other": {"calls": 0, "time_ms": 0.0},
    }
    for event in profiler.key_averages(group_by_input_shape=True):
        if event.key != "aten::scaled_dot_product_attention":
            continue
        shapes = event.input_shapes or [[]]
        head_dim = shapes[0][-1] if shapes and shapes[0] else None
        tower = next((name for name, dim in heads.items() if dim is not None and dim == head_dim), "other")
        attention[tower]["calls"] += event.count
        inclusive = (event.device_time_total if on_gpu else event.cpu_time_total) / 1e3
        attention[tower]["time_ms"] += inclusive
    return {
        "step": step,
        "wall_s": wall,
        "device_busy_share": busy_us / 1e6 / wall if busy_us is not None and wall else None,
        "top": [
            {
                "name": e.key,
                "calls": e.count,
                "time_ms": (_device_time(e) if on_gpu else e.self_cpu_time_total) / 1e3,
            }
            for e in ranked
        ],
        "timed_on": "device (kernels)" if on_gpu else "cpu (ops)",
        "attention_calls": attention,
    }


# -------------------------------------------------------------------------------------- the run


def predicted_peak_gib(
    recipe_overrides: list[str], base: Path, gpu_gib: float, prompts: int, micro: int
) -> float:
    """The memory plan's (``balcaprl train --plan``) peak for one GPU at this batch."""
    return _plan(recipe_overrides, base, gpu_gib, prompts, micro).peak / 2**30


def _plan(recipe_overrides: list[str], base: Path, gpu_gib: float, prompts: int, micro: int):
    from balcaprl.plan.memory import Launcher, plan_memory
    from balcaprl.recipe import load_recipe

    recipe = load_recipe(
        base,
        [*recipe_overrides, f"train.prompts_per_batch={prompts}", f"train.per_device_batch_size={micro}"],
    )
    return plan_memory(recipe, Launcher("single", 1, description="one GPU"), gpu_gib)


def micro_batch(prompts: int, updates_per_batch: int) -> int:
    """Captions per micro-batch: at most 8, and a divisor of the captions of one update."""
    per_update = prompts * 8 // updates_per_batch
    return max(d for d in range(1, min(8, per_update) + 1) if per_update % d == 0)


def choose_batch(
    recipe_overrides: list[str], base: Path, gpu_gib: float, cap: int, updates_per_batch: int = 1
) -> tuple[int, int, float]:
    """The largest prompts_per_batch (a power of two, at most ``cap``) whose plan fits 90% of the GPU."""
    prompts = cap
    while prompts >= 1:
        if prompts * 8 % updates_per_batch == 0:
            micro = micro_batch(prompts, updates_per_batch)
            peak = predicted_peak_gib(recipe_overrides, base, gpu_gib, prompts, micro)
            if peak <= 0.9 * gpu_gib:
                return prompts, micro, peak
        prompts //= 2
    raise SystemExit(f"not even one prompt fits {gpu_gib:g} GiB by the memory plan")


VARIANTS = ("before", "after", "padded", "mix")  # the default runs before, after and mix


def variant_overrides(name: str, layers_without_recompute: int) -> list[str]:
    """``before``: transformers' per-window vision attention, every layer recomputed, padded rows;
    ``after``: the recipe's settings (the vision windows in one variable-length call per layer, the
    plan's layers kept, packed rows through the variable-length attention); ``padded``: ``after`` on
    padded rows (sdpa with a padding mask); ``mix``: ``after``'s settings, its captions cut to a
    realistic length mix (:func:`cut_to_mix`)."""
    if name == "before":
        return [
            "model.vision_attention=default",
            "model.layers_without_recompute=0",
            "train.padding_free=false",
        ]
    after = [
        "model.vision_attention=varlen_sdpa",
        f"model.layers_without_recompute={layers_without_recompute}",
    ]
    return [*after, f"train.padding_free={str(name != 'padded').lower()}"]


def image_sizes(lengths_file: Path) -> list[tuple[int, int]]:
    """Image sizes (4:3, on the 28-pixel grid) whose image tokens are each prompt's less the template's."""
    sizes = []
    for prompt, _ in json.loads(lengths_file.read_text(encoding="utf-8")):
        tokens = max(4, int(prompt) - 64)
        height = max(2, round((tokens * 3 / 4) ** 0.5))
        sizes.append((28 * max(2, round(tokens / height)), 28 * height))
    return sizes


def missing_serve_extra() -> list[str]:
    """The loopback judge's packages (the ``[serve]`` extra) that are not installed."""
    import importlib.util

    return [name for name in ("fastapi", "uvicorn", "orjson") if importlib.util.find_spec(name) is None]


def run_variant(name, overrides, judge_file, clock_args, work: Path) -> tuple[dict, list[str]]:
    """One `balcaprl train` run in this process, timed and profiled; its figures and its command."""
    import gc

    import torch

    from balcaprl.cli import app
    from balcaprl.recipe import load_recipe

    overrides = [*overrides, f"run.output_dir={work / f'run-{name}'}"]
    recipe = load_recipe(PAPER_RECIPE, overrides)
    clock = StepClock(recipe.rewards.weights.as_list(), recipe.advantage.eps, **clock_args)
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
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    timed = [s for s in clock.steps if not s["profiled"] and s.get("update_mfu") is not None]
    figures = {
        "overrides": [o for o in overrides if o.startswith("model.")],
        "run_s": run_s,
        "steps": clock.steps,
        "update_mfu_mean": sum(s["update_mfu"] for s in timed) / len(timed) if timed else None,
        "update_s_mean": sum(s["update_s"] for s in clock.steps if not s["profiled"])
        / max(1, sum(not s["profiled"] for s in clock.steps)),
        "peak_gpu_memory_allocated_gib": max(
            (s["peak_gpu_memory_allocated_gib"] or 0.0 for s in clock.steps), default=None
        )
        if torch.cuda.is_available()
        else None,
        "profile": clock.profile,
    }
    return figures, argv_train


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--tiny", action="store_true", help="a 2-layer model with short captions (CPU smoke run)"
    )
    parser.add_argument(
        "--updates-per-batch", type=int, default=4, help="optimizer steps per batch (the recipe's 4)"
    )
    parser.add_argument(
        "--steps", type=int, help="optimizer steps per variant (default: one batch's updates)"
    )
    parser.add_argument("--prompts", type=int, help="prompts per batch (default: the largest the plan fits)")
    parser.add_argument(
        "--variants",
        default="before,after,mix",
        help="comma-separated: before, after, padded, mix (default before,after,mix)",
    )
    parser.add_argument(
        "--peak-tflops", type=float, help="the GPU's bf16 dense peak (default: H100/H200 989.4)"
    )
    parser.add_argument("--latency", type=float, default=1.0, help="the judge's answer latency, seconds")
    parser.add_argument("--concurrency", type=int, default=128, help="judge calls in flight")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where the figures go")
    parser.add_argument("--work", type=Path, help="working folder (default: a temporary one)")
    parser.add_argument(
        "--lengths", type=Path, help="[[prompt, caption], ...] token counts: image sizes follow"
    )
    args = parser.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if not variants or any(v not in VARIANTS for v in variants):
        parser.error(f"--variants: choose from {', '.join(VARIANTS)}")
    updates = args.updates_per_batch
    steps = args.steps or updates
    if steps % updates:
        parser.error(f"--steps ({steps}) must be whole batches of --updates-per-batch ({updates})")

    import torch
    import transformers
    import trl
    import yaml

    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    missing = missing_serve_extra()
    if missing:
        print(
            f"the loopback judge needs {', '.join(missing)}: pip install -e '.[trl,serve]' "
            "-c constraints/gpu-one-node.txt (docs/gpu.md, 'A measured step')",
            file=sys.stderr,
        )
        return 2
    if not cuda and not args.tiny:
        print("no GPU here: run with --tiny for a CPU smoke run", file=sys.stderr)
        return 2
    gpu_name = torch.cuda.get_device_name(0) if cuda else "cpu"
    gpu_gib = torch.cuda.get_device_properties(0).total_memory / 2**30 if cuda else 16.0
    peak = args.peak_tflops or (peak_tflops(gpu_name) if cuda else None)
    command = " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv])

    with tempfile.TemporaryDirectory(prefix="balcaprl-gpu-step-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        caption_tokens = 16 if args.tiny else 1024
        max_pixels = 56 * 56 * 4 if args.tiny else 1003520
        overrides = [
            f"model.path={work / 'policy'}",
            f"data.path={work / 'data'}",
            # bf16 on the GPU; on a CPU (the smoke run) fp32, which CPUs without bf16 units run far faster
            f"model.dtype={'bfloat16' if cuda else 'float32'}",
            f"train.precision={'bf16' if cuda else 'fp32'}",
            f"model.image.max_pixels={max_pixels}",
            "rollout.vllm.mode=off",  # vLLM's wheel is not on the GPU machine: transformers generation
            f"rollout.max_caption_tokens={caption_tokens}",
            f"train.updates_per_batch={updates}",  # the recipe's: a batch feeds this many optimizer steps
            f"train.max_steps={steps}",
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
            prompts = args.prompts
            micro = micro_batch(prompts, updates)
            predicted = predicted_peak_gib(overrides, PAPER_RECIPE, gpu_gib, prompts, micro) if cuda else None
        elif args.tiny:
            prompts, predicted = 1, None
            micro = micro_batch(prompts, updates)
        else:
            prompts, micro, predicted = choose_batch(overrides, PAPER_RECIPE, gpu_gib, 256, updates)
        overrides += [f"train.prompts_per_batch={prompts}", f"train.per_device_batch_size={micro}"]
        kept = _plan(overrides, PAPER_RECIPE, gpu_gib, prompts, micro).layers_without_recompute or 0
        build_dataset(
            work / "data",
            prompts * (steps // updates),
            image_sizes(args.lengths) if args.lengths else (1280, 960) if not args.tiny else (300, 200),
            model_info["vocab_size"],
        )
        recipe_file = work / "recipe.yaml"
        recipe_file.write_text(
            yaml.safe_dump({"base": str(PAPER_RECIPE)}) + "".join(f"# {o}\n" for o in overrides)
        )

        from balcaprl.recipe import load_recipe

        recipe = load_recipe(PAPER_RECIPE, [*overrides, f"run.output_dir={work / 'run'}"])
        clock_args = {
            "model_info": model_info,
            "updates_per_batch": updates,
            "profile_step": steps,  # the last update: no generation in it when updates > 1
            "peak": peak,
        }
        cap_mix = [int(c) for _, c in json.loads(args.lengths.read_text())] if args.lengths else None
        scale = caption_tokens / 1024
        caption_mix = (
            [max(2, min(caption_tokens, n)) for n in cap_mix]
            if cap_mix
            else [max(2, round(n * scale)) for n in STAND_IN_CAPTION_MIX]
        )
        results, commands = {}, {}
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
            for name in variants:
                print(f"--- {name}", flush=True)
                extra = [*overrides, *variant_overrides(name, kept)]
                variant_clock = {**clock_args, "caption_mix": caption_mix if name == "mix" else None}
                results[name], argv_train = run_variant(name, extra, judge_file, variant_clock, work)
                if name == "mix":
                    results[name]["caption_mix"] = {
                        "source": str(args.lengths)
                        if args.lengths
                        else "STAND_IN_CAPTION_MIX (an assumption)",
                        "mean_tokens": sum(caption_mix) / len(caption_mix),
                        "cap": caption_tokens,
                    }
                # the plan of what this variant runs (its kept layers, packed or padded rows)
                variant_plan = _plan(extra, PAPER_RECIPE, gpu_gib, prompts, micro)
                results[name]["plan_predicted_peak_gib"] = variant_plan.peak / 2**30 if cuda else None
                results[name]["plan_layers_without_recompute"] = int(
                    variant_overrides(name, kept)[1].split("=")[1]
                )
                measured = results[name]["peak_gpu_memory_allocated_gib"]
                results[name]["peak_over_plan"] = (
                    measured / results[name]["plan_predicted_peak_gib"] if cuda and measured else None
                )
                commands[name] = (
                    "balcaprl " + " ".join(shlex.quote(a) for a in argv_train[:-1]) + " JUDGE.yaml"
                )

    figures = {
        "command": command,
        "train_commands": commands,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "device": gpu_name,
        "gpu_memory_gib": gpu_gib if cuda else None,
        "peak_bf16_tflops": peak,
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
            "gradient_checkpointing": recipe.model.gradient_checkpointing,
            "init": "random, seed 0",
            "build_s": build_s,
        },  # fmt: skip
        "batch": {
            "prompts": prompts,
            "rollouts_per_prompt": recipe.rollout.rollouts_per_prompt,
            "updates_per_batch": updates,
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
        "plan_layers_without_recompute": kept,
        "variants": results,
    }
    for key, (base, other) in {
        "after_vs_before": ("before", "after"),
        "mix_vs_all_at_the_cap": ("after", "mix"),
    }.items():
        if base in results and other in results:
            figures[key] = {
                figure: results[other][f"{figure}_mean"] / results[base][f"{figure}_mean"]
                if results[base][f"{figure}_mean"] and results[other][f"{figure}_mean"] is not None
                else None
                for figure in ("update_s", "update_mfu")
            }
    args.out.mkdir(parents=True, exist_ok=True)
    slug = "tiny-cpu" if args.tiny and not cuda else gpu_name.lower().replace(" ", "-")
    target = args.out / f"gpu_step.{slug}.json"
    target.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"wrote {target}")
    for name, result in results.items():
        mfu = result["update_mfu_mean"]
        print(
            f"{name}: update {result['update_s_mean']:.2f} s per optimizer step"
            + (f", MFU {100 * mfu:.1f}%" if mfu is not None else "")
            + (
                f", device busy {100 * result['profile']['device_busy_share']:.0f}%"
                if result["profile"] and result["profile"]["device_busy_share"] is not None
                else ""
            )
        )
    failures = []
    for name, result in results.items():
        recorded = result["steps"]
        worst = max((s["advantages_max_abs_diff_vs_c_gdpo"] or 0.0) for s in recorded) if recorded else None
        if len(recorded) != steps or worst is None or worst > 1e-5:
            failures.append(f"{name}: {len(recorded)} steps recorded, advantages differ by {worst}")
    if failures:
        print("FAILED: " + "; ".join(failures))
        return 1
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
