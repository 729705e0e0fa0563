"""Builders and helpers of the real-engine slice: a tiny random Qwen2-VL (the other families come from
tests/train/train_testkit.py), vLLM engines started as balcaprl starts them and freed after use, and
the image prompts the trainer would send."""

from __future__ import annotations

import gc
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from train_testkit import (
    CHAT_TEMPLATE,
    SIDE,
    SPECIALS,
    ScriptedJudge,
    qwen_vl_text_config,
    save_tiny_model,
    word_level_tokenizer,
)

from balcaprl.train.rollout_engine import engine_kwargs

# A small KV cache: the tiny models need a few hundred KiB; vLLM's CPU default would take GiBs.
KV_CACHE_BYTES = 64 << 20


def build_tiny_qwen2_vl(out: Path) -> Path:
    """Random-init Qwen2-VL (2 layers, hidden 64, vision depth 2), the test vocabulary, saved to ``out``."""
    from transformers import (
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
        Qwen2VLProcessor,
    )
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from balcaprl.train.modeling import image_only_processor_class

    tokenizer, vocab = word_level_tokenizer(SPECIALS)
    image_processor = Qwen2VLImageProcessorPil(min_pixels=SIDE * SIDE, max_pixels=SIDE * SIDE)
    processor = image_only_processor_class(Qwen2VLProcessor)(
        image_processor=image_processor, tokenizer=tokenizer, chat_template=CHAT_TEMPLATE
    )
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIALS}
    config = Qwen2VLConfig(
        text_config=qwen_vl_text_config(len(vocab), ids),
        vision_config=dict(depth=2, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2),
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
    )
    return save_tiny_model(
        out, Qwen2VLForConditionalGeneration, config, processor, ids["<|im_end|>"], ids["<|endoftext|>"]
    )


class StampedJudge(ScriptedJudge):
    """The scripted judge (no failures), stamping when each request reached it (``time.perf_counter``)."""

    def __init__(self):
        super().__init__(fail_every=None)
        self.arrived: list[float] = []

    async def judge_batch(self, requests):
        self.arrived.extend([time.perf_counter()] * len(requests))
        return await super().judge_batch(requests)


def small_engine_args(**extra: Any) -> dict[str, Any]:
    """What a test engine adds to balcaprl's engine arguments: eager mode, a small cache and context."""
    return {"enforce_eager": True, "kv_cache_memory_bytes": KV_CACHE_BYTES, "max_model_len": 512, **extra}


def free_engine() -> None:
    """Drop what a finished vLLM engine keeps in this process (distributed groups, cached memory)."""
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    gc.collect()
    cleanup_dist_env_and_memory()


@contextmanager
def engine(model: Path, precision: str = "fp32", **extra: Any) -> Iterator[Any]:
    """vLLM's ``LLM`` for ``model`` with balcaprl's engine arguments (rollout_engine.engine_kwargs)."""
    from vllm import LLM

    model_type = json.loads((model / "config.json").read_text())["model_type"]
    llm = LLM(
        model=str(model), **engine_kwargs(precision, model_type=model_type), **small_engine_args(**extra)
    )
    try:
        yield llm
    finally:
        del llm
        free_engine()


def image_prompt(processor: Any, colour: tuple[int, int, int]) -> dict[str, Any]:
    """One captioning prompt as TRL sends it to a colocated engine: token ids and the image."""
    from PIL import Image

    messages = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "describe the image"}]}
    ]
    image = Image.new("RGB", (SIDE, SIDE), colour)
    ids = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    inputs = processor(text=[ids], images=[image], return_tensors="pt")
    return {"prompt_token_ids": inputs["input_ids"][0].tolist(), "multi_modal_data": {"image": image}}
