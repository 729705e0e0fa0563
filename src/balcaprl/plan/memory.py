"""A memory plan: how much GPU memory a recipe needs per GPU, before a GPU is rented (``balcaprl train
CONFIG --plan``). Arithmetic from the model's shape and the recipe; no torch, no download.

Two phases, each GPU's peak being the larger:

* **update** (forward and backward of one micro-batch of ``train.per_device_batch_size`` captions):
  weights, gradients and AdamW states (Rajbhandari et al. 2020, "ZeRO": mixed-precision Adam keeps
  16 bytes per parameter, sharded /N by FSDP or ZeRO-3), the activations kept for the backward pass,
  the LM head's log-prob computation, and a resident rollout engine (TRL colocate without sleep mode);
* **rollout**: the sharded training state, plus either the vLLM engine's share of the GPU
  (weights + KV cache) or, with transformers' generate (TRL, vLLM off), the whole model gathered on
  each GPU and the KV cache of every caption of the GPU's generation batch at once (TRL generates the
  local generation batch in one ``generate`` call).

Activations: the bytes autograd keeps per token and decoder layer, as counted on the real transformers
layers (``balcaprl.plan.measured``; ``tests/train/test_memory_measured.py`` holds this arithmetic to the
count within 5% at each recipe model's widths). With ``h`` the width, ``kv`` K's (and V's) width, ``I``
the MLP's and ``a`` the heads, 16-bit weights and SDPA (no ``s x s`` scores kept):

    a_layer = 20 h + 4 kv + 8 I + 4 a + 8                        (no mask: causal, or packed varlen)
    a_layer + 4 (h - kv) + 2 L                                   (a padding mask of width L under sdpa)

Each RMSNorm keeps its input in fp32, 1/rms, the normalised bf16 and its output (8h + 4); attention
keeps q, k, v after rotary embedding, its output and the fp32 log-sum-exp (4h + 4kv + 4a); the SwiGLU
keeps gate, act(gate), up and their product (8I). With a mask transformers expands k and v to every head
and each layer converts and keeps the mask. (Korthikanti et al. 2022's ``34 h`` per token is the same
kind of count for a GPT layer; the textbook ``2 (6h + 2kv + 4I)`` missed the fp32 norms and the mask.)
CLIP's layers (LLaVA's vision tower) keep the textbook count, an estimate.

With per-layer gradient checkpointing only each layer's input stays (2 h bytes per token and layer)
and one layer is recomputed at a time (``a_layer`` once). The vision tower is counted the same way on
its patches (Qwen2.5-VL: 4 patches per image token; LLaVA-1.5: 577 CLIP tokens per image), an estimate:
its attention route differs from the language model's.

KV cache per token: ``layers x 2 (K, V) x kv_heads x head_dim x bytes``. Logits: TRL 1.16 computes the
completion tokens' log-probs with a fused, tiled LM head (``trl.kernels.ChunkedLogProbFunction``: tiles
of 4,096 tokens x 32,768 vocabulary entries, never the whole ``tokens x vocabulary`` matrix); verl 0.9.1
without fused kernels would materialise the logits of every token of a micro-batch, so balcaprl renders
``use_fused_kernels`` (512-token chunks).

verl's micro-batches are token-balanced (``use_dynamic_bsz``): the plan gives them the tokens the
memory left after the static state holds (:attr:`MemoryPlan.token_budget`, rendered as
``ppo_max_token_len_per_gpu``), instead of ``train.per_device_batch_size`` captions.

Allocator fragmentation, NCCL buffers and the CUDA context come on top, and a fixed reserve
(:data:`RUNTIME_RESERVE_GIB`) stands in for them; TRL's kept layers leave :data:`HEADROOM_GIB` of the card
free beyond the peak. ``--plan`` marks each figure counted, measured or estimated (:func:`basis`). Check
them against a GPU (``benchmarks/gpu_check.py``, ``benchmarks/gpu_step.py``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from balcaprl.errors import ConfigError, InputError

if TYPE_CHECKING:  # the shapes and per-layer bytes need neither (the GPU check imports them bare)
    from balcaprl.recipe import Recipe

GiB = 2**30
BF16 = 2
FP32 = 4
PROMPT_TEXT_TOKENS = 64  # the chat template and the captioning instruction around the image tokens
RUNTIME_RESERVE_GIB = 3.0  # CUDA context, NCCL buffers, allocator fragmentation (an estimate)
VLLM_ENGINE_OVERHEAD_GIB = 2.0  # vLLM's activations for its batched tokens and CUDA graphs (an estimate)
TRL_LOGPROB_TILE = (
    4096,
    32768,
)  # trl.kernels.chunked_logprob: TOKEN_CHUNK_SIZE x _CHUNKED_LOGPROB_CHUNK_SIZE
VERL_FUSED_CHUNK = 512  # verl.utils.experimental.torch_functional.FusedLinearForPPO's chunk_size (tokens)
TOKEN_BUDGET_STEP = 1024  # verl's token budget is rounded down to a multiple of this
ACTIVATION_SHARE = 0.9  # of the memory left for activations (verl's token budget): a margin
HEADROOM_GIB = 6.0  # free memory the TRL recipes' kept layers leave on the card beyond the plan's peak


# ------------------------------------------------------------------------------------------ shapes


@dataclass(frozen=True)
class Stack:
    """A stack of identical transformer layers (the language model, or the vision tower)."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    mlp: Literal["swiglu", "gelu"]

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv(self) -> int:
        """Width of K (and of V): kv_heads x head_dim."""
        return self.kv_heads * self.head_dim

    def layer_activation_bytes(self, mask_width: int = 0) -> int:
        """Bytes one layer keeps per token for the backward pass, 16-bit weights (module docstring).

        ``mask_width``: the width of the dense attention mask the layer gets (a padded micro-batch under
        sdpa: the padded length), 0 when it gets none (causal attention, or packed rows through a
        variable-length kernel)."""
        h, kv, inter = self.hidden, self.kv, self.intermediate
        if self.mlp == "gelu":  # CLIP (LayerNorm, GELU): the textbook count, not measured (an estimate)
            return BF16 * (6 * h + 2 * kv + 2 * inter)
        # RMSNorm x 2: its fp32 input, 1/rms (fp32), the normalised bf16 before the weight, its output
        # (the next linear layers' input).
        norms = 2 * (FP32 * h + FP32 + BF16 * h + BF16 * h)
        # q, k, v after rotary embedding, the output (o_proj's input, same storage), log-sum-exp (fp32).
        attention = BF16 * (h + 2 * kv + h) + FP32 * self.heads
        if mask_width:
            # transformers expands k and v to all heads when a mask is passed (no GQA in sdpa then), and
            # the mask is converted for sdpa in every layer: 16-bit, one row per token.
            attention += 2 * BF16 * (h - kv) + BF16 * mask_width
        mlp = 4 * BF16 * inter  # SwiGLU: gate, act(gate), up, act(gate) * up
        return norms + attention + mlp

    def activation_bytes(self, tokens: int, checkpointing: bool, kept: int = 0, mask_width: int = 0) -> int:
        """Activations of ``tokens`` tokens through the whole stack; with checkpointing, ``kept`` layers
        keep all theirs (selective checkpointing) and the others their input, plus one recomputed layer."""
        layer = self.layer_activation_bytes(mask_width)
        if checkpointing and kept < self.layers:
            recomputed = self.layers - kept
            return tokens * (recomputed * BF16 * self.hidden + (kept + 1) * layer)
        return tokens * self.layers * layer

    def kv_bytes_per_token(self, dtype_bytes: int = BF16) -> int:
        return self.layers * 2 * self.kv * dtype_bytes


@dataclass(frozen=True)
class ModelShape:
    """What the plan needs of a vision-language model (built from its ``config.json``)."""

    name: str
    kind: Literal["qwen2_vl", "llava"]
    text: Stack
    vision: Stack
    vocab: int
    tied_embeddings: bool
    params: int  # all parameters (parameter_count)
    # Image tokens: Qwen2-VL family from the pixel limit (patch x merge squares); LLaVA fixed.
    patch: int = 14
    merge: int = 2
    default_max_pixels: int | None = None  # the checkpoint processor's own limit (Qwen2-VL family)
    fixed_image_tokens: int | None = None  # LLaVA: image tokens in the prompt
    fixed_vision_tokens: int | None = None  # LLaVA: tokens through the vision tower (patches + CLS)
    lora_linear_shapes: tuple[tuple[int, int, int], ...] = field(default=(), repr=False)  # (in, out, count)

    def image_tokens(self, max_pixels: int | None) -> int:
        """Image tokens in the prompt for the largest image the processor allows."""
        if self.fixed_image_tokens is not None:
            return self.fixed_image_tokens
        limit = max_pixels if max_pixels is not None else self.default_max_pixels
        return int(limit) // (self.patch * self.merge) ** 2

    def vision_tokens(self, max_pixels: int | None) -> int:
        """Tokens the vision tower runs on for that image (before the merge)."""
        if self.fixed_vision_tokens is not None:
            return self.fixed_vision_tokens
        return self.image_tokens(max_pixels) * self.merge**2

    def lora_params(self, rank: int) -> int:
        """Trainable parameters of rank-``rank`` adapters on every linear layer but the LM head."""
        return sum(rank * (n_in + n_out) * count for n_in, n_out, count in self.lora_linear_shapes)


def _linear(n_in: int, n_out: int, bias: bool) -> int:
    return n_in * n_out + (n_out if bias else 0)


def _qwen2_vl_shape(name: str, config: dict[str, Any], default_max_pixels: int | None) -> ModelShape:
    text_cfg = config.get("text_config") or config
    vis = config["vision_config"]
    h, n_layers, inter = text_cfg["hidden_size"], text_cfg["num_hidden_layers"], text_cfg["intermediate_size"]
    heads = text_cfg["num_attention_heads"]
    kv_heads = text_cfg.get("num_key_value_heads", heads)
    vocab = text_cfg.get("vocab_size", config.get("vocab_size"))
    tied = bool(config.get("tie_word_embeddings", text_cfg.get("tie_word_embeddings", False)))
    kv = kv_heads * (h // heads)
    text = Stack(n_layers, h, heads, kv_heads, inter, "swiglu")
    # Qwen2 attention: q, k, v with bias, o without; SwiGLU MLP without bias; two RMSNorms.
    layer = _linear(h, h, True) + 2 * _linear(h, kv, True) + _linear(h, h, False) + 3 * h * inter + 2 * h
    lm = vocab * h + n_layers * layer + h + (0 if tied else vocab * h)
    hv, depth, inter_v = vis["hidden_size"], vis["depth"], vis["intermediate_size"]
    patch, merge = vis.get("patch_size", 14), vis.get("spatial_merge_size", 2)
    out = vis.get("out_hidden_size", h)
    channels, temporal = vis.get("in_channels", vis.get("in_chans", 3)), vis.get("temporal_patch_size", 2)
    vision = Stack(depth, hv, vis.get("num_heads", 16), vis.get("num_heads", 16), inter_v, "swiglu")
    # Qwen2.5-VL vision block: fused qkv and proj with bias, SwiGLU with bias, two RMSNorms; a Conv3d patch
    # embedding without bias; the merger: RMSNorm, Linear(4hv, 4hv), GELU, Linear(4hv, out).
    block = _linear(hv, 3 * hv, True) + _linear(hv, hv, True) + 2 * _linear(hv, inter_v, True)
    block += _linear(inter_v, hv, True) + 2 * hv
    merged = hv * merge**2
    vit = channels * temporal * patch * patch * hv + depth * block + hv
    vit += _linear(merged, merged, True) + _linear(merged, out, True)
    lora = (
        (h, h, 2 * n_layers),
        (h, kv, 2 * n_layers),
        (h, inter, 2 * n_layers),
        (inter, h, n_layers),
        (hv, 3 * hv, depth),
        (hv, hv, depth),
        (hv, inter_v, 2 * depth),
        (inter_v, hv, depth),
        (merged, merged, 1),
        (merged, out, 1),
    )
    return ModelShape(
        name=name,
        kind="qwen2_vl",
        text=text,
        vision=vision,
        vocab=vocab,
        tied_embeddings=tied,
        params=lm + vit,
        patch=patch,
        merge=merge,
        default_max_pixels=default_max_pixels or 28 * 28 * 1280,
        lora_linear_shapes=lora,
    )


def _llava_shape(name: str, config: dict[str, Any]) -> ModelShape:
    text_cfg, vis = config["text_config"], config["vision_config"]
    h, n_layers, inter = text_cfg["hidden_size"], text_cfg["num_hidden_layers"], text_cfg["intermediate_size"]
    heads = text_cfg["num_attention_heads"]
    kv_heads = text_cfg.get("num_key_value_heads", heads)
    vocab = text_cfg.get("vocab_size", config.get("vocab_size"))
    tied = bool(text_cfg.get("tie_word_embeddings", config.get("tie_word_embeddings", False)))
    kv = kv_heads * (h // heads)
    qkv_bias = text_cfg.get("model_type") == "qwen2" or bool(text_cfg.get("attention_bias", False))
    text = Stack(n_layers, h, heads, kv_heads, inter, "swiglu")
    layer = (
        _linear(h, h, qkv_bias) + 2 * _linear(h, kv, qkv_bias) + _linear(h, h, False) + 3 * h * inter + 2 * h
    )
    lm = vocab * h + n_layers * layer + h + (0 if tied else vocab * h)
    hv, depth, inter_v = vis["hidden_size"], vis["num_hidden_layers"], vis["intermediate_size"]
    patch, size = vis.get("patch_size", 14), vis.get("image_size", 336)
    positions = (size // patch) ** 2 + 1
    vision = Stack(
        depth, hv, vis.get("num_attention_heads", 16), vis.get("num_attention_heads", 16), inter_v, "gelu"
    )
    # CLIP: class embedding, Conv2d patches without bias, positions, pre- and post-LayerNorm; blocks of
    # q, k, v, out with bias, fc1, fc2, two LayerNorms. Projector: Linear(hv, h), GELU, Linear(h, h).
    block = 4 * _linear(hv, hv, True) + _linear(hv, inter_v, True) + _linear(inter_v, hv, True) + 4 * hv
    vit = hv + 3 * patch * patch * hv + positions * hv + 4 * hv + depth * block
    bias = bool(config.get("multimodal_projector_bias", True))
    projector = _linear(hv, h, bias) + _linear(h, h, bias)
    lora = (
        (h, h, 2 * n_layers),
        (h, kv, 2 * n_layers),
        (h, inter, 2 * n_layers),
        (inter, h, n_layers),
        (hv, hv, 4 * depth),
        (hv, inter_v, depth),
        (inter_v, hv, depth),
        (hv, h, 1),
        (h, h, 1),
    )
    return ModelShape(
        name=name,
        kind="llava",
        text=text,
        vision=vision,
        vocab=vocab,
        tied_embeddings=tied,
        params=lm + vit + projector,
        patch=patch,
        merge=1,
        fixed_image_tokens=int(config.get("image_seq_length", positions - 1)),
        fixed_vision_tokens=positions,
        lora_linear_shapes=lora,
    )


def shape_from_config(
    name: str, config: dict[str, Any], preprocessor: dict[str, Any] | None = None
) -> ModelShape:
    """A :class:`ModelShape` from a ``config.json`` mapping (and the ``preprocessor_config.json`` one)."""
    kind = config.get("model_type")
    if kind in ("qwen2_5_vl", "qwen2_vl"):
        pre = preprocessor or {}
        size = pre.get("size") or {}
        default_max = pre.get("max_pixels") or size.get("longest_edge") or size.get("max_pixels")
        return _qwen2_vl_shape(name, config, default_max)
    if kind == "llava":
        return _llava_shape(name, config)
    raise ConfigError(f"the memory plan knows Qwen2/2.5-VL and LLaVA checkpoints; {name} is a {kind!r} model")


# The public configs of the paper's three models (the fields the plan reads), so a plan needs no
# download. preprocessor: the checkpoints' own pixel limit (Qwen2.5-VL: 12,845,056 pixels).
_QWEN_VISION = {
    "depth": 32,
    "hidden_size": 1280,
    "intermediate_size": 3420,
    "num_heads": 16,
    "patch_size": 14,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "in_chans": 3,
}
KNOWN_MODELS: dict[str, tuple[dict[str, Any], dict[str, Any] | None]] = {
    "Qwen/Qwen2.5-VL-3B-Instruct": (
        {
            "model_type": "qwen2_5_vl",
            "hidden_size": 2048,
            "intermediate_size": 11008,
            "num_hidden_layers": 36,
            "num_attention_heads": 16,
            "num_key_value_heads": 2,
            "vocab_size": 151936,
            "tie_word_embeddings": True,
            "vision_config": {**_QWEN_VISION, "out_hidden_size": 2048},
        },
        {"max_pixels": 12845056, "min_pixels": 3136},
    ),
    "Qwen/Qwen2.5-VL-7B-Instruct": (
        {
            "model_type": "qwen2_5_vl",
            "hidden_size": 3584,
            "intermediate_size": 18944,
            "num_hidden_layers": 28,
            "num_attention_heads": 28,
            "num_key_value_heads": 4,
            "vocab_size": 152064,
            "tie_word_embeddings": False,
            "vision_config": {**_QWEN_VISION, "out_hidden_size": 3584},
        },
        {"max_pixels": 12845056, "min_pixels": 3136},
    ),
    "llava-hf/llava-1.5-7b-hf": (
        {
            "model_type": "llava",
            "image_seq_length": 576,
            "tie_word_embeddings": False,
            "text_config": {
                "model_type": "llama",
                "hidden_size": 4096,
                "intermediate_size": 11008,
                "num_hidden_layers": 32,
                "num_attention_heads": 32,
                "num_key_value_heads": 32,
                "vocab_size": 32064,
            },
            "vision_config": {
                "hidden_size": 1024,
                "intermediate_size": 4096,
                "num_hidden_layers": 24,
                "num_attention_heads": 16,
                "image_size": 336,
                "patch_size": 14,
            },
        },
        None,
    ),
}


def model_shape(path: str) -> ModelShape:
    """The shape of ``model.path``: a local checkpoint folder's ``config.json``, else a known hub id."""
    folder = Path(path).expanduser()
    if (folder / "config.json").is_file():
        config = _read_json(folder / "config.json")
        preprocessor = None
        if (folder / "preprocessor_config.json").is_file():  # hub checkpoints
            preprocessor = _read_json(folder / "preprocessor_config.json")
        elif (folder / "processor_config.json").is_file():  # saved by transformers 5: one file, nested
            preprocessor = _read_json(folder / "processor_config.json").get("image_processor")
        return shape_from_config(str(path), config, preprocessor)
    if path in KNOWN_MODELS:
        config, preprocessor = KNOWN_MODELS[path]
        return shape_from_config(path, config, preprocessor)
    raise InputError(
        f"model.path {path}: no config.json there, and not one of the models the plan knows "
        f"({', '.join(KNOWN_MODELS)}); point model.path at a local checkpoint folder"
    )


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise InputError(f"{path}: cannot read it as JSON ({error})") from None


# ---------------------------------------------------------------------------------------- launchers


@dataclass(frozen=True)
class Launcher:
    """How the training state is spread over the GPUs.

    ``strategy``: ``single`` (one process), ``ddp`` (a full copy per GPU), ``fsdp`` (parameters,
    gradients and optimizer states sharded over all GPUs), ``zero2`` / ``zero3`` (DeepSpeed). ``backend``:
    ``trl`` (accelerate) or ``verl`` (its FSDP workers with colocated vLLM engines).
    """

    strategy: Literal["single", "ddp", "fsdp", "zero2", "zero3"]
    gpus: int
    backend: Literal["trl", "verl"] = "trl"
    description: str = ""
    offload_params: bool = False
    offload_optimizer: bool = False
    # FSDP's checkpoint form: SHARDED_STATE_DICT (each process its shard, once) or FULL_STATE_DICT
    # (gathered, and the Trainer writes the weights twice: save_pretrained and FSDP's own file).
    sharded_checkpoints: bool = True

    @property
    def shards(self) -> int:
        return self.gpus if self.strategy in ("fsdp", "zero3") else 1


def launcher_from_accelerate(path: str | Path, gpus: int | None = None) -> Launcher:
    """A :class:`Launcher` from an accelerate config file (``configs/accelerate/*.yaml``)."""
    try:
        from balcaprl.config import parse_yaml

        config = parse_yaml(Path(path).read_text(encoding="utf-8")) or {}  # bounded, no duplicate keys
    except (OSError, ValueError) as error:
        raise InputError(f"--launcher {path}: cannot read it as an accelerate config ({error})") from None
    kind = str(config.get("distributed_type", "NO")).upper()
    processes = int(gpus if gpus is not None else config.get("num_processes", 1))
    name = Path(path).name
    if kind == "FSDP":
        fsdp = config.get("fsdp_config") or {}
        sharding = str(fsdp.get("fsdp_sharding_strategy", "FULL_SHARD")).upper()
        strategy = "fsdp" if fsdp.get("fsdp_version") == 2 or sharding in ("FULL_SHARD", "1") else "ddp"
        return Launcher(
            strategy, processes, description=f"{name}: FSDP over {processes} GPUs",
            offload_params=bool(fsdp.get("fsdp_offload_params", False)),
            sharded_checkpoints="FULL" not in str(fsdp.get("fsdp_state_dict_type", "FULL_STATE_DICT")).upper(),
        )  # fmt: skip
    if kind == "DEEPSPEED":
        ds = config.get("deepspeed_config") or {}
        stage = int(ds.get("zero_stage", 0))
        strategy = {3: "zero3", 2: "zero2"}.get(stage, "ddp")
        return Launcher(
            strategy, processes, description=f"{name}: DeepSpeed ZeRO-{stage} over {processes} GPUs",
            offload_params=str(ds.get("offload_param_device", "none")) != "none",
            offload_optimizer=str(ds.get("offload_optimizer_device", "none")) != "none",
        )  # fmt: skip
    if kind == "MULTI_GPU":
        return Launcher("ddp", processes, description=f"{name}: data parallel (DDP) over {processes} GPUs")
    return Launcher("single", 1, description=f"{name}: one process")


def launcher_from_verl_layout(layout: str) -> Launcher:
    """``NODESxGPUS`` (e.g. ``4x8``): verl's FSDP over every GPU of the Ray cluster."""
    try:
        nodes, per_node = (int(part) for part in layout.lower().split("x"))
        if nodes < 1 or per_node < 1:
            raise ValueError
    except ValueError:
        raise ConfigError(f"--verl-layout {layout!r}: write NODESxGPUS, e.g. 1x8 or 4x8") from None
    gpus = nodes * per_node
    return Launcher("fsdp", gpus, backend="verl", description=f"verl: FSDP over {nodes} x {per_node} GPUs")


# --------------------------------------------------------------------------------------------- plan


@dataclass
class MemoryPlan:
    """Per-GPU estimates in bytes by phase and component, and what does not fit."""

    model: ModelShape
    launcher: Launcher
    gpu_bytes: int
    update: dict[str, float]
    rollout: dict[str, float]
    activations: dict[str, float]  # both ways, for the reader: {"with checkpointing": .., "without": ..}
    notes: list[str]
    warnings: list[str]
    # verl only: the per-GPU token budget of a token-balanced micro-batch (ppo_max_token_len_per_gpu).
    token_budget: int | None = None
    # TRL with gradient checkpointing: the most decoder layers that fit without recompute.
    layers_without_recompute: int | None = None
    # Disk, whole run folder (all processes' files): one checkpoint, and final/.
    checkpoint_bytes: float = 0.0
    final_bytes: float = 0.0

    @property
    def peak(self) -> float:
        return max(sum(self.update.values()), sum(self.rollout.values()))

    @property
    def fits(self) -> bool:
        return self.peak <= self.gpu_bytes

    def to_text(self) -> str:
        gib = self.gpu_bytes / GiB
        lines = [
            f"memory plan for {self.model.name} ({self.model.params / 1e9:.2f} B parameters), "
            f"{self.launcher.description}, {gib:g} GiB per GPU (GiB per GPU; counted: sizes of known tensors; "
            "measured: bytes per token held to autograd's saved tensors by tests; estimate: not measured)",
        ]
        for phase, parts in (("update", self.update), ("rollout", self.rollout)):
            lines.append(f"  {phase} phase")
            for name, value in parts.items():
                lines.append(f"    {name:<52} {value / GiB:8.1f}  {basis(name, self.model)}")
            lines.append(f"    {'total':<52} {sum(parts.values()) / GiB:8.1f}")
        lines.append("  activations of one micro-batch, both ways")
        for name, value in self.activations.items():
            lines.append(f"    {name:<52} {value / GiB:8.1f}  {basis(name, self.model)}")
        verdict = "fits" if self.fits else "DOES NOT FIT"
        lines.append(f"  peak {self.peak / GiB:.1f} of {gib:g} GiB: {verdict}")
        lines.extend(f"  note: {note}" for note in self.notes)
        lines.extend(f"  warning: {warning}" for warning in self.warnings)
        return "\n".join(lines)


def basis(component: str, shape: ModelShape) -> str:
    """How a plan line's figure is known: counted (sizes of known tensors), measured (per-token bytes held
    to autograd's count by tests: the decoder layers) or estimate."""
    if component.startswith(("activations", "with", "without")):
        vision = "CLIP" if shape.kind == "llava" else "vision tower"
        return f"measured (decoder layers); {vision}: estimate"
    if component.startswith(("CUDA context", "vLLM engine", "prefill")):
        return "estimate"
    return "counted"


def plan_memory(
    recipe: Recipe, launcher: Launcher, gpu_memory_gib: float = 80.0, shape: ModelShape | None = None
) -> MemoryPlan:
    """Estimate the per-GPU memory of ``recipe`` under ``launcher`` on GPUs of ``gpu_memory_gib`` GiB."""
    if gpu_memory_gib <= 0:
        raise ConfigError(f"--gpu-memory must be positive, got {gpu_memory_gib}")
    shape = shape if shape is not None else model_shape(recipe.model.path)
    m, t, r = recipe.model, recipe.train, recipe.rollout
    gpus, shards, verl = launcher.gpus, launcher.shards, launcher.backend == "verl"
    gpu_bytes = int(gpu_memory_gib * GiB)
    notes: list[str] = []
    warnings: list[str] = []

    params = shape.params
    trainable = shape.lora_params(m.lora.r) if m.lora is not None else params
    param_bytes = FP32 if m.dtype == "float32" else BF16
    deepspeed = launcher.strategy in ("zero2", "zero3")

    # Static state (ZeRO paper's accounting). DeepSpeed with bf16 keeps bf16 parameters and gradients and
    # an fp32 master copy with Adam's m and v in the optimizer (2 + 2 + 12 bytes); torch (DDP, FSDP) keeps
    # gradients and AdamW's m and v in the parameters' dtype.
    update: dict[str, float] = {}
    if deepspeed:
        weights = params * BF16 / (gpus if launcher.strategy == "zero3" else 1)
        grads = trainable * BF16 / gpus
        optimizer = trainable * (FP32 * 3) / gpus
    else:
        weights = params * param_bytes / shards
        grads = trainable * param_bytes / shards
        optimizer = trainable * 2 * param_bytes / shards
    if launcher.offload_params:
        weights = 0.0
        notes.append("parameters offloaded to CPU memory (slower updates)")
    if launcher.offload_optimizer:
        optimizer = 0.0
        notes.append("optimizer states offloaded to CPU memory (slower updates)")
    update["weights"] = weights
    update["gradients"] = grads
    update["optimizer states (AdamW)"] = optimizer
    if launcher.strategy == "ddp":
        # torch DDP copies gradients into its all-reduce buckets (gradient_as_bucket_view=False, accelerate's
        # default), one more gradient-sized buffer.
        update["DDP gradient buckets"] = trainable * param_bytes
    if param_bytes == FP32 and t.precision != "fp32" and launcher.strategy in ("single", "ddp"):
        # bf16 autocast casts each fp32 weight once per forward and keeps the copy until it exits.
        update["bf16 weight copies (autocast)"] = params * BF16
    if shards > 1 and not deepspeed:
        # FSDP gathers one wrapped unit (a decoder layer; the embedding is the largest unit) at a time, in
        # bf16, and prefetches the next: two units in flight.
        unit = max(_layer_params(shape.text), shape.vocab * shape.text.hidden)
        update["gathered parameters (FSDP units in flight)"] = 2 * unit * BF16

    # Log-probs through the LM head (they do not grow with the micro-batch: both backends tile them).
    head = shape.vocab * shape.text.hidden
    # verl's fused kernels (what balcaprl renders for the packed Qwen2/2.5-VL): the LM head and
    # log-softmax in chunks; without them (LLaVA) every token's logits, counted with the activations.
    logits_per_token = 0 if shape.kind == "qwen2_vl" else shape.vocab * (BF16 + FP32)
    if verl and not logits_per_token:
        update[f"log-probs (verl fused kernels, {VERL_FUSED_CHUNK}-token chunks)"] = (
            VERL_FUSED_CHUNK * shape.vocab * (BF16 + FP32)
        )
    elif not verl:
        tile_tokens, tile_vocab = TRL_LOGPROB_TILE
        logprob = tile_tokens * min(tile_vocab, shape.vocab) * (BF16 + FP32)
        if shards > 1:
            logprob += head * param_bytes  # the fused head gathers the whole LM head weight
        if m.lora is None:
            logprob += head * FP32  # its weight gradient, accumulated in fp32 over the tiles
        update["log-probs (TRL fused LM head, tiles)"] = logprob

    # Activations of one micro-batch: prompt (image + text) + caption tokens, and the vision tower's tokens.
    image_tokens = shape.image_tokens(m.image.max_pixels)
    sequence = image_tokens + PROMPT_TEXT_TOKENS + r.max_caption_tokens
    token_budget = None
    if verl:
        # Token-balanced micro-batches (use_dynamic_bsz): as many tokens as the memory left holds.
        left = ACTIVATION_SHARE * (gpu_bytes - sum(update.values()) - RUNTIME_RESERVE_GIB * GiB)
        per_token = activation_bytes_per_token(shape, recipe, m.gradient_checkpointing) + logits_per_token
        token_budget = max(0, int(left // per_token) // TOKEN_BUDGET_STEP * TOKEN_BUDGET_STEP)
        if logits_per_token:
            update["logits (every token, bf16 + fp32 log-softmax)"] = token_budget * logits_per_token
        notes.append(
            f"verl micro-batches: at most {token_budget} tokens per GPU (use_dynamic_bsz, "
            f"ppo_max_token_len_per_gpu), {per_token / 2**20:.2f} MiB of activations and logits per token"
        )
        shown = f"{token_budget} tokens"
        both = {
            checkpointing: token_budget * activation_bytes_per_token(shape, recipe, checkpointing)
            for checkpointing in (True, False)
        }
    else:
        micro = t.per_device_batch_size
        shown = f"{micro} x {sequence} tokens"
        vision_tokens = micro * shape.vision_tokens(m.image.max_pixels)
        # A padded micro-batch under sdpa passes a dense mask of the padded width to every layer; packed rows
        # (train.padding_free, Qwen2/2.5-VL) take the variable-length route and none.
        packed = t.padding_free and shape.kind == "qwen2_vl"
        mask_width = sequence if not packed and m.attn_implementation in (None, "sdpa") else 0
        notes.append(
            "language model attention: "
            + (
                "packed rows, variable-length kernel, no mask"
                if packed
                else f"padded rows, {sequence}-wide mask"
            )
            + f" ({shape.text.layer_activation_bytes(mask_width):,} bytes per token per kept layer, measured "
            "arithmetic: autograd's saved tensors, tests)"
        )

        def micro_batch(checkpointing: bool, kept: int = 0) -> int:
            return shape.text.activation_bytes(micro * sequence, checkpointing, kept, mask_width) + (
                shape.vision.activation_bytes(vision_tokens, checkpointing)
            )

        both = {checkpointing: micro_batch(checkpointing) for checkpointing in (True, False)}
    kept = m.layers_without_recompute if m.gradient_checkpointing and not verl else 0
    label = "checkpointed" if m.gradient_checkpointing else "no checkpointing"
    if kept:
        label += f", last {kept} of {shape.text.layers} decoder layers kept"
        update[f"activations ({label})"] = micro_batch(True, kept)
    else:
        update[f"activations ({label})"] = both[m.gradient_checkpointing]
    activations = {
        f"with checkpointing ({shown})": both[True],
        f"without checkpointing ({shown})": both[False],
    }

    # Rollouts.
    captions = t.prompts_per_batch * r.rollouts_per_prompt
    per_gpu = math.ceil(captions / gpus)
    vllm_on = verl or r.vllm.mode == "colocate"
    rollout: dict[str, float] = {}
    resident = weights + optimizer + (grads if not verl else 0.0)  # verl frees gradients after the step
    rollout["training state kept during rollouts"] = resident
    if vllm_on:
        share = r.vllm.memory_share("verl" if verl else "trl")
        tp = r.vllm.tensor_parallel_size
        engine = share * gpu_bytes
        engine_weights = params * BF16 / tp
        kv_capacity = engine - engine_weights - VLLM_ENGINE_OVERHEAD_GIB * GiB
        rollout[f"vLLM engine ({share:g} of the GPU, TP {tp})"] = engine
        per_sequence = sequence * shape.text.kv_bytes_per_token() / tp
        if kv_capacity < per_sequence:
            warnings.append(
                f"the vLLM engine's {share:g} share leaves {max(kv_capacity, 0) / GiB:.1f} GiB for the KV cache, "
                f"less than one {sequence}-token caption needs ({per_sequence / GiB:.2f} GiB): raise "
                "rollout.vllm.gpu_memory_utilization or rollout.vllm.tensor_parallel_size"
            )
            kv_capacity = 0.0
        concurrent = int(kv_capacity // per_sequence) if per_sequence else 0
        notes.append(
            f"rollouts: the engine's KV cache ({kv_capacity / GiB:.1f} GiB) holds about {concurrent} captions "
            f"at once (prompt {image_tokens + PROMPT_TEXT_TOKENS} + caption {r.max_caption_tokens} tokens, "
            f"{shape.text.kv_bytes_per_token() // 1024} KiB per token); a GPU's share of a {captions}-caption "
            f"batch is {per_gpu}"
        )
        if concurrent < per_gpu:
            notes.append(f"rollouts run in about {math.ceil(per_gpu / max(concurrent, 1))} waves per GPU")
        if not r.vllm.sleeps(launcher.backend):
            update[f"vLLM engine, resident ({share:g} of the GPU)"] = engine
        else:
            notes.append("the vLLM engine sleeps during the update (weights and KV cache freed)")
    elif r.vllm.mode == "server":
        notes.append("rollouts: vLLM server on other GPUs (trl vllm-serve); nothing of it on these")
    else:
        # transformers generate: the whole local generation batch at once, in the model's dtype.
        if shards > 1:
            rollout["whole model gathered for generate"] = params * (BF16 if deepspeed else param_bytes)
        elif launcher.strategy in ("single", "ddp"):
            pass  # the weights are already whole
        rollout[f"KV cache of {per_gpu} captions at once (generate)"] = (
            per_gpu * sequence * shape.text.kv_bytes_per_token(param_bytes)
        )
        prefill = max(
            per_gpu * shape.vision_tokens(m.image.max_pixels) * shape.vision.layer_activation_bytes(),
            per_gpu * (image_tokens + PROMPT_TEXT_TOKENS) * shape.text.layer_activation_bytes(),
        )
        rollout["prefill of every prompt at once (one layer)"] = prefill * param_bytes / BF16

    reserve = RUNTIME_RESERVE_GIB * GiB
    update["CUDA context, NCCL, fragmentation (reserve)"] = reserve
    rollout["CUDA context, NCCL, fragmentation (reserve)"] = reserve
    most_kept = None
    if m.gradient_checkpointing and not verl:
        # Selective checkpointing: the most decoder layers whose activations leave HEADROOM_GIB free.
        left = (
            gpu_bytes
            - HEADROOM_GIB * GiB
            - sum(v for k, v in update.items() if not k.startswith("activations ("))
        )
        most_kept = next(
            (n for n in range(shape.text.layers, -1, -1) if micro_batch(True, n) <= left),
            None,
        )
        if most_kept is None:
            notes.append("selective checkpointing: not even full recompute fits this micro-batch")
        else:
            notes.append(
                f"selective checkpointing: up to {most_kept} of the {shape.text.layers} decoder layers can keep "
                f"their activations at {shown} with {HEADROOM_GIB:g} GiB free "
                f"(model.layers_without_recompute={most_kept}; the recipe has {kept})"
            )
    if not verl and (Path(recipe.data.path) / "dataset.json").is_file():
        notes.append(real_token_note(recipe, gpus))
    checkpoint, final, form = checkpoint_disk(shape, recipe, launcher)
    limit = recipe.run.save_total_limit
    kept = (
        f"at most {limit} kept: {limit * checkpoint / GiB:.1f} GiB"
        if limit
        else "all kept (run.save_total_limit)"
    )
    notes.append(
        f"disk: {checkpoint / GiB:.1f} GiB per checkpoint ({form}), {kept}; final/ {final / GiB:.1f} GiB"
    )
    plan = MemoryPlan(
        shape,
        launcher,
        gpu_bytes,
        update,
        rollout,
        activations,
        notes,
        warnings,
        token_budget=token_budget,
        layers_without_recompute=most_kept,
        checkpoint_bytes=checkpoint,
        final_bytes=final,
    )
    for phase, parts in (("update", update), ("rollout", rollout)):
        total = sum(parts.values())
        if total > gpu_bytes:
            biggest = max(parts, key=parts.get)
            warnings.append(
                f"the {phase} phase needs about {total / GiB:.1f} GiB per GPU, more than {gpu_memory_gib:g}; "
                f"the largest part is {biggest} ({parts[biggest] / GiB:.1f} GiB)"
            )
    return plan


def real_token_note(recipe: Recipe, gpus: int) -> str:
    """The real-token share of the update's micro-batches on the recipe's prepared data."""
    from balcaprl.plan.token_share import expected_share

    share = expected_share(recipe.data.path, recipe, gpus)
    source = "reference_tokens" if share.counted else "reference words x 4/3, an estimate"
    padded = f"padded rows would hold {share.share:.0%} real tokens"
    if recipe.train.padding_free:
        return f"real tokens on {recipe.data.path}: packed rows, 100%; {padded} (caption lengths: {source})"
    return f"real tokens on {recipe.data.path}: {padded}; packed rows (train.padding_free) 100% (caption lengths: {source})"


def checkpoint_disk(shape: ModelShape, recipe: Recipe, launcher: Launcher) -> tuple[float, float, str]:
    """Bytes of one checkpoint and of ``final/``, and the checkpoint's form.

    A checkpoint holds the weights (the adapter alone with LoRA) and AdamW's two moments, in the
    parameters' dtype under torch (DDP, FSDP, verl); DeepSpeed keeps bf16 weights and an fp32 master
    copy with fp32 moments (2 + 12 bytes per parameter) and writes 16-bit weights for loading besides.
    FSDP with FULL_STATE_DICT writes the weights twice (``save_pretrained`` and FSDP's own file).
    ``final/`` is the weights once, as ``save_pretrained`` writes them.
    """
    m = recipe.model
    param_bytes = FP32 if m.dtype == "float32" else BF16
    trainable = shape.lora_params(m.lora.r) if m.lora is not None else shape.params
    weights = trainable * FP32 if m.lora is not None else shape.params * param_bytes
    if launcher.strategy in ("zero2", "zero3"):
        return trainable * (BF16 + FP32 * 3) + shape.params * BF16, weights, "DeepSpeed"
    optimizer = trainable * 2 * param_bytes
    if launcher.strategy == "fsdp" and launcher.backend == "trl" and not launcher.sharded_checkpoints:
        return 2 * weights + optimizer, weights, "FSDP FULL_STATE_DICT: weights twice"
    form = "sharded" if launcher.strategy == "fsdp" else "whole"
    return weights + optimizer, weights, form


def activation_bytes_per_token(shape: ModelShape, recipe: Recipe, checkpointing: bool) -> float:
    """Activation bytes per sequence token of a packed micro-batch, the vision tower included.

    Each sequence brings one image (``vision_tokens`` through the tower) and the shortest caption brings
    the most images per token, so the worst case is an image with a one-token caption: per token,
    the LM's bytes plus the vision tower's for one image spread over ``image + prompt + 1`` tokens.
    """
    pixels = recipe.model.image.max_pixels
    shortest = shape.image_tokens(pixels) + PROMPT_TEXT_TOKENS + 1
    vision = shape.vision.activation_bytes(shape.vision_tokens(pixels), checkpointing)
    return shape.text.activation_bytes(1, checkpointing) + vision / shortest


def _layer_params(stack: Stack) -> int:
    mlp = 3 if stack.mlp == "swiglu" else 2
    return (
        2 * stack.hidden * stack.hidden
        + 2 * stack.hidden * stack.kv
        + mlp * stack.hidden * stack.intermediate
    )
