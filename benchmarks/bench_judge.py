"""Judge client throughput against its concurrency bound, and the two reference modes compared.

1. Throughput: 1024 requests, concurrency 128, a loopback judge server (separate process, scripted
   judge) answering each call after 1.0 s. The best possible wall time is N / C x L = 8 s; the target
   is at most 1.10x that. Then a naive loop (one request at a time, the same client) on a 32-request
   sample, extrapolated to 1024: the time users would otherwise wait. Client and server share this
   machine's CPUs, so the CPU seconds each spends per request are printed too: a wave of 128 answers
   arriving together costs 128 x that before the last of them can start its next call, which is
   where the wall time above the bound goes. A bare aiohttp loop (the same calls, nothing else)
   says what the machine and the server allow at all.
2. Reference modes (skip with ``--skip-modes``; ``--skip-throughput`` skips part 1): joint vs cached-reference on synthetic groups of 8 rollouts; see
   ``balcaprl.testing.compare_modes`` for what these figures can and cannot show.

Run: ``.venv/bin/python benchmarks/bench_judge.py`` (about a minute). Not a timed test.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from balcaprl.judge import JudgeConfig, JudgeRequest, OpenAICompatibleJudge
from balcaprl.testing.compare_modes import _png, compare_reference_modes

# The scripted judge behind the loopback server, started directly (what the CLI's judge server runs
# with --latency), so the benchmark does not depend on the command's name.
_SERVER = (
    "import sys; from balcaprl.testing.judge_server import serve_forever; "
    "from balcaprl.testing.scripted_judge import ScriptedJudge; "
    "serve_forever(ScriptedJudge(latency_s=float(sys.argv[1])), on_ready=lambda url: print(url, flush=True))"
)


def _start_server(latency_s: float) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen(
        [sys.executable, "-c", _SERVER, str(latency_s)], stdout=subprocess.PIPE, text=True
    )
    line = process.stdout.readline() if process.stdout else ""
    if "http://" not in line:
        process.kill()
        raise RuntimeError(f"the judge server did not start (printed {line!r})")
    return process, line.split()[-1]


class _CpuClock:
    """CPU seconds (user + system) of this process and of the server process, to explain the ratio:
    client and server share this machine's cores, so their CPU per request is what the bound costs."""

    def __init__(self, server_pid: int):
        self._server_pid = server_pid

    def _server_cpu(self) -> float:
        try:
            import psutil
        except ImportError:  # Linux without psutil: fields 14 and 15 of /proc/<pid>/stat (utime,
            # stime, in clock ticks), the 12th and 13th after the ")" that ends the command name
            fields = Path(f"/proc/{self._server_pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        times = psutil.Process(self._server_pid).cpu_times()
        return times.user + times.system

    def read(self) -> tuple[float, float]:
        return time.process_time(), self._server_cpu()


def _requests(n: int, tag: str, group_size: int = 8) -> list[JudgeRequest]:
    reference = "A red door on the left. A black cat sits on the step. A green lamp hangs above."
    images = [_png(i) for i in range(n // group_size + 1)]
    return [
        JudgeRequest(
            image=images[i // group_size],
            caption=f"{tag} rollout {i}: a red door, a black cat.",
            reference=reference,
        )
        for i in range(n)
    ]


async def _bare_loop(base_url: str, n: int, concurrency: int, clock: _CpuClock) -> dict[str, float]:
    """The same calls with a bare aiohttp loop (no cache, no validation, no accounting): what the
    machine and the server allow at all, to tell the judge's own overhead from the environment's."""
    import json

    import aiohttp

    from balcaprl.judge.images import ImageLoader
    from balcaprl.judge.prompt import build_judge_messages
    from balcaprl.judge.rubrics import load_rubric
    from balcaprl.judge.schemas import json_response_format, verdict_schema

    rubric, loader = load_rubric("training"), ImageLoader(1024)
    bodies = [
        json.dumps({"model": "scripted", "max_completion_tokens": 4096,
                    "response_format": json_response_format(verdict_schema("training"), "verdict_training"),
                    "messages": build_judge_messages(rubric, loader.load(r.image), reference=r.reference,
                                                     caption=r.caption)}).encode()
        for r in _requests(n, "bare")
    ]  # fmt: skip
    gate = asyncio.Semaphore(concurrency)
    headers = {"Authorization": "Bearer EMPTY", "Content-Type": "application/json"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def one(i: int) -> None:
            async with (
                gate,
                session.post(f"{base_url}/chat/completions", data=bodies[i], headers=headers) as r,
            ):
                json.loads(await r.read())

        await asyncio.gather(*(one(i) for i in range(concurrency)))  # warm-up wave
        cpu, start = clock.read(), time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(n)))
        wall = time.perf_counter() - start
        client_cpu, server_cpu = (b - a for a, b in zip(cpu, clock.read(), strict=True))
    return {"wall_s": wall, "client_cpu_s": client_cpu, "server_cpu_s": server_cpu}


async def _throughput(
    base_url: str, n: int, concurrency: int, sample: int, cache: Path, clock: _CpuClock
) -> dict[str, float]:
    config = JudgeConfig(base_url=base_url, model="scripted", api_key_env=None, cache_path=cache,
                         concurrency=concurrency, timeout_s=60, max_retries=0)  # fmt: skip
    judge = OpenAICompatibleJudge(config)
    try:
        # One full wave first: a training run's pool is warm after its first step.
        await judge.judge_batch(_requests(concurrency, "warm-up"))
        requests = _requests(n, "concurrent")  # built outside the clock: the trainer's work, not the judge's
        cpu, start = clock.read(), time.perf_counter()
        result = await judge.judge_batch_with_stats(requests)
        concurrent = time.perf_counter() - start
        client_cpu, server_cpu = (b - a for a, b in zip(cpu, clock.read(), strict=True))
        failures = sum(result.stats.failures.values())
        start = time.perf_counter()
        for request in _requests(sample, "naive"):
            await judge.judge_batch([request])
        naive = time.perf_counter() - start
    finally:
        await judge.aclose()
    return {"concurrent_s": concurrent, "naive_sample_s": naive, "failures": failures,
            "p50": result.stats.as_dict()["latency_s"]["p50"], "client_cpu_s": client_cpu,
            "server_cpu_s": server_cpu}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=1024)
    parser.add_argument("--concurrency", type=int, default=128)
    parser.add_argument("--latency", type=float, default=1.0)
    parser.add_argument("--naive-sample", type=int, default=32)
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--skip-modes", action="store_true")
    args = parser.parse_args()

    if not args.skip_throughput:
        print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} before the run "
              "(other processes may share the CPUs)")  # fmt: skip
        process, base_url = _start_server(args.latency)
        clock = _CpuClock(process.pid)
        try:
            with tempfile.TemporaryDirectory() as tmp:
                figures = asyncio.run(
                    _throughput(
                        base_url, args.requests, args.concurrency, args.naive_sample, Path(tmp) / "c.sqlite",
                        clock,
                    )
                )  # fmt: skip
            bare_figures = asyncio.run(_bare_loop(base_url, args.requests, args.concurrency, clock))
            bare = bare_figures["wall_s"]
        finally:
            process.terminate()
            process.wait(timeout=10)
        bound = args.requests / args.concurrency * args.latency
        ratio = figures["concurrent_s"] / bound
        naive_projected = figures["naive_sample_s"] / args.naive_sample * args.requests
        print(f"throughput: {args.requests} requests, concurrency {args.concurrency}, server latency "
              f"{args.latency:.1f} s")  # fmt: skip
        print(f"  concurrent wall {figures['concurrent_s']:.2f} s vs bound {bound:.2f} s -> ratio {ratio:.3f}x "
              f"(target <= 1.10x; {'met' if ratio <= 1.10 else 'MISSED'}; failures {figures['failures']}, "
              f"call p50 {figures['p50']:.3f} s)")  # fmt: skip
        print(f"  bare aiohttp loop, same calls, same server: wall {bare:.2f} s -> ratio {bare / bound:.3f}x "
              f"(what this machine allows at all; the judge adds {figures['concurrent_s'] / bare - 1:+.1%})")  # fmt: skip
        ms = 1000 / args.requests
        for name, row in (("judge client", figures), ("bare aiohttp loop", bare_figures)):
            cpu = row["client_cpu_s"] + row["server_cpu_s"]
            print(f"  CPU per request, {name}: client {row['client_cpu_s'] * ms:.2f} ms + server "
                  f"{row['server_cpu_s'] * ms:.2f} ms = {cpu * ms:.2f} ms; {cpu:.1f} CPU-s over "
                  f"{os.cpu_count()} CPUs is {cpu / os.cpu_count() / bound:.0%} of the bound's wall time")  # fmt: skip
        print(f"  naive one-at-a-time: {args.naive_sample} requests in {figures['naive_sample_s']:.2f} s -> "
              f"{naive_projected:.0f} s projected for {args.requests} -> ratio {naive_projected / bound:.1f}x the bound "
              f"({naive_projected / figures['concurrent_s']:.1f}x slower than the concurrent client)")  # fmt: skip

    if not args.skip_modes:
        results = compare_reference_modes(n_prompts=64, group_size=8, reference_jitter=0.3, seed=0)
        joint, cached = results["joint"], results["cached-reference"]
        print("reference modes: 64 prompts x 8 rollouts, scripted judge, reference_jitter 0.3 (simulated)")
        print(
            f"  {'':<18}{'calls':>7}{'out tok/rollout':>17}{'in tok/rollout':>16}{'|O| spread (sd)':>17}{'groups varying':>16}"
        )
        for row in (joint, cached):
            print(f"  {row['mode']:<18}{row['calls']:>7}{row['completion_tokens_per_rollout']:>17.1f}"
                  f"{row['prompt_tokens_per_rollout']:>16.1f}{row['denominator_spread_mean']:>17.3f}"
                  f"{row['groups_with_varying_denominator']:>16.0%}")  # fmt: skip
        saving = 1 - cached["completion_tokens"] / joint["completion_tokens"]
        print(
            f"  cached-reference: {saving:.1%} fewer output tokens (decomposition calls included); "
            "denominator spread 0 by construction. Token counts ~4 chars/token; the joint-mode spread "
            "comes from the simulated jitter, not from a real judge."
        )


if __name__ == "__main__":
    main()
