"""Loading the policy's processor, the image grid the rollout engine must share with it, and the
model/LoRA arguments TRL takes.

The model itself is loaded by TRL from ``model.path`` (``create_model_from_path``: the architecture
named in the checkpoint's config, e.g. ``Qwen2_5_VLForConditionalGeneration``), the same path for a
hub checkpoint, a local 3B/7B folder or a tiny test checkpoint.

The processor is loaded here because the recipe sets image limits on it, and because of one
environment quirk: transformers 5 builds a Qwen2/2.5-VL processor only with its *video* processor,
which needs torchvision, and PyPI has no CPU build of torchvision matching a CPU-only torch. Without
torchvision, :func:`load_processor` loads the same checkpoint through an image-only variant of the
processor class (the image processor falls back to its PIL implementation). Captioning never uses
video inputs, so nothing changes for training. Saved checkpoints keep the original processor class
name, and the image-only processor saves a video processor entry as well (:func:`video_processor_config`),
so the full class loads them wherever torchvision is installed: vLLM's engine among others, which
otherwise fails at start ("Can't load video processor").

Rollouts see the trainer's images. A Qwen2/2.5-VL processor resizes each image to a grid of
``patch x merge`` pixel squares within [min_pixels, max_pixels] (``smart_resize``), and the number of
image tokens follows from the grid. vLLM processes the raw image again with its *own* processor, built
from the checkpoint's ``preprocessor_config.json`` (Qwen2.5-VL-3B/7B-Instruct: up to 12,845,056 pixels),
not with the recipe's ``model.image.max_pixels``: for a large image the rollout engine and the trainer
would disagree on the image-token count. Two measures, both from :class:`ImageGrid`:

* every training image is resized once to the trainer processor's grid before anyone sees it
  (``train/data.py``); an image already on the grid and within the limits is left alone by any such
  processor, so vLLM (colocate or server), verl and the trainer all count the same tokens;
* the colocated vLLM engine also gets the same limits as ``mm_processor_kwargs``
  (``trl_backend.vllm_engine_kwargs``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: the GPU check imports this module without pydantic
    from balcaprl.recipe import ImageConfig, ModelConfig

logger = logging.getLogger(__name__)


def image_only_processor_class(processor_class: type) -> type:
    """A subclass of ``processor_class`` without its video processor (same name), which saves the files of
    the full class: the video processor's settings included (:func:`video_processor_config`)."""

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

        def to_dict(self) -> dict[str, Any]:  # what save_pretrained writes to processor_config.json
            output = super().to_dict()
            if "video_processor" not in output and "image_processor" in output:
                output["video_processor"] = video_processor_config(output["image_processor"])
            return output

    ImageOnlyProcessor.__name__ = processor_class.__name__  # saved as, and reloads as, the real class
    ImageOnlyProcessor.__qualname__ = processor_class.__qualname__
    return ImageOnlyProcessor


def video_processor_config(image_processor: dict[str, Any]) -> dict[str, Any]:
    """The video processor's entry of a checkpoint saved by an image-only processor: its image processor's
    settings under the matching video processor class (``Qwen2VLImageProcessor`` -> ``Qwen2VLVideoProcessor``).

    Transformers reads a checkpoint that has only an image processor config this way (its legacy fallback,
    how the published Qwen2/2.5-VL checkpoints load), but not one saved as transformers 5 saves processors
    (one ``processor_config.json``): there the full processor class, which vLLM and any machine with
    torchvision load, fails ("Can't load video processor"). Captioning never sends video: the entry only
    lets the checkpoint load."""
    config = {key: value for key, value in image_processor.items() if key != "image_processor_type"}
    image_type = str(image_processor.get("image_processor_type", ""))
    if "ImageProcessor" in image_type:  # else transformers infers the class from the model config
        config["video_processor_type"] = image_type.replace("ImageProcessor", "VideoProcessor")
    return config


def _processor_class_for(path: str, trust_remote_code: bool) -> type:
    from transformers import AutoConfig
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING

    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    return PROCESSOR_MAPPING[type(config)]


def load_processor(cfg: ModelConfig):
    """The policy's processor (or tokenizer), left-padded for generation, with the recipe's image limits.
    The first load of ``model.path``: a local path that does not exist is refused here, not sent to the hub."""
    from balcaprl.model_paths import check_model_path

    check_model_path(cfg.path, "model.path")
    from transformers import AutoProcessor

    kwargs: dict[str, Any] = {
        "padding_side": "left",
        "truncation_side": "left",
        "trust_remote_code": cfg.trust_remote_code,
        **image_limits(cfg.image),
    }
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


def image_limits(cfg: ImageConfig) -> dict[str, int]:
    """The recipe's Qwen2/2.5-VL pixel limits as processor keyword arguments (absent ones left out)."""
    limits = {"min_pixels": cfg.min_pixels, "max_pixels": cfg.max_pixels}
    return {key: value for key, value in limits.items() if value is not None}


@dataclass(frozen=True)
class ImageGrid:
    """A Qwen2/2.5-VL image processor's resize rule: sides in multiples of ``factor`` (patch x merge
    pixels), area within [min_pixels, max_pixels], aspect ratio kept (transformers' ``smart_resize``)."""

    factor: int
    min_pixels: int
    max_pixels: int

    def size(self, width: int, height: int) -> tuple[int, int]:
        """(width, height) the processor turns a ``width x height`` image into; a fixed point of the rule."""
        # The processors' own rule (the PIL module's copy: the torchvision one needs torchvision).
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

        first = smart_resize(height, width, self.factor, self.min_pixels, self.max_pixels)
        h, w = first
        # Usually the first step is a fixed point; at extreme aspect ratios (the short side pinned at one
        # factor) the area can still exceed max_pixels and the rule takes a few more steps to settle.
        for _ in range(32):
            new_h, new_w = smart_resize(h, w, self.factor, self.min_pixels, self.max_pixels)
            if (new_h, new_w) == (h, w):
                return w, h
            h, w = new_h, new_w
        # No fixed point (min_pixels close to max_pixels): the processor's own first step. Any engine with
        # the same limits still agrees with the trainer; one with other limits may not.
        return first[1], first[0]

    def tokens(self, width: int, height: int) -> int:
        """Image tokens the language model sees for a ``width x height`` image: one per ``factor``-pixel
        square of the grid (patches of ``patch`` pixels, merged ``merge x merge``)."""
        w, h = self.size(width, height)
        return (w // self.factor) * (h // self.factor)

    def resize(self, image):
        """``image`` resized (bicubic, the processors' filter) to its grid size; returned as is when on it."""
        from PIL import Image

        size = self.size(*image.size)
        return image if size == image.size else image.resize(size, Image.Resampling.BICUBIC)

    def processor_kwargs(self) -> dict[str, int]:
        """The same limits as processor / vLLM ``mm_processor_kwargs`` keyword arguments."""
        return {"min_pixels": self.min_pixels, "max_pixels": self.max_pixels}


def image_grid(processor: Any) -> ImageGrid | None:
    """The resize rule of ``processor``'s image processor, or None when it has none of this kind (LLaVA:
    a fixed crop, so every processor of the checkpoint gives the same number of image tokens)."""
    image_processor = getattr(processor, "image_processor", None)
    patch, merge = getattr(image_processor, "patch_size", None), getattr(image_processor, "merge_size", None)
    size = getattr(image_processor, "size", None)
    if not (isinstance(patch, int) and isinstance(merge, int) and size is not None):
        return None
    low, high = _size_entry(size, "shortest_edge"), _size_entry(size, "longest_edge")
    if low is None or high is None:
        return None
    return ImageGrid(factor=patch * merge, min_pixels=int(low), max_pixels=int(high))


def _size_entry(size: Any, key: str) -> Any:
    return size.get(key) if isinstance(size, dict) else getattr(size, key, None)


def model_init_kwargs(cfg: ModelConfig, processes: int = 1) -> dict[str, Any]:
    """``GRPOConfig.model_init_kwargs``: how TRL loads ``cfg.path`` in each of ``processes`` processes.

    A distributed launch loads with ``device_map=None``: TRL 1.16 sets it only for DDP and DeepSpeed and
    otherwise lets ``from_pretrained`` use "auto", which under FSDP spreads rank 0's copy over every GPU
    of the node (while the colocated vLLM engines measure their free memory); FSDP then places the
    shards itself. One process keeps TRL's choice ("auto" on a GPU, None on CPU).
    """
    kwargs: dict[str, Any] = {"dtype": cfg.dtype, "trust_remote_code": cfg.trust_remote_code}
    if cfg.attn_implementation is not None:
        kwargs["attn_implementation"] = cfg.attn_implementation
    if processes > 1:
        kwargs["device_map"] = None
    return kwargs


def language_model_layers(model: Any) -> list[Any]:
    """The language model's decoder layers, in order (Qwen2/2.5-VL and LLaVA name them under
    ``language_model``; peft's wrapper keeps those names)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [
        module
        for name, module in model.named_modules()
        if isinstance(module, GradientCheckpointingLayer) and "language_model" in name.split(".")
    ]


def keep_activations(model: Any, layers_without_recompute: int) -> list[int]:
    """Selective activation checkpointing: the last ``layers_without_recompute`` decoder layers of the
    language model skip the recompute (transformers 5 checks ``GradientCheckpointingLayer
    .gradient_checkpointing`` per layer, so one flag per layer is the whole switch); every other layer,
    the vision tower's included, stays as ``gradient_checkpointing_enable`` left it. A number above the
    model's layer count (a recipe's value on a smaller model) keeps them all. Returns the indices of the
    layers that now keep their activations."""
    layers = language_model_layers(model)
    if layers_without_recompute > len(layers):
        logger.info(
            "model.layers_without_recompute: %d, but the language model has %d decoder layers: all keep theirs",
            layers_without_recompute,
            len(layers),
        )
    kept = list(range(max(0, len(layers) - layers_without_recompute), len(layers)))
    for index in kept:
        layers[index].gradient_checkpointing = False
    return kept


def keep_activations_on_enable(model: Any, layers_without_recompute: int) -> None:
    """Apply :func:`keep_activations` now if checkpointing is on, and after every later
    ``gradient_checkpointing_enable`` of ``model``: the Trainer enables it at the start of training, and
    TRL disables and re-enables it around every ``generate`` (``trl.models.utils``), each time on every
    layer. The method is wrapped on the instance, as TRL's own selective checkpointing does."""
    original = model.gradient_checkpointing_enable

    def enable(*args: Any, **kwargs: Any) -> None:
        original(*args, **kwargs)
        keep_activations(model, layers_without_recompute)

    model.gradient_checkpointing_enable = enable
    if getattr(model, "is_gradient_checkpointing", False):
        keep_activations(model, layers_without_recompute)


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
