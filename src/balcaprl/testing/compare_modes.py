"""Measure the two reference modes side by side: judge output tokens and the recall denominator.

Runs the real client against the loopback server with the scripted judge on synthetic groups (one
reference and G rollout captions per prompt), once per mode, and reports per rollout: calls,
completion (output) tokens, and the within-group spread of |O|, the recall denominator.

What this can and cannot show. The scripted judge's output is a JSON verdict whose size follows
mechanically from the texts, and the server's token counts are ~4 characters a token, so the token
ratio is an honest estimate of the *structural* saving (coverage marks instead of re-written
reference assertions), not a measurement of a real model's verbosity. The denominator spread in
joint mode comes from ``reference_jitter``, a simulated decomposition instability whose size is a
free parameter; cached-reference mode has spread 0 by construction (one decomposition per
reference). How unstable a real judge's decomposition is must be measured against that judge.
"""

from __future__ import annotations

import asyncio
import io
import random
import statistics
from typing import Any

from PIL import Image

from balcaprl.judge.client import OpenAICompatibleJudge
from balcaprl.judge.config import JudgeConfig
from balcaprl.judge.protocol import JudgeFailure, JudgeRequest
from balcaprl.testing.judge_server import JudgeServer
from balcaprl.testing.scripted_judge import ScriptedJudge

_COLOURS = ["red", "blue", "green", "yellow", "white", "black", "orange", "purple"]
_OBJECTS = ["door", "cat", "car", "tree", "lamp", "bench", "dog", "bicycle", "window", "sign", "boat", "kite"]
_PLACES = [
    "on the left",
    "on the right",
    "in the middle",
    "in the background",
    "near the top",
    "at the bottom",
]
_COMMENTARY = ["the scene has a calm atmosphere", "the composition adds depth", "it feels inviting"]


def _png(index: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (48, 48), ((index * 37) % 256, (index * 91) % 256, (index * 53) % 256)).save(
        buffer, "PNG"
    )
    return buffer.getvalue()


def synthetic_groups(n_prompts: int, group_size: int, seed: int = 0) -> list[JudgeRequest]:
    """``n_prompts * group_size`` requests; the rollouts of one prompt are consecutive and share the
    image and the reference (6 clauses); each caption mentions a random subset of the reference's
    clauses, sometimes a hallucinated object and sometimes commentary."""
    rng = random.Random(seed)
    requests = []
    for p in range(n_prompts):
        image = _png(p)
        facts = [f"a {rng.choice(_COLOURS)} {o} {rng.choice(_PLACES)}" for o in rng.sample(_OBJECTS, 6)]
        reference = ". ".join(f.capitalize() for f in facts) + "."
        for _ in range(group_size):
            said = rng.sample(facts, rng.randint(2, 6))
            if rng.random() < 0.5:
                said.append(f"a {rng.choice(_COLOURS)} elephant {rng.choice(_PLACES)}")
            if rng.random() < 0.3:
                said.append(rng.choice(_COMMENTARY))
            requests.append(JudgeRequest(image=image, caption=", ".join(said) + ".", reference=reference))
    return requests


async def _run(base_url: str, mode: str, requests: list[JudgeRequest], group_size: int) -> dict[str, Any]:
    config = JudgeConfig(base_url=base_url, model="scripted", api_key_env=None, cache_path=None,
                         reference_mode=mode, concurrency=64, timeout_s=30, max_retries=0)  # fmt: skip
    judge = OpenAICompatibleJudge(config)
    try:
        result = await judge.judge_batch_with_stats(requests)
    finally:
        await judge.aclose()
    spreads, non_constant = [], 0
    for start in range(0, len(requests), group_size):
        group = result.outcomes[start : start + group_size]
        sizes = [len(o.verdict.reference_assertions) for o in group if not isinstance(o, JudgeFailure)]
        spread = statistics.pstdev(sizes) if len(sizes) > 1 else 0.0
        spreads.append(spread)
        non_constant += len(set(sizes)) > 1
    n = len(requests)
    stats = result.stats
    return {
        "mode": mode,
        "rollouts": n,
        "failures": sum(isinstance(o, JudgeFailure) for o in result.outcomes),
        "calls": stats.calls,
        "completion_tokens": stats.completion_tokens,
        "completion_tokens_per_rollout": stats.completion_tokens / n,
        "prompt_tokens_per_rollout": stats.prompt_tokens / n,
        "denominator_spread_mean": statistics.fmean(spreads),
        "groups_with_varying_denominator": non_constant / len(spreads),
    }


def compare_reference_modes(
    n_prompts: int = 64, group_size: int = 8, reference_jitter: float = 0.3, seed: int = 0
) -> dict[str, dict[str, Any]]:
    """Both modes on the same synthetic groups; returns ``{"joint": {...}, "cached-reference": {...}}``."""
    requests = synthetic_groups(n_prompts, group_size, seed)
    with JudgeServer(ScriptedJudge(reference_jitter=reference_jitter)) as server:
        return {
            mode: asyncio.run(_run(server.base_url, mode, requests, group_size))
            for mode in ("joint", "cached-reference")
        }
