"""The GPU check: one script, one GPU, a few minutes, one JSON (``make gpu-check``; docs/gpu.md).

Needs torch and transformers only (what a bare GPU machine has): random weights from the public
configs' widths (no hub, no dataset, no judge), balcaprl's own modules from ``src/``. Five sections,
each timed and each kept in the JSON even when another fails:

1. ``driver``: what torch and the driver are (``balcaprl.train.driver.check_driver``); refused only
   when torch, a CUDA build, cannot use CUDA;
2. ``vision``: the Qwen2.5-VL vision tower at the 3B widths on a 1148 x 840 image, transformers' sdpa
   route (one call per window) against ``model.vision_attention: varlen_sdpa`` (the variable-length
   kernel on CUDA): largest difference of the outputs, forward + backward time of each;
3. ``layer_bytes``: bytes per token one decoder layer keeps for backward at the 3B widths, counted by
   autograd (``balcaprl.plan.measured``) without a mask, with a padding mask and packed, against the
   plan's ``Stack.layer_activation_bytes``;
4. ``packing``: a micro-batch of the length mix (``--lengths``, else a stand-in mix) through a few 3B
   decoder layers, padded (sdpa, padding mask) against packed (variable-length attention): time, the
   real-token share, and the largest difference of the real tokens' outputs;
5. ``update``: forward + backward of one micro-batch of the 3B recipe (``configs/qwen2_5_vl_3b.yaml``:
   ``train.per_device_batch_size`` captions at the caption cap, images at ``max_pixels``, its
   ``model.layers_without_recompute``, packed rows) on the whole 3B architecture: time, model FLOPs
   and MFU (``--peak-tflops``), and the peak memory against the plan's figure for the same parts
   (16-bit weights and gradients, activations, the log-prob chunk). No optimizer step.

    python benchmarks/gpu_check.py --out benchmarks/results/gpu_check.json       # one H200, < 8 minutes
    python benchmarks/gpu_check.py --tiny --out /tmp/gpu_check.json             # CPU, seconds (CI runs it)

``--tiny`` runs every section on 2-layer models of width 64 in float32 (bf16 for the byte counts).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402

from balcaprl.plan.measured import LayerWidths, saved_bytes_per_layer, text_model  # noqa: E402
from balcaprl.plan.memory import BF16, KNOWN_MODELS, model_shape  # noqa: E402
from balcaprl.train.varlen_attention import VARLEN, varlen_route  # noqa: E402

MODEL_ID = "Qwen/Qwen2.5-VL-3B-Instruct"
RECIPE = ROOT / "configs" / "qwen2_5_vl_3b.yaml"
IMAGE = (1148, 840)  # a ShareGPT4V-sized image within the recipe's max_pixels (41 x 30 = 1230 tokens)
GENERATION_PROMPTS, MICRO_ROWS = 32, 16  # the 3B recipe on 8 GPUs: 256 prompts / 8, 16 captions a micro-batch
PROMPT_TEXT = 64  # the chat template around the image (balcaprl.plan.memory.PROMPT_TEXT_TOKENS)
# Stand-in length mix when no --lengths file is given: captions of 80-1024 tokens (about 250 typical,
# a few at the cap), images of 300-1280 tokens. Replace it with the prepared data's (docs/gpu.md).
STAND_IN = [(300 + 61 * i % 981 + PROMPT_TEXT, min(1024, 80 + (137 * i) % 420 + (600 if i % 7 == 0 else 0)))
            for i in range(16)]  # fmt: skip


def device_and_dtype(tiny: bool) -> tuple[torch.device, torch.dtype]:
    cuda = torch.cuda.is_available() and not tiny
    return torch.device("cuda" if cuda else "cpu"), (torch.bfloat16 if cuda else torch.float32)


def timed(fn, repeats: int = 3) -> tuple[float, Any]:
    """Median seconds of ``repeats`` calls after one warm-up, and the last result."""
    result = fn()
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        result = fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def recipe_knobs() -> dict[str, int]:
    """The 3B recipe's memory knobs, read with YAML alone (the recipe schema needs pydantic)."""
    import yaml

    data = yaml.safe_load(RECIPE.read_text(encoding="utf-8"))
    return {
        "kept": int(data["model"]["layers_without_recompute"]),
        "micro": int(data["train"]["per_device_batch_size"]),
        "caption": int(data["rollout"]["max_caption_tokens"]),
        "max_pixels": int(data["model"]["image"]["max_pixels"]),
    }


# ------------------------------------------------------------------------------------------ configs


def qwen_config(tiny: bool, text_layers: int | None = None, vision_depth: int | None = None):
    from transformers import Qwen2_5_VLConfig

    config, _ = KNOWN_MODELS[MODEL_ID]
    text = {k: v for k, v in config.items() if k not in ("model_type", "vision_config")}
    text["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [16, 24, 24]}
    vision = dict(config["vision_config"], window_size=112, fullatt_block_indexes=[7, 15, 23, 31])
    if tiny:
        text |= dict(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2,
                     rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 3, 3]})  # fmt: skip
        vision |= dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                       fullatt_block_indexes=[1])  # fmt: skip
    if text_layers is not None:
        text["num_hidden_layers"] = text_layers
    if vision_depth is not None:
        vision["depth"] = vision_depth
        vision["fullatt_block_indexes"] = [
            i for i in vision["fullatt_block_indexes"] if i < vision_depth
        ] or [vision_depth - 1]
    hf = Qwen2_5_VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=True)
    hf.image_token_id, hf.video_token_id = 151655 % text["vocab_size"], 151656 % text["vocab_size"]
    hf.vision_start_token_id = 151652 % text["vocab_size"]
    return hf


def build(model_class, config, device, dtype):
    torch.manual_seed(0)
    with torch.device(device):
        model = model_class(config)
    return model.to(dtype).train()


def image_inputs(
    config, size: tuple[int, int], images: int, device, dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random pixel rows and the grid of ``images`` images of ``size`` (w, h) on the 28-pixel grid."""
    vision = config.vision_config
    patch, merge = vision.patch_size, vision.spatial_merge_size
    w, h = (max(merge, round(side / (patch * merge)) * merge) for side in size)
    grid = torch.tensor([[1, h, w]] * images, device=device)
    row = vision.in_channels * vision.temporal_patch_size * patch * patch
    pixels = torch.randn(images * h * w, row, device=device, dtype=dtype)
    return pixels, grid


# ----------------------------------------------------------------------------------------- sections


def section_driver() -> dict[str, Any]:
    from balcaprl.train.driver import check_driver, installed_driver

    out: dict[str, Any] = {
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "driver": installed_driver(),
        "cuda_available": torch.cuda.is_available(),
        "python": platform.python_version(),
    }
    if torch.cuda.is_available():
        out["device"] = torch.cuda.get_device_name(0)
        out["memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
    try:
        out["seen"], out["refused"] = check_driver(), False
    except Exception as error:  # ConfigError: what cannot run
        out["seen"], out["refused"] = str(error), True
    return out


def section_vision(tiny: bool) -> dict[str, Any]:
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

    from balcaprl.train.vision_attention import VARLEN_SDPA, use_varlen_vision_attention

    device, dtype = device_and_dtype(tiny)
    config = qwen_config(tiny, vision_depth=None if tiny else 8)
    vision_config = config.vision_config
    vision_config._attn_implementation = "sdpa"
    model = build(Qwen2_5_VisionTransformerPretrainedModel, vision_config, device, dtype)
    pixels, grid = image_inputs(config, (112, 84) if tiny else IMAGE, 1, device, dtype)

    def run():
        model.zero_grad(set_to_none=True)
        out = model(pixels, grid_thw=grid)
        merged = getattr(out, "pooler_output", None)
        merged = out.last_hidden_state if merged is None else merged
        merged.float().square().mean().backward()
        return merged.detach().float()

    results, times = {}, {}
    for name in ("sdpa", VARLEN_SDPA):
        if name == VARLEN_SDPA:
            use_varlen_vision_attention(model)
        else:
            vision_config._attn_implementation = "sdpa"
        times[name], results[name] = timed(run)
    diff = (results["sdpa"] - results[VARLEN_SDPA]).abs().max().item()
    scale = results["sdpa"].abs().max().item()
    return {
        "layers": vision_config.depth,
        "patches": int(pixels.shape[0]),
        "route": varlen_route(device),
        "seconds_fwd_bwd": {"sdpa_per_window": times["sdpa"], "varlen": times[VARLEN_SDPA]},
        "speedup": times["sdpa"] / times[VARLEN_SDPA],
        "max_abs_diff": diff,
        "max_abs_output": scale,
        "equal": diff <= (1e-4 if dtype == torch.float32 else 2e-2) * max(1.0, scale),
    }


def section_layer_bytes(tiny: bool) -> dict[str, Any]:
    device = device_and_dtype(tiny)[0]
    stack = model_shape(MODEL_ID).text
    widths = LayerWidths("qwen2_5_vl", stack.hidden, stack.heads, stack.kv_heads, stack.intermediate)
    if tiny:
        widths = LayerWidths("qwen2_5_vl", 64, 4, 2, 128)
    model = text_model(widths, layers=2, attn=VARLEN).to(device)
    length = 64 if tiny else 2368  # the recipe's row: 1280 image + 64 prompt + 1024 caption tokens
    real = [length // 3, length - length // 3]
    loop_extra = BF16 * widths.hidden if varlen_route(device) == "loop" else 0  # CPU: outputs concatenated
    cases = {
        "no_mask": (saved_bytes_per_layer(model, 1, length, "none", device=str(device)), 0, 0),
        "padding_mask": (saved_bytes_per_layer(model, 1, length, "padding", device=str(device)), length, 0),
        "packed": (
            saved_bytes_per_layer(model, 2, 0, "packed", device=str(device), real=real),
            0,
            loop_extra,
        ),
    }
    from balcaprl.plan.memory import Stack

    plan_stack = Stack(2, widths.hidden, widths.heads, widths.kv_heads, widths.intermediate, "swiglu")
    out: dict[str, Any] = {"tokens": length, "widths": widths.__dict__, "route": varlen_route(device)}
    for name, (counts, mask, extra) in cases.items():
        measured = counts[-1] / length
        planned = plan_stack.layer_activation_bytes(mask) + extra
        out[name] = {"measured": measured, "plan": planned, "ratio": measured / planned}
    out["within_5_percent"] = all(abs(out[n]["ratio"] - 1) <= 0.05 for n in cases)
    return out


def read_lengths(path: str | None) -> list[tuple[int, int]]:
    if path is None:
        return STAND_IN
    return [(int(p), int(c)) for p, c in json.loads(Path(path).read_text(encoding="utf-8"))]


def section_packing(tiny: bool, lengths: list[tuple[int, int]]) -> dict[str, Any]:
    device, dtype = device_and_dtype(tiny)
    source = "stand-in mix" if lengths is STAND_IN else "from --lengths"
    stack = model_shape(MODEL_ID).text
    widths = LayerWidths("qwen2_5_vl", stack.hidden, stack.heads, stack.kv_heads, stack.intermediate)
    if tiny:
        widths = LayerWidths("qwen2_5_vl", 64, 4, 2, 128)
        lengths = [(max(2, p // 40), max(1, c // 40)) for p, c in lengths]
    model = text_model(widths, layers=2 if tiny else 4, attn=VARLEN, dtype=dtype).to(device)
    from balcaprl.plan.token_share import Lengths, padded_batches

    # TRL pads a GPU's generation batch (the recipe: 256 captions, 32 prompts x 8) to its longest prompt
    # + longest caption; one micro-batch (16 captions) of it runs here, one caption per prompt.
    generation = lengths[:GENERATION_PROMPTS]
    width = max(p for p, _ in generation) + max(c for _, c in generation)
    rows = [p + c for p, c in generation[:MICRO_ROWS]]
    whole = padded_batches([Lengths(p, c) for p, c in lengths], GENERATION_PROMPTS, rollouts=8)
    torch.manual_seed(1)
    ids = torch.randint(0, 256, (len(rows), width), device=device)
    mask = torch.zeros(len(rows), width, dtype=torch.long, device=device)
    for i, n in enumerate(rows):
        mask[i, :n] = 1
    flat = ids[mask.bool()][None]
    text = torch.cat([torch.arange(n, device=device) for n in rows])[None]
    positions = torch.cat([text[None], text[None].expand(3, -1, -1)])

    def padded():
        model.zero_grad(set_to_none=True)
        out = model(input_ids=ids, attention_mask=mask).last_hidden_state
        out[mask.bool()].float().square().mean().backward()
        return out[mask.bool()].detach().float()

    def packed():
        model.zero_grad(set_to_none=True)
        out = model(input_ids=flat, position_ids=positions).last_hidden_state[0]
        out.float().square().mean().backward()
        return out.detach().float()

    t_padded, a = timed(padded)
    t_packed, b = timed(packed)
    return {
        "rows": len(rows),
        "real_tokens": sum(rows),
        "padded_tokens": len(rows) * width,
        "real_token_share": sum(rows) / (len(rows) * width),
        "real_token_share_whole_mix": whole.share,
        "samples_in_mix": len(lengths),
        "lengths": source,
        "seconds_fwd_bwd": {"padded_sdpa": t_padded, "packed_varlen": t_packed},
        "speedup": t_padded / t_packed,
        "max_abs_diff": (a - b).abs().max().item(),
        "route": varlen_route(device),
    }


def chunked_logprob_loss(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, chunk: int):
    """Sum of -log p(label) over the labelled tokens, the LM head in ``chunk``-token pieces recomputed in
    backward (what TRL's fused head does: never the whole tokens x vocabulary matrix)."""
    from torch.utils.checkpoint import checkpoint

    def piece(h, y):
        logp = torch.log_softmax((h @ weight.T).float(), dim=-1)
        return -logp.gather(-1, y.clamp(min=0)[:, None]).squeeze(-1).masked_fill(y < 0, 0).sum()

    total = hidden.new_zeros((), dtype=torch.float32)
    for start in range(0, hidden.shape[0], chunk):
        total = total + checkpoint(piece, hidden[start : start + chunk], labels[start : start + chunk],
                                   use_reentrant=False)  # fmt: skip
    return total


def section_update(tiny: bool, peak_tflops: float) -> dict[str, Any]:
    from transformers import Qwen2_5_VLForConditionalGeneration

    from balcaprl.train.modeling import keep_activations
    from balcaprl.train.packing import pack_rows
    from balcaprl.train.varlen_attention import use_varlen_text_attention
    from balcaprl.train.vision_attention import use_varlen_vision_attention

    device, dtype = device_and_dtype(tiny)
    knobs = recipe_knobs()
    config = qwen_config(tiny)
    if tiny:
        knobs |= {"kept": 1, "micro": 2, "caption": 16}
    config._attn_implementation = "sdpa"
    config.text_config._attn_implementation = "sdpa"
    model = build(Qwen2_5_VLForConditionalGeneration, config, device, dtype)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    kept = keep_activations(model, knobs["kept"])
    use_varlen_vision_attention(model)
    use_varlen_text_attention(model.model)
    side = 28 * 40 if not tiny else 56  # 1120 x 896: 40 x 32 = 1280 image tokens, the recipe's max_pixels
    pixels, grid = image_inputs(config, (side, side * 4 // 5), knobs["micro"], device, dtype)
    image_tokens = int(grid[0, 1] * grid[0, 2]) // 4
    vocab = config.text_config.vocab_size
    row = [config.vision_start_token_id] + [config.image_token_id] * image_tokens
    row += [7] * (PROMPT_TEXT - 1) + [11 + i % 50 for i in range(knobs["caption"])]
    ids = torch.tensor([row] * knobs["micro"], device=device)
    attention = torch.ones_like(ids)
    types = (ids == config.image_token_id).long()
    inner = model.model
    packed = pack_rows(inner, ids, attention, grid, types)
    labels = ids.clone()
    labels[:, : -knobs["caption"]] = -100
    labels = torch.cat([labels[:, 1:], labels.new_full((labels.shape[0], 1), -100)], dim=1).reshape(-1)
    weight = model.lm_head.weight
    scored = labels >= 0

    def step():
        model.zero_grad(set_to_none=True)
        out = inner(**packed, pixel_values=pixels, image_grid_thw=grid).last_hidden_state[0]
        loss = chunked_logprob_loss(out[scored], weight, labels[scored], 4096)  # caption tokens only, as TRL
        loss.backward()
        return loss.detach()

    if torch.cuda.is_available() and not tiny:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    seconds, _ = timed(step, repeats=2)
    peak = torch.cuda.max_memory_allocated() if torch.cuda.is_available() and not tiny else None

    shape = model_shape(MODEL_ID)
    tokens = ids.numel()
    patches = int(pixels.shape[0])
    params = sum(p.numel() for p in model.parameters())
    vision_params = sum(p.numel() for p in model.model.visual.parameters())
    embed = vocab * config.text_config.hidden_size
    lm_params = params - vision_params - embed  # tied head: counted once, over the caption tokens below
    text = config.text_config
    caption_tokens = knobs["micro"] * knobs["caption"]
    length = len(row)
    # Model FLOPs, 3 passes (forward + backward), recompute not counted: 2 x parameters per token, causal
    # attention scores and values (2 x 2 x L/2 x hidden a token a layer), the vision tower's parameters
    # (the merger included) per patch and its attention (64-patch windows, whole images in 4 layers).
    vcfg = config.vision_config
    full_layers = len(vcfg.fullatt_block_indexes)
    per_image = patches // knobs["micro"]
    vision_attention = (
        4
        * vcfg.hidden_size
        * patches
        * ((vcfg.depth - full_layers) * min(64, per_image) + full_layers * per_image)
    )
    flops = 3 * (
        2 * lm_params * tokens
        + 2 * embed * caption_tokens
        + 2 * text.num_hidden_layers * text.hidden_size * length * tokens
        + 2 * vision_params * patches
        + vision_attention
    )
    out: dict[str, Any] = {
        "micro_batch": knobs["micro"],
        "tokens": tokens,
        "patches": patches,
        "layers_kept": len(kept),
        "seconds_fwd_bwd": seconds,
        "model_tflop": flops / 1e12,
        "tflops": flops / seconds / 1e12,
    }
    out["mfu"] = out["tflops"] / peak_tflops if peak is not None else None
    if not tiny:
        activations = shape.text.activation_bytes(
            tokens, True, knobs["kept"]
        ) + shape.vision.activation_bytes(patches, True)
        planned = 2 * shape.params * BF16 + activations + 4096 * shape.vocab * (BF16 + 4)
        out["plan_gib"] = {"weights_and_gradients": 2 * shape.params * BF16 / 2**30,
                           "activations": activations / 2**30, "total": planned / 2**30}  # fmt: skip
        out["peak_gib"] = peak / 2**30
        out["peak_over_plan"] = peak / planned
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "gpu_check.json"))
    parser.add_argument("--tiny", action="store_true", help="2-layer models on the CPU (CI)")
    parser.add_argument("--lengths", help="JSON list of [prompt, caption] token counts (the length mix)")
    parser.add_argument("--peak-tflops", type=float, default=989.4, help="dense bf16 peak (H100/H200: 989.4)")
    parser.add_argument("--only", help="comma-separated sections to run")
    args = parser.parse_args(argv)
    sections = {
        "driver": section_driver,
        "vision": lambda: section_vision(args.tiny),
        "layer_bytes": lambda: section_layer_bytes(args.tiny),
        "packing": lambda: section_packing(args.tiny, read_lengths(args.lengths)),
        "update": lambda: section_update(args.tiny, args.peak_tflops),
    }
    chosen = args.only.split(",") if args.only else list(sections)
    report: dict[str, Any] = {"tiny": args.tiny, "machine": platform.node(), "started": time.time()}
    failed = False
    for name in chosen:
        start = time.perf_counter()
        try:
            report[name] = sections[name]()
        except Exception as error:  # keep the other sections' figures
            failed = True
            report[name] = {
                "error": f"{type(error).__name__}: {error}",
                "trace": traceback.format_exc()[-2000:],
            }
        report[name]["seconds"] = time.perf_counter() - start
        print(f"{name}: {json.dumps(report[name], default=str)[:400]}", flush=True)
        if name == "driver" and report[name].get("refused") and not args.tiny:
            failed = True
            break
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
    print(f"wrote {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
