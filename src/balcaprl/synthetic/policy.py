"""The tiny policy: a genuinely multimodal LLaVA-architecture model (CLIP vision tower, projector,
Qwen2 language model), random-initialised from a config and sized to train on 2 CPU cores.

Why LLaVA and not Qwen2.5-VL: with transformers 5.x, ``AutoProcessor`` cannot load a Qwen2.5-VL
processor without torchvision (its video processor requires it), and PyPI's torchvision wheels are
CUDA builds that break a CPU-only torch. LLaVA's processor has no video part, so the tiny policy
loads through plain ``AutoProcessor`` / ``AutoModelForImageTextToText`` on any CPU machine, exactly
like a real checkpoint (LLaVA-1.5-7B is one of the paper's models); TRL's GRPOTrainer supports it.

Resolution: scenes are rendered at 224 px; the processor resizes them to ``PolicySpec.image_size``
(84 px by default, for speed) and the vision tower cuts them into 28 px patches, one per cell of the
scene's 3x3 grid, so an image costs 9 tokens. (14 px patches, 36 tokens, learned no faster.)
The model is saved with ``save_pretrained`` (weights, config, generation config, tokenizer,
image processor and chat template) and everything else loads it back with ``from_pretrained``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from balcaprl.errors import MissingInputError
from balcaprl.synthetic.lexicon import PROMPT
from balcaprl.synthetic.tokenizer import EOS_TOKEN, IMAGE_TOKEN, PAD_TOKEN, build_tokenizer

# ChatML, as Qwen models use; an image part becomes exactly one "<image>" (the processor expands it).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<image>\n"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass(frozen=True)
class PolicySpec:
    """Architecture of the tiny policy (~0.6 M parameters at the defaults)."""

    image_size: int = 84  # the processor resizes every image to this square
    patch_size: int = 28  # one patch per cell of the 3x3 grid: 9 image tokens
    vision_hidden: int = 64
    vision_layers: int = 2
    vision_heads: int = 4
    vision_ffn: int = 128
    text_hidden: int = 128
    text_layers: int = 2
    text_heads: int = 4
    text_kv_heads: int = 2
    text_ffn: int = 256
    max_positions: int = 512
    # Pitfall 1 of the notes: image features that barely differ between images teach the LM to
    # ignore them. With CLIP's pixel normalisation the near-white background dominates every patch
    # (a shape changes a patch embedding by ~20%), so pixels are centred on the world's background
    # colour instead: empty cells embed near zero and a shape is the whole signal.
    image_mean: tuple[float, float, float] = (0.949, 0.949, 0.933)
    image_std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    projector_init_std: float = 0.2

    def __post_init__(self) -> None:
        if self.image_size % self.patch_size:
            raise ValueError(
                f"image_size ({self.image_size}) must be a multiple of patch_size ({self.patch_size})"
            )

    @property
    def image_tokens(self) -> int:
        return (self.image_size // self.patch_size) ** 2


def build_processor(spec: PolicySpec = PolicySpec()):  # -> LlavaProcessor
    from transformers import LlavaProcessor
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    image_processor = CLIPImageProcessorPil(
        size={"shortest_edge": spec.image_size},
        crop_size={"height": spec.image_size, "width": spec.image_size},
        image_mean=list(spec.image_mean),
        image_std=list(spec.image_std),
    )
    return LlavaProcessor(
        image_processor=image_processor,
        tokenizer=build_tokenizer(),
        chat_template=CHAT_TEMPLATE,
        patch_size=spec.patch_size,
        vision_feature_select_strategy="default",  # drop CLS ...
        num_additional_image_tokens=1,  # ... which the vision tower adds: 9 tokens at 84/28
        image_token=IMAGE_TOKEN,
    )


def build_policy(
    spec: PolicySpec = PolicySpec(), seed: int = 0
):  # -> (LlavaForConditionalGeneration, processor)
    """A fresh random-initialised policy and its processor."""
    from transformers import CLIPVisionConfig, LlavaConfig, LlavaForConditionalGeneration, Qwen2Config

    processor = build_processor(spec)
    tok = processor.tokenizer
    eos, pad = tok.convert_tokens_to_ids(EOS_TOKEN), tok.convert_tokens_to_ids(PAD_TOKEN)
    config = LlavaConfig(
        vision_config=CLIPVisionConfig(
            hidden_size=spec.vision_hidden,
            intermediate_size=spec.vision_ffn,
            num_hidden_layers=spec.vision_layers,
            num_attention_heads=spec.vision_heads,
            image_size=spec.image_size,
            patch_size=spec.patch_size,
        ),
        text_config=Qwen2Config(
            vocab_size=len(tok),
            hidden_size=spec.text_hidden,
            intermediate_size=spec.text_ffn,
            num_hidden_layers=spec.text_layers,
            num_attention_heads=spec.text_heads,
            num_key_value_heads=spec.text_kv_heads,
            max_position_embeddings=spec.max_positions,
            tie_word_embeddings=True,
            bos_token_id=None,
            eos_token_id=eos,
            pad_token_id=pad,
        ),
        image_token_id=tok.convert_tokens_to_ids(IMAGE_TOKEN),
        image_seq_length=spec.image_tokens,
        vision_feature_layer=-1,
        vision_feature_select_strategy="default",
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(config)
    with torch.no_grad():
        for module in model.model.multi_modal_projector.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.normal_(0.0, spec.projector_init_std)
    # The top-level config too: trainers compare it with the tokenizer and log a warning otherwise.
    model.config.eos_token_id, model.config.pad_token_id = eos, pad
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = pad
    model.generation_config.bos_token_id = None
    model.generation_config.do_sample = False
    model.generation_config.max_new_tokens = 192
    return model, processor


def create_policy(out_dir: Path | str, spec: PolicySpec = PolicySpec(), seed: int = 0) -> Path:
    """Build a random-initialised policy and save it (model + processor) to ``out_dir``."""
    model, processor = build_policy(spec, seed)
    return save_policy(model, processor, out_dir, spec)


def save_policy(model: Any, processor: Any, out_dir: Path | str, spec: PolicySpec | None = None) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    if spec is not None:
        (out / "balcaprl_policy.json").write_text(json.dumps(asdict(spec), indent=2) + "\n")
    return out


def load_policy(path: Path | str):  # -> (model, processor)
    """Load a policy folder through the same ``from_pretrained`` path as any real checkpoint."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    path = Path(path)
    if not (path / "config.json").is_file():
        raise MissingInputError(
            f"{path} has no config.json: not a saved policy (create one with `balcaprl synthetic sft`)"
        )
    model = AutoModelForImageTextToText.from_pretrained(path)
    processor = AutoProcessor.from_pretrained(path)
    return model, processor


def prompt_messages(prompt: str = PROMPT) -> list[dict[str, Any]]:
    """The conversational prompt (image first, then the instruction), as TRL's GRPOTrainer takes it."""
    return [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]


def caption_token_counts(processor_or_tokenizer: Any, captions: Sequence[str]) -> list[int]:
    """Caption lengths in the policy's tokens (what the length mask compares)."""
    tok = getattr(processor_or_tokenizer, "tokenizer", processor_or_tokenizer)
    return [len(ids) for ids in tok(list(captions), add_special_tokens=False)["input_ids"]]


@torch.no_grad()
def generate_captions(
    model: Any,
    processor: Any,
    images: Sequence[Image.Image],
    *,
    prompt: str = PROMPT,
    max_new_tokens: int = 192,
    batch_size: int = 64,
    do_sample: bool = False,
    temperature: float = 1.0,
    on_batch: Callable[[int], None] | None = None,
) -> list[str]:
    """Captions for ``images`` (greedy by default), decoded without special tokens; ``on_batch`` is
    told how many captions each finished batch added (a progress reporter's ``advance``)."""
    model.eval()
    text = processor.apply_chat_template(prompt_messages(prompt), add_generation_prompt=True, tokenize=False)
    captions: list[str] = []
    for start in range(0, len(images), batch_size):
        chunk = [im.convert("RGB") for im in images[start : start + batch_size]]
        batch = processor(text=[text] * len(chunk), images=chunk, return_tensors="pt", padding=True)
        out = model.generate(
            **batch,
            max_new_tokens=max_new_tokens,
            do_sample=do_sample,
            temperature=temperature if do_sample else None,
            top_p=None,
            top_k=None,
        )
        new = out[:, batch["input_ids"].shape[1] :]
        captions += processor.batch_decode(new, skip_special_tokens=True)
        if on_batch is not None:
            on_batch(len(chunk))
    return [c.strip() for c in captions]
