"""Builders for the training tests: a tiny random Qwen2.5-VL saved like a real checkpoint, a tiny
dataset folder in the pinned format, and a scripted judge that counts its calls.

A module of its own (not conftest.py) so tests import it by a unique name: `from conftest import`
picks whichever folder's conftest comes first on sys.path."""

from __future__ import annotations

import io
import os
import signal
import socket
import subprocess
import sys
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from balcaprl.data.format import DatasetSample, TokenCounter, write_dataset
from balcaprl.judge.protocol import JudgeFailure, Judgement, JudgeRequest
from balcaprl.rewards import parse_verdict, score_verdict

SIDE = 56  # 56 px: 4x4 patches of 14 px, merged 2x2 -> 4 image tokens
SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
COLOURS = ["red", "blue", "green", "yellow"]
SHAPES = ["circle", "square", "triangle"]
PLACES = ["left", "right", "center"]
META = ["image", "shows", "this", "there", "is"]
WORDS = [
    "[UNK]",
    "user",
    "assistant",
    "a",
    "the",
    "on",
    "and",
    ".",
    "describe",
    *COLOURS,
    *SHAPES,
    *PLACES,
    *META,
]
# Emits exactly one <|vision_start|><|image_pad|><|vision_end|> per image, as Qwen2.5-VL's template does.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }} "
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|> {% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant {% endif %}"
)


def word_level_tokenizer(specials: Sequence[str]) -> tuple[Any, dict[str, int]]:
    """The tests' word-level tokenizer (WORDS, then ``specials`` as special tokens) and its vocabulary."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(WORDS)}
    for token in specials:
        vocab[token] = len(vocab)
    raw = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw, unk_token="[UNK]", eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    tokenizer.add_special_tokens({"additional_special_tokens": list(specials)})
    return tokenizer, vocab


def qwen_vl_text_config(vocab_size: int, ids: dict[str, int]) -> dict[str, Any]:
    """The tiny Qwen2/2.5-VL language model: 2 layers, hidden 64, multimodal rope."""
    return dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=512,
        # mrope_section must sum to head_dim / 2 = 16 (a wrong one is accepted silently).
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [8, 4, 4]},
        bos_token_id=None,
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
    )


def build_tiny_qwen2_5_vl(out: Path) -> Path:
    """Random-init Qwen2.5-VL (2 layers, hidden 64, vision depth 2), word-level tokenizer, saved to ``out``."""
    from transformers import (
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2_5_VLProcessor,
        Qwen2VLImageProcessor,
    )

    from balcaprl.train.modeling import image_only_processor_class

    tokenizer, vocab = word_level_tokenizer(SPECIALS)
    image_processor = Qwen2VLImageProcessor(min_pixels=SIDE * SIDE, max_pixels=SIDE * SIDE)
    # Image-only: a video processor needs torchvision, which has no CPU wheel on PyPI (balcaprl.train.modeling).
    processor_class = image_only_processor_class(Qwen2_5_VLProcessor)
    processor = processor_class(
        image_processor=image_processor, tokenizer=tokenizer, chat_template=CHAT_TEMPLATE
    )
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIALS}
    config = Qwen2_5_VLConfig(
        text_config=qwen_vl_text_config(len(vocab), ids),
        vision_config=dict(
            depth=2,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            out_hidden_size=64,
            fullatt_block_indexes=[1],
        ),
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
    )
    return save_tiny_model(
        out, Qwen2_5_VLForConditionalGeneration, config, processor, ids["<|im_end|>"], ids["<|endoftext|>"]
    )


def save_tiny_model(out: Path, model_class: type, config: Any, processor: Any, eos: int, pad: int) -> Path:
    """A random-init ``model_class(config)`` (seed 0) with its generation config and ``processor``, saved to
    ``out`` as a checkpoint: what every tiny builder ends with."""
    from transformers import GenerationConfig

    torch.manual_seed(0)
    model = model_class(config)
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=pad)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    return out


LLAVA_CHAT_TEMPLATE = CHAT_TEMPLATE.replace("<|vision_start|><|image_pad|><|vision_end|>", "<image>")


def build_tiny_llava(out: Path) -> Path:
    """Random-init LLaVA (CLIP vision 2 layers, Qwen2 text 2 layers): the synthetic demo's policy shape."""
    from transformers import (
        CLIPVisionConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
        Qwen2Config,
    )
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<image>"]
    tokenizer, vocab = word_level_tokenizer(specials)
    image_processor = CLIPImageProcessorPil(
        size={"shortest_edge": SIDE}, crop_size={"height": SIDE, "width": SIDE}
    )
    processor = LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        chat_template=LLAVA_CHAT_TEMPLATE,
        patch_size=14,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
        image_token="<image>",
    )
    eos, pad = tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = LlavaConfig(
        vision_config=CLIPVisionConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            image_size=SIDE,
            patch_size=14,
        ),
        text_config=Qwen2Config(
            vocab_size=len(vocab),
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=512,
            tie_word_embeddings=True,
            bos_token_id=None,
            eos_token_id=eos,
            pad_token_id=pad,
        ),
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        image_seq_length=(SIDE // 14) ** 2,
        vision_feature_layer=-1,
        vision_feature_select_strategy="default",
        tie_word_embeddings=True,
    )
    return save_tiny_model(out, LlavaForConditionalGeneration, config, processor, eos, pad)


def _png(colour: tuple[int, int, int]) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (SIDE, SIDE), colour).save(buffer, format="PNG")
    return buffer.getvalue()


def build_tiny_dataset(out: Path, n_train: int = 8, tokenizer_name: str = "characters") -> Path:
    """A dataset folder in the pinned format. Its ``reference_tokens`` are counted in *characters* (another
    "tokenizer" than the policy's word-level one), so tests can tell a recount from a reuse."""
    samples = []
    for i in range(n_train + 2):
        colour, shape, place = COLOURS[i % 4], SHAPES[i % 3], PLACES[(i // 3) % 3]
        samples.append(
            DatasetSample(
                id=f"scene-{i:03d}",
                image=_png(((i * 37) % 256, (i * 91) % 256, (i * 53) % 256)),
                prompt="describe the image",
                reference=f"a {colour} {shape} on the {place} .",
                reference_original=f"{colour} {shape}",
                source="test",
            )
        )
    counter = TokenCounter(name=tokenizer_name, count=lambda texts: [len(t) for t in texts])
    return write_dataset(out, samples[:n_train], samples[n_train:], name="tiny-test", token_counter=counter)


class ScriptedJudge:
    """A deterministic judge: verdicts from word overlap; fails on a fixed subset of captions.

    Caption words are caption assertions (META words are not pointable; a word is visible when the
    reference contains it); reference words are reference assertions (covered when the caption has
    them); linguistic scores grow with caption length. ``fail_every``: captions whose crc32 is
    divisible by it fail with a timeout. Counts judge_batch calls and requests; reports usage.
    """

    def __init__(self, fail_every: int | None = 3, fail_reason: str = "timeout", check_images: bool = True):
        self.fail_every = fail_every
        self.check_images = check_images
        self.fail_reason = fail_reason
        self.calls = 0
        self.requests: list[JudgeRequest] = []
        self._prompt_tokens = 0

    def usage(self) -> dict[str, float]:
        return {"prompt_tokens": float(self._prompt_tokens), "cost_usd": self._prompt_tokens * 1e-6}

    def fails(self, caption: str) -> bool:
        return self.fail_every is not None and zlib.crc32(caption.encode()) % self.fail_every == 0

    def verdict(self, caption: str, reference: str) -> dict[str, Any]:
        words = [w for w in caption.split() if w not in {".", "[UNK]"}]
        ref_words = [w for w in dict.fromkeys(reference.split()) if w != "."]
        score = 1 + min(9, len(words))
        return {
            "caption_assertions": [
                {"text": w, "pointable": w not in META, "visible": w in ref_words} for w in words
            ],
            "reference_assertions": [{"text": w, "covered": w in words} for w in ref_words],
            "clarity": score,
            "fluency": max(1, score - 1),
            "coherency": score,
            "explanation": "scripted",
        }

    def expected(self, caption: str, reference: str, pointability: bool = True):
        """The reward vector this judge implies, or None for a failure."""
        if self.fails(caption):
            return None
        return score_verdict(self.verdict(caption, reference), pointability=pointability)

    async def judge_batch(self, requests: Sequence[JudgeRequest]):
        self.calls += 1
        self.requests.extend(requests)
        outcomes = []
        for request in requests:
            if self.check_images:
                assert Path(request.image).is_file(), request.image
            self._prompt_tokens += len(request.caption.split()) + len(request.reference.split())
            if self.fails(request.caption):
                outcomes.append(JudgeFailure(self.fail_reason, "scripted failure"))
                continue
            verdict = parse_verdict(self.verdict(request.caption, request.reference))
            outcomes.append(Judgement(verdict=verdict))
        return outcomes


def tiny_recipe_dict(
    policy: Path, dataset: Path, output_dir: Path, **sections: dict[str, Any]
) -> dict[str, Any]:
    """A recipe for the tiny policy on CPU: 2 prompts x 4 rollouts per step, micro-batches of 4."""
    recipe: dict[str, Any] = {
        "name": "tiny",
        "model": {"path": str(policy)},
        "data": {"path": str(dataset)},
        "rollout": {"rollouts_per_prompt": 4, "max_caption_tokens": 10},
        "train": {
            "prompts_per_batch": 2,
            "per_device_batch_size": 4,
            "learning_rate": 1e-3,
            "max_steps": 3,
            "precision": "fp32",
            "use_cpu": True,
            "seed": 0,
        },
        "run": {"output_dir": str(output_dir), "save_steps": 1, "progress": False, "log_rollouts_every": 1},
    }
    for section, values in sections.items():
        recipe.setdefault(section, {}).update(values)
    return recipe


def run_on_two_processes(worker: Path, *args: Any, timeout: int = 240, accelerate: bool = False) -> None:
    """``worker`` with ``args`` under ``torchrun --nproc_per_node 2`` (CPU, gloo, 127.0.0.1), or ``accelerate
    launch`` as a user starts training (``--multi_gpu``: torchrun underneath; the worker asks accelerate
    for the CPU); fails the test on a non-zero exit or after ``timeout`` seconds, with its stderr's end."""
    import pytest

    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    with socket.socket() as probe:  # a free port for the rendezvous (torchrun's port 0 hangs)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    if accelerate:
        command = [str(Path(sys.executable).with_name("accelerate")), "launch", "--multi_gpu", "--num_processes",
                   "2", "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                   "--main_process_ip", "127.0.0.1", "--main_process_port", str(port)]  # fmt: skip
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                   "--master_addr", "127.0.0.1", "--master_port", str(port)]  # fmt: skip
    command += [str(worker), *map(str, args)]
    # Own process group, so a hang kills torchrun *and* its workers (subprocess.run's timeout would
    # only kill torchrun and leave the ranks running).
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    ) as process:
        try:
            _, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            _, stderr = process.communicate()
            pytest.fail(f"torchrun did not finish in {timeout} s:\n{stderr[-4000:]}")
    assert process.returncode == 0, stderr[-4000:]
