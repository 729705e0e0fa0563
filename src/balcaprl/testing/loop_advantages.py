"""Deliberately simple, loop-per-group versions of the advantage functions.

They exist only to check the vectorised ones in `advantages.py` (tests) and to measure how much
vectorisation buys (benchmarks). Plain Python over groups, no cleverness: easy to read against the
paper's eqs. 2.4-2.6 and the NaN rules of ``balcaprl.advantages``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch


def _normalize_within(values: list[float], eps: float) -> list[float]:
    """(x - mean) / (std + eps) over the non-NaN values (unbiased std); NaN -> 0; < 2 values -> 0."""
    kept = [v for v in values if not math.isnan(v)]
    if len(kept) < 2:
        return [0.0] * len(values)
    mean = sum(kept) / len(kept)
    std = math.sqrt(sum((v - mean) ** 2 for v in kept) / (len(kept) - 1))
    return [0.0 if math.isnan(v) else (v - mean) / (std + eps) for v in values]


def _groups(group_index: Sequence[int]) -> dict[int, list[int]]:
    members: dict[int, list[int]] = {}
    for row, gid in enumerate(group_index):
        members.setdefault(int(gid), []).append(row)
    return members


def loop_decoupled_sums(
    rewards: torch.Tensor, group_index: Sequence[int], weights: Sequence[float], eps: float = 1e-6
) -> list[float]:
    """A_sum of eq. 2.5 per rollout: per group and reward (r - mean) / (std + eps), weighted and summed."""
    table = rewards.tolist()
    summed = [0.0] * len(table)
    for rows in _groups(list(group_index)).values():
        for col in range(len(weights)):
            normalized = _normalize_within([table[r][col] for r in rows], eps)
            for r, a in zip(rows, normalized, strict=True):
                summed[r] += float(weights[col]) * a
    return summed


def loop_c_gdpo_advantages(
    rewards: torch.Tensor, group_index: Sequence[int], weights: Sequence[float], eps: float = 1e-6
) -> torch.Tensor:
    table = rewards.tolist()
    n = len(table)
    summed = loop_decoupled_sums(rewards, group_index, weights, eps)
    judged = [not all(math.isnan(v) for v in row) for row in table]
    kept = [a for a, ok in zip(summed, judged, strict=True) if ok]
    if not kept:
        return torch.zeros(n, dtype=rewards.dtype)
    # Eq. 2.6 over the judged rollouts of the batch.
    mean = sum(kept) / len(kept)
    std = math.sqrt(sum((a - mean) ** 2 for a in kept) / (len(kept) - 1)) if len(kept) >= 2 else 0.0
    out = [(a - mean) / (std + eps) if ok else 0.0 for a, ok in zip(summed, judged, strict=True)]
    return torch.tensor(out, dtype=rewards.dtype)


def loop_grpo_advantages(
    rewards: torch.Tensor, group_index: Sequence[int], weights: Sequence[float], eps: float = 1e-6
) -> torch.Tensor:
    table = rewards.tolist()
    aggregate = [sum(float(w) * v for w, v in zip(weights, row, strict=True)) for row in table]
    out = [0.0] * len(table)
    for rows in _groups(list(group_index)).values():
        for r, a in zip(rows, _normalize_within([aggregate[r] for r in rows], eps), strict=True):
            out[r] = a
    return torch.tensor(out, dtype=rewards.dtype)
