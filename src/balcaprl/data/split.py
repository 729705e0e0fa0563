"""The seeded train/eval split.

A sample goes to eval when ``sha256(f"{seed}:{id}")`` is among the ``eval_size`` smallest. Unlike a
shuffled index, this depends only on the seed and the ids: re-running after a few more images were
rejected (or fixed) moves only the samples whose ids changed, never reshuffles the whole split.
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Iterable


def split_key(seed: int, sample_id: str) -> bytes:
    return hashlib.sha256(f"{seed}:{sample_id}".encode()).digest()


def eval_ids(ids: Iterable[str], eval_size: int, seed: int) -> set[str]:
    """The ids of the ``eval_size`` samples that form the eval split (all of them if fewer)."""
    if eval_size < 0:
        raise ValueError(f"eval_size must be >= 0, got {eval_size}")
    return set(heapq.nsmallest(eval_size, ids, key=lambda i: split_key(seed, i)))
