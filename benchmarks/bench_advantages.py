"""c-GDPO on a training-sized batch: the vectorised implementation against the simple loop.

N = 16384 rollouts (2048 prompts x 8), K = 3 rewards, some failed judges. Prints medians and the
speed-up ratio measured in the same run (machines are noisy; the ratio is what to compare). The
target: the vectorised one well under 5 ms, so advantages are never the bottleneck of a step.
"""

from __future__ import annotations

import statistics
import time

import torch

from balcaprl import c_gdpo_advantages, grpo_advantages
from balcaprl.testing.loop_advantages import loop_c_gdpo_advantages


def median_ms(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> None:
    torch.manual_seed(0)
    n, group_size, weights = 16384, 8, [0.1, 0.3, 0.3]
    rewards = torch.rand(n, 3)
    rewards[torch.rand(n) < 0.01] = float("nan")  # ~1% failed judges
    groups = torch.arange(n // group_size).repeat_interleave(group_size)

    vectorised = median_ms(lambda: c_gdpo_advantages(rewards, groups, weights), repeats=50)
    grpo = median_ms(lambda: grpo_advantages(rewards, groups, weights), repeats=50)
    loop = median_ms(lambda: loop_c_gdpo_advantages(rewards, groups.tolist(), weights), repeats=3)
    same = torch.allclose(
        c_gdpo_advantages(rewards.double(), groups, weights),
        loop_c_gdpo_advantages(rewards.double(), groups.tolist(), weights),
        atol=1e-9,
    )
    print(
        f"c-GDPO advantages, N={n} (groups of {group_size}), K=3, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads"
    )
    print(f"  vectorised c-GDPO : {vectorised:8.2f} ms   (target < 5 ms)")
    print(f"  vectorised GRPO   : {grpo:8.2f} ms")
    print(f"  simple loop c-GDPO: {loop:8.2f} ms")
    print(f"  speed-up (loop / vectorised): {loop / vectorised:.1f}x   results agree: {same}")


if __name__ == "__main__":
    main()
