"""Gradient reduction in bf16 (accelerate's FSDP2 with ``mixed_precision: bf16``) against fp32 (verl's
FSDP default ``reduce_dtype: fp32``): their effect on one AdamW update, on CPU.

accelerate 1.15 builds FSDP2's ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16)`` from
``mixed_precision: bf16`` and its config file has no key for the reduce dtype; verl 0.9.1 reduces in
fp32. Both compute each rank's gradient in bf16 (the parameters are gathered in bf16); they differ in
the sum over ranks. Here 8 "ranks" each run one micro-batch of a 2-layer Qwen2.5-VL language model
(width 256, bf16 compute, fp32 master weights), and the 8 bf16 gradients are reduced two ways:

* bf16: summed one rank after another in bf16 (a ring reduce-scatter's order), then divided by 8;
* fp32: each cast to fp32, summed, divided by 8.

Each reduced gradient feeds one AdamW step (the recipe's learning rate, 5e-6) from the same state; the
figures are the relative difference of the two gradients and of the two updates, and, for scale, the
same for two fp32 reductions of gradients computed in float32 against bf16 (the rounding both backends
already share). Not a test: figures.

    python benchmarks/bench_grad_reduce.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from balcaprl.plan.measured import LayerWidths, text_model  # noqa: E402

RANKS, LR = 8, 5e-6


def rank_gradients(dtype: torch.dtype) -> tuple[list[dict[str, torch.Tensor]], dict[str, torch.Tensor]]:
    """Each rank's gradients (computed in ``dtype``) and the fp32 master weights."""
    model = text_model(LayerWidths("qwen2_5_vl", 256, 4, 2, 704), layers=2, dtype=torch.float32)
    master = {n: p.detach().clone() for n, p in model.named_parameters()}
    model = model.to(dtype)
    grads = []
    for rank in range(RANKS):
        torch.manual_seed(100 + rank)
        ids = torch.randint(0, 256, (2, 96))
        model.zero_grad(set_to_none=True)
        model(input_ids=ids).last_hidden_state.float().square().mean().backward()
        grads.append({n: p.grad.detach().clone() for n, p in model.named_parameters()})
    return grads, master


def reduce_bf16(grads: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    out = {}
    for name in grads[0]:
        total = grads[0][name].to(torch.bfloat16)
        for g in grads[1:]:
            total = total + g[name].to(torch.bfloat16)  # bf16 + bf16 rounds to bf16 at every step
        out[name] = (total / RANKS).float()
    return out


def reduce_fp32(grads: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {name: sum(g[name].float() for g in grads) / RANKS for name in grads[0]}


def adamw_update(master: dict[str, torch.Tensor], grads: dict[str, torch.Tensor]) -> torch.Tensor:
    params = [master[n].clone().requires_grad_(True) for n in master]
    for p, n in zip(params, master, strict=True):
        p.grad = grads[n].clone()
    torch.optim.AdamW(params, lr=LR, weight_decay=0.0).step()
    return torch.cat([(p.detach() - master[n]).flatten() for p, n in zip(params, master, strict=True)])


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def flat(grads: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([g.flatten() for g in grads.values()])


def main() -> None:
    torch.manual_seed(0)
    bf16_grads, master = rank_gradients(torch.bfloat16)
    fp32_grads, _ = rank_gradients(torch.float32)
    g_bf16, g_fp32 = reduce_bf16(bf16_grads), reduce_fp32(bf16_grads)
    g_exact = reduce_fp32(fp32_grads)
    u_bf16, u_fp32, u_exact = (adamw_update(master, g) for g in (g_bf16, g_fp32, g_exact))
    flipped = (torch.sign(u_bf16) != torch.sign(u_fp32)).float().mean().item()
    print(f"{RANKS} ranks, {flat(g_fp32).numel():,} parameters, AdamW lr {LR:g}, one step")
    print(f"reduce in bf16 vs fp32 (bf16 gradients): gradient {relative(flat(g_bf16), flat(g_fp32)):.2e} relative, "
          f"update {relative(u_bf16, u_fp32):.2e} relative, {flipped:.2%} of update signs differ")  # fmt: skip
    print(f"for scale, bf16 vs fp32 gradients (both reduced in fp32): gradient "
          f"{relative(flat(g_fp32), flat(g_exact)):.2e}, update {relative(u_fp32, u_exact):.2e}")  # fmt: skip


if __name__ == "__main__":
    main()
