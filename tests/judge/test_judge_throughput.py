"""``concurrency: auto`` (balcaprl.judge.throughput): Little's law by hand, a bound that moves, and the
setting read from a config."""

from __future__ import annotations

import asyncio

from judge_testkit import config, judge_and_close, request

from balcaprl.judge import OpenAICompatibleJudge, load_judge_config
from balcaprl.judge.throughput import FIRST_LATENCY_S, Slots, auto_concurrency


def test_auto_concurrency_is_rate_times_latency_with_headroom():
    # 6,000 requests a minute = 100 a second; at 3 s each, 300 in flight keep it busy; +25%
    assert auto_concurrency(6000, None, 1000, 3.0, upper=4096) == 375
    # 60M tokens a minute at 20,000 tokens a call = 50 calls a second: the tighter limit wins
    assert auto_concurrency(6000, 60_000_000, 20_000, 3.0, upper=4096) == 188  # ceil(50 x 3 x 1.25)
    assert auto_concurrency(6000, None, 1000, 3.0, upper=256) == 256  # never above the bound
    assert auto_concurrency(None, None, 1000, 3.0, upper=512) == 512  # no limits: everything in flight
    assert auto_concurrency(1, None, 1000, 0.001, upper=512) == 1


def test_the_adaptive_limit_bounds_what_is_in_flight_and_can_grow():
    async def go():
        limit = Slots(2)
        peak, running = [0], [0]

        async def call():
            async with limit:
                running[0] += 1
                peak[0] = max(peak[0], running[0])
                await asyncio.sleep(0.01)
                running[0] -= 1

        await asyncio.gather(*(call() for _ in range(8)))
        first = peak[0]
        limit.limit, peak[0] = 5, 0
        await asyncio.gather(*(call() for _ in range(8)))
        return first, peak[0], limit.in_use

    first, second, in_use = asyncio.run(go())
    assert (first, second, in_use) == (2, 5, 0)


def test_observed_latency_is_a_high_quantile():
    limit = Slots(1, quantile=0.95)
    assert limit.latency_s() == FIRST_LATENCY_S
    for i in range(1, 21):
        limit.observe(float(i))
    assert limit.latency_s() == 19.0  # the 19th of 20


def test_concurrency_auto_in_a_config_and_shared_by_processes():
    cfg = load_judge_config({"concurrency": "auto", "requests_per_minute": 8000})
    assert (cfg.concurrency, cfg.concurrency_auto, cfg.auto_max_concurrency) == ("auto", True, 2048)
    shared = cfg.shared_by(8)
    assert (shared.concurrency, shared.auto_max_concurrency, shared.requests_per_minute) == (
        "auto",
        256,
        1000,
    )
    assert not load_judge_config({"concurrency": 64}).concurrency_auto


def test_auto_concurrency_over_http_follows_the_rate_limit(judge_server):
    server = judge_server(slow_s=0.2, always="slow")
    # 60 requests a minute = 1 a second: at most ceil(1 x 30 s x 1.25) = 38 in flight before any
    # latency is seen, and the limiter lets the first 60 through at once: the bound is what holds
    judge = OpenAICompatibleJudge(
        config(server.base_url, concurrency="auto", requests_per_minute=60, hedge=False)
    )
    outcomes = judge_and_close(judge, [request(caption=f"A red door, number {i}.") for i in range(50)])
    assert len(outcomes) == 50 and server.counters.total == 50
    assert server.counters.max_in_flight == 38
