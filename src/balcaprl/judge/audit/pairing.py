"""Pairing two judges' assertions about the same text, so their flags can be compared one by one.

Judges decompose a caption (and, in joint mode, the reference) themselves, and may split or word
the same content differently. The rule, for two lists x and y of assertion texts:

1. Texts are normalised: lower case, every run of non-letters/digits a single space, trimmed.
2. Exact pass: equal normalised texts pair up, the k-th occurrence in x with the k-th in y.
3. Similar pass: among what is left, every (i, j) whose token similarity (Dice coefficient of the
   two word multisets: 2|A ∩ B| / (|A| + |B|)) is at least ``threshold`` (0.5) is a candidate;
   candidates are taken greedily, most similar first, ties broken by the smaller position
   difference |i - j|, then by i, then by j; a taken assertion is not paired again.
4. Whatever is left is unpaired and counted (per side, per list); its flags are not compared.

Positions only break ties: a judge that lists the same assertions in another order still pairs
fully. A judge that merges two assertions into one pairs the merged one with the more similar half
and leaves the other half unpaired.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict, deque
from collections.abc import Sequence
from dataclasses import dataclass

_NON_WORD = re.compile(r"[^0-9a-z]+")
THRESHOLD = 0.5


def normalise(text: str) -> str:
    return _NON_WORD.sub(" ", text.lower()).strip()


def similarity(a: str, b: str) -> float:
    """Dice coefficient of the word multisets of two normalised texts (1 for equal, 0 for disjoint)."""
    x, y = Counter(a.split()), Counter(b.split())
    total = sum(x.values()) + sum(y.values())
    return 2 * sum((x & y).values()) / total if total else 1.0


@dataclass(frozen=True)
class Pairing:
    """Index pairs (i in x, j in y), and the indices of each list left unpaired."""

    pairs: tuple[tuple[int, int], ...]
    unpaired_x: tuple[int, ...]
    unpaired_y: tuple[int, ...]


def pair_assertions(x: Sequence[str], y: Sequence[str], threshold: float = THRESHOLD) -> Pairing:
    """Pair the assertion texts ``x`` and ``y`` by the rule in the module docstring."""
    if list(x) == list(y):  # the common case (one judge twice, same split): every i with itself
        return Pairing(pairs=tuple((i, i) for i in range(len(x))), unpaired_x=(), unpaired_y=())
    nx, ny = [normalise(t) for t in x], [normalise(t) for t in y]
    free_y: dict[str, deque[int]] = defaultdict(deque)
    for j, text in enumerate(ny):
        free_y[text].append(j)
    pairs: list[tuple[int, int]] = []
    left_x: list[int] = []
    for i, text in enumerate(nx):
        if free_y[text]:
            pairs.append((i, free_y[text].popleft()))
        else:
            left_x.append(i)
    left_y = sorted(j for queue in free_y.values() for j in queue)
    candidates = []
    for i in left_x:
        for j in left_y:
            score = similarity(nx[i], ny[j])
            if score >= threshold:
                candidates.append((-score, abs(i - j), i, j))
    taken_x, taken_y = set(), set()
    for _, _, i, j in sorted(candidates):
        if i not in taken_x and j not in taken_y:
            taken_x.add(i)
            taken_y.add(j)
            pairs.append((i, j))
    return Pairing(
        pairs=tuple(sorted(pairs)),
        unpaired_x=tuple(i for i in left_x if i not in taken_x),
        unpaired_y=tuple(j for j in left_y if j not in taken_y),
    )
