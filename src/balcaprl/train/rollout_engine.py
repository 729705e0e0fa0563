"""What the vLLM rollout engine is given, colocated or served: one place for the three settings a
captioning run needs and vLLM does not infer.

1. Image-only inputs (:func:`engine_kwargs`): ``limit_mm_per_prompt`` of one image and no video. vLLM
   otherwise profiles a dummy input of every modality the architecture knows, and a checkpoint saved
   with an image-only processor (how balcaprl saves them, ``train/modeling.py``) has no video
   processor: the engine fails at start (``KeyError: "Modality 'video' not found"``).
2. The dtype of the recipe's precision (``train.precision``): vLLM would pick the checkpoint's, and
   rollouts sampled in bf16 beside an fp32 trainer are not the policy being trained.
3. LLaVA's weights under the names vLLM knows (:func:`vllm_param_name`): transformers 5's CLIP tower
   has no ``vision_model.`` level, vLLM 0.31's has; a checkpoint saved by transformers 5 cannot be read
   by vLLM (``no module or parameter named 'vision_tower.embeddings'``), so a LLaVA engine starts from
   vLLM's dummy weights and TRL's first weight sync (before the first rollout) fills it, each name
   rewritten.
4. Plain-text captions (:func:`sampling_ban`, :func:`check_completions`): a policy can sample the image
   placeholder or another special token the processor expands (``<|image_pad|>``, ``<|vision_start|>``,
   ...), and the loss forward then fails on a mismatch of image tokens and image features. Every special
   token but the stop tokens is masked at sampling (vLLM's ``bad_words``, transformers'
   ``suppress_tokens``), and a completion that holds one all the same is refused, naming the token.

A vLLM server is started by the user; :func:`server_command` renders its command line with the same
settings (and the trainer's pixel limits), and the trainer's error messages print it.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable, Sequence
from typing import Any, Literal

# Image inputs only, one image a prompt: no video, no audio (modalities absent here count as none).
IMAGE_ONLY = {"image": 1, "video": 0}

# train.precision -> the engine's dtype.
ENGINE_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def engine_kwargs(
    precision: str, processor_kwargs: dict[str, int] | None = None, *, model_type: str | None = None
) -> dict[str, Any]:
    """Keyword arguments of vLLM's ``LLM`` (engine args) for a captioning policy trained at ``precision``;
    ``processor_kwargs``: the trainer's pixel limits (``ImageGrid.processor_kwargs``), when it has any;
    ``model_type``: the checkpoint config's (``llava``: weights from the first sync, see above)."""
    kwargs: dict[str, Any] = {"limit_mm_per_prompt": dict(IMAGE_ONLY), "dtype": ENGINE_DTYPES[precision]}
    if processor_kwargs:
        kwargs["mm_processor_kwargs"] = dict(processor_kwargs)
    if model_type in RENAMED_TOWERS:
        kwargs["load_format"] = "dummy"
    return kwargs


# Checkpoint model types whose vision tower vLLM names with one more level than transformers 5.
RENAMED_TOWERS = frozenset({"llava"})
_FLAT_TOWER = re.compile(r"(^|\.)vision_tower\.(?!vision_model\.)")


def vllm_param_name(name: str) -> str:
    """A trainer parameter's name as vLLM's LLaVA loads it: ``vision_tower.X`` -> ``vision_tower.vision_model.X``
    (transformers 5 dropped that level; names that have it, and other towers, are left alone)."""
    return _FLAT_TOWER.sub(r"\1vision_tower.vision_model.", name)


def server_command(model: str, precision: str, processor_kwargs: dict[str, int] | None = None) -> str:
    """The ``trl vllm-serve`` line that serves ``model`` as the trainer needs it (the same settings as a
    colocated engine: :func:`engine_kwargs`)."""
    flags = {"--dtype": ENGINE_DTYPES[precision], "--limit-mm-per-prompt": json.dumps(IMAGE_ONLY)}
    if processor_kwargs:
        flags["--mm-processor-kwargs"] = json.dumps(processor_kwargs)
    parts = ["trl", "vllm-serve", "--model", model]
    for flag, value in flags.items():
        parts += [flag, value]
    return shlex.join(parts)


# ------------------------------------------------------------------------------ plain-text captions


def stop_token_ids(tokenizer: Any, generation_eos: int | Sequence[int] | None) -> frozenset[int]:
    """The tokens that end a caption: the tokenizer's EOS and the generation config's ``eos_token_id``."""
    stops = {tokenizer.eos_token_id}
    if isinstance(generation_eos, int):
        stops.add(generation_eos)
    elif generation_eos is not None:
        stops.update(generation_eos)
    return frozenset(int(t) for t in stops if t is not None)


def banned_tokens(tokenizer: Any, stops: Iterable[int]) -> dict[int, str]:
    """Every special token of ``tokenizer`` (id -> text) but ``stops``: a caption is plain text that may
    end with a stop token. Image and video placeholders, vision start/end, chat markers all belong here."""
    stops = frozenset(stops)
    special = {
        int(i): str(t) for i, t in zip(tokenizer.all_special_ids, tokenizer.all_special_tokens, strict=True)
    }
    for token_id, added in getattr(tokenizer, "added_tokens_decoder", {}).items():
        if getattr(added, "special", False):
            special[int(token_id)] = str(added.content)
    return {i: text for i, text in sorted(special.items()) if i not in stops}


def sampling_ban(banned: dict[int, str], engine: Literal["vllm", "transformers"]) -> dict[str, Any]:
    """Generation keyword arguments (``GRPOConfig.generation_kwargs``) that mask ``banned`` at sampling:
    vLLM's ``bad_words`` (each special token's text encodes to its one id, banned wherever it would
    be sampled) or transformers' ``suppress_tokens`` (logit set to -inf)."""
    if not banned:
        return {}
    if engine == "vllm":
        return {"bad_words": list(banned.values())}
    return {"suppress_tokens": list(banned)}


class SpecialTokenInCaption(RuntimeError):
    """A completion holds a token that sampling should have masked."""


def check_completions(completion_ids: Sequence[Sequence[int]], banned: dict[int, str]) -> None:
    """Refuse a batch whose completion holds a banned token (the rollout engine ignored the mask):
    the loss forward would fail later on a mismatch of image tokens and features, or train on markup."""
    for index, ids in enumerate(completion_ids):
        found = next((int(t) for t in ids if int(t) in banned), None)
        if found is not None:
            raise SpecialTokenInCaption(
                f"rollout {index} of this batch holds the special token {banned[found]!r} (id {found}), which "
                "sampling masks (bad_words / suppress_tokens): the rollout engine ignored the mask. Check that "
                "it is the pinned vLLM (constraints/gpu-one-node.txt) and that a vLLM server accepts bad_words"
            )
