"""Loading the policy's processor and building the model/LoRA arguments TRL takes.

The model itself is loaded by TRL from ``model.path`` (``create_model_from_path``: the architecture
named in the checkpoint's config, e.g. ``Qwen2_5_VLForConditionalGeneration``), the same path for a
hub checkpoint, a local 3B/7B folder or a tiny test checkpoint.

The processor is loaded here because the recipe sets image limits on it, and because of one
environment quirk: transformers 5 builds a Qwen2/2.5-VL processor only with its *video* processor,
which needs torchvision, and PyPI has no CPU build of torchvision matching a CPU-only torch. Without
torchvision, :func:`load_processor` loads the same checkpoint through an image-only variant of the
processor class (the image processor falls back to its PIL implementation). Captioning never uses
video inputs, so nothing changes for training; saved checkpoints keep the original processor class
name and load normally wherever torchvision is installed.
"""

from __future__ import annotations

import logging
from typing import Any

from balcaprl.recipe import ModelConfig

__all__ = ["image_only_processor_class", "load_processor", "model_init_kwargs", "peft_config"]

logger = logging.getLogger(__name__)


def image_only_processor_class(processor_class: type) -> type:
    """A subclass of ``processor_class`` without its video processor (same name, same files)."""

    class ImageOnlyProcessor(processor_class):  # type: ignore[misc, valid-type]
        # ProcessorMixin reads a processor's parts from its __init__ signature: no video_processor here.
        def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
            super().__init__(
                image_processor=image_processor,
                tokenizer=tokenizer,
                video_processor=None,
                chat_template=chat_template,
                **kwargs,
            )

    ImageOnlyProcessor.__name__ = processor_class.__name__  # saved as, and reloads as, the real class
    ImageOnlyProcessor.__qualname__ = processor_class.__qualname__
    return ImageOnlyProcessor


def _processor_class_for(path: str, trust_remote_code: bool) -> type:
    from transformers import AutoConfig
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING

    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    return PROCESSOR_MAPPING[type(config)]


def load_processor(cfg: ModelConfig):
    """The policy's processor (or tokenizer), left-padded for generation, with the recipe's image limits."""
    from transformers import AutoProcessor

    kwargs: dict[str, Any] = {
        "padding_side": "left",
        "truncation_side": "left",
        "trust_remote_code": cfg.trust_remote_code,
    }
    if cfg.image.min_pixels is not None:
        kwargs["min_pixels"] = cfg.image.min_pixels
    if cfg.image.max_pixels is not None:
        kwargs["max_pixels"] = cfg.image.max_pixels
    kwargs.update(cfg.processor_kwargs)
    try:
        return AutoProcessor.from_pretrained(cfg.path, **kwargs)
    except (ImportError, OSError) as err:
        # Only the video part can be missing: torchvision absent, or a checkpoint saved without it.
        message = str(err).lower()
        if "torchvision" not in message and "video processor" not in message:
            raise
        processor_class = _processor_class_for(cfg.path, cfg.trust_remote_code)
        if "video_processor" not in processor_class.get_attributes():
            raise
        logger.warning(
            "%s is loaded without its video processor (images only): %s",
            processor_class.__name__,
            "torchvision is not installed" if "torchvision" in message else "the checkpoint has none",
        )
        return image_only_processor_class(processor_class).from_pretrained(cfg.path, **kwargs)


def model_init_kwargs(cfg: ModelConfig) -> dict[str, Any]:
    """``GRPOConfig.model_init_kwargs``: how TRL loads ``cfg.path``."""
    kwargs: dict[str, Any] = {"dtype": cfg.dtype, "trust_remote_code": cfg.trust_remote_code}
    if cfg.attn_implementation is not None:
        kwargs["attn_implementation"] = cfg.attn_implementation
    return kwargs


def peft_config(cfg: ModelConfig):
    """A ``peft.LoraConfig`` for ``cfg.lora``, or None for full fine-tuning."""
    if cfg.lora is None:
        return None
    from peft import LoraConfig

    return LoraConfig(
        r=cfg.lora.r,
        lora_alpha=cfg.lora.alpha,
        lora_dropout=cfg.lora.dropout,
        target_modules=cfg.lora.target_modules,
        modules_to_save=cfg.lora.modules_to_save,
        task_type="CAUSAL_LM",
    )
