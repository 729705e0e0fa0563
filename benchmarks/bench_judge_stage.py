"""The judge stage of a training step at a real judge's speed, under four schedules at equal
concurrency, in one run.

A loopback judge server (separate process, the scripted judge) answers at a real endpoint's speed
(:class:`~balcaprl.testing.judge_server.LatencyModel`: a heavy-tailed, lognormal time to the first
token, then a decode time growing with the caption; stalls longer than any timeout; 429s above an
RPM cap; streamed answers trickled in pieces). A simulated generator plays a step of ``--processes``
GPU processes: each finishes its rollouts at staggered times (longer captions later), its generation
ends, then its old-log-prob forward runs ``--logprob-s``. The project's real judge client
(:class:`~balcaprl.judge.client.OpenAICompatibleJudge`, one per process with its share of the
limits, through :class:`~balcaprl.train.early_judge.EarlyJudge` as the trainer uses it, kept from step
to step: at each process's end of generation it tells the judge when the rewards will be wanted, from
the previous step, so from the second step on the client hedges against that deadline) scores the
rollouts under each schedule, every one with the same client settings, the client's defaults
(``--concurrency``: ``auto`` by default, or a number; the same rate limits; streamed, with the
first-byte and chunk-gap limits, unless ``--no-stream``):

- ``today``: judging starts after generation and the old-log-prob forward (TRL 1.16);
- ``after_generation``: judging starts when the process's completions exist;
- ``per_rollout``: each rollout is judged as soon as it finishes;
- ``per_rollout_unhedged``: the same without the client's hedging (``judge/tail.py``), on by default
  and in the three others.

Per step (``--steps`` seeded steps): generation time, rewards-ready time, the exposed judge time
(rewards ready minus the end of generation and old log-probs, over all processes: TRL gathers the
rewards), calls, hedges, failures, stalls and 429s served, the client's CPU per call, and the stage
against its ideal. The ideal is defined once, for every schedule (:data:`IDEAL`): every call in
flight at once from when its schedule starts it (no concurrency bound, no rate limit), each taking
its first attempt's latency as the latency model draws it -- stalls included: a stalled first attempt
takes the hedge floor (the soonest a client can tell a stall from a long call) plus its second
attempt's latency, and so does any first attempt slower than that (what a duplicate at the floor
would give), so no schedule of this client can beat it. In the same run, every schedule's rewards and
``c_gdpo_advantages`` are compared with today's, bit for bit.

Times are a real endpoint's divided by ``--time-scale`` (default 10: median call about 0.6 s, p99
about 3 s, generation 6 s); the client's rate-limit minute and first latency guess are scaled too.
Two sizes:

- the default (``make bench``): 4 steps of 512 rollouts over 8 processes, the server's RPM cap and
  the stated limits scaled by 512/2,048; results in ``benchmarks/results/judge_stage_quick.json``;
- ``--paper``: the paper-shaped step, 2,048 rollouts over 8 processes at the recipe's limits
  (``--steps`` of them, default 20); results in ``benchmarks/results/judge_stage.json`` (the figures in
  docs/measurements.md).

Run: ``nice -n 10 .venv/bin/python benchmarks/bench_judge_stage.py [--paper]``; ``--steps``,
``--rollouts`` and the limits override either size. Not a timed test: every figure is a ratio
against a baseline of the same run, or a count. Where CPU, not latency, bounds a run (the client
and the loopback server need more CPU in a step than its ideal stage leaves the cores they can get:
C cores / load average), the summary says so and gives the client CPU per call.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from balcaprl.advantages import c_gdpo_advantages
from balcaprl.judge import JudgeConfig, JudgeFailure, JudgeRequest, throughput
from balcaprl.judge.client import build_judge
from balcaprl.judge.outcomes import rewards_tensor
from balcaprl.testing.compare_modes import _png
from balcaprl.testing.judge_server import LatencyModel
from balcaprl.train.early_judge import EarlyJudge

RESULTS = Path(__file__).parent / "results" / "judge_stage.json"  # the --paper run
QUICK_RESULTS = RESULTS.with_name("judge_stage_quick.json")
PAPER_ROLLOUTS = 2048  # a paper step: 256 prompts x 8 rollouts
# The sizes: (steps, rollouts per step). The limits below are the paper step's, scaled with the rollouts.
SIZES = {"quick": (4, 512), "paper": (20, PAPER_ROLLOUTS)}
PAPER_LIMITS = {"rpm_cap": 10_000}  # the server's requests per minute (and the client's stated limit)
SCHEDULES = ("today", "after_generation", "per_rollout", "per_rollout_unhedged")
# A step's shape in real seconds (the defaults of --processes, --group-size, --generation-s,
# --logprob-s, --stall-p; benchmarks/replay_hedging.py replays the same steps).
PROCESSES, GROUP_SIZE, GENERATION_S, LOGPROB_S, STALL_P = 8, 8, 60.0, 15.0, 0.003


def latency_model(
    time_scale: float = 1.0, stall_p: float = STALL_P, rpm_cap: int | None = None
) -> LatencyModel:
    """The judge's latency in this benchmark. Captions a third of a real one's length (the loopback
    judge's CPU per call grows with them, and it shares two cores with the client), decoded at 3x the
    time per character: a real caption's latency."""
    return LatencyModel(
        seed=24, time_scale=time_scale, stall_p=stall_p, rpm_cap=rpm_cap, per_char_s=3 * LatencyModel.per_char_s,
        chunks=4,
    )  # fmt: skip


BASELINE = "after_generation"  # exposed time is compared with judging after generation, same settings
IDEAL = (
    "ideal: every call in flight at once from when its schedule starts it (no bound, no rate limit), "
    "each taking its first attempt's latency, stalls included (a stalled or slower first attempt: the "
    "hedge floor plus its second attempt's latency)"
)
# CPU bounds a step when the client and the loopback server need more CPU than the step's ideal leaves
# them: on C cores at load average L a runnable process gets about C / L cores.

_SERVER = (
    "import json, sys; from balcaprl.testing.judge_server import LatencyModel, serve_forever; "
    "from balcaprl.testing.scripted_judge import ScriptedJudge; "
    "serve_forever(ScriptedJudge(), latency=LatencyModel(**json.loads(sys.argv[1])), "
    "on_ready=lambda url: print(url, flush=True))"
)

# Scene clauses the scripted judge splits and matches word by word.
_OBJECTS = [
    "door",
    "cat",
    "lamp",
    "chair",
    "table",
    "window",
    "plant",
    "clock",
    "bicycle",
    "umbrella",
    "kettle",
    "guitar",
    "vase",
    "bench",
    "fence",
]
_COLOURS = ["red", "black", "green", "blue", "white", "yellow", "brown", "grey", "orange", "purple"]
_PLACES = [
    "on the left",
    "on the right",
    "in the corner",
    "near the wall",
    "under the shelf",
    "by the stairs",
]


@dataclass
class Rollout:
    process: int
    group: int  # global prompt index
    request: JudgeRequest
    finish_s: float  # when generation finished this rollout, from the step's start


@dataclass
class StepPlan:
    rollouts: list[Rollout]
    generation_end_s: list[float]  # per process

    def rollouts_of(self, process: int) -> list[Rollout]:
        return [r for r in self.rollouts if r.process == process]


def plan_step(seed: int, processes: int, per_process: int, group_size: int, generation_s: float) -> StepPlan:
    """One step's rollouts: captions of heavy-tailed length; each process finishes its rollouts in
    order of length (decode time), the longest at its generation end (85-100% of ``generation_s``)."""
    rng = random.Random(seed)
    rollouts: list[Rollout] = []
    ends: list[float] = []
    for p in range(processes):
        end = generation_s * rng.uniform(0.85, 1.0)
        ends.append(end)
        local: list[tuple[int, JudgeRequest]] = []
        for g in range(per_process // group_size):
            group = p * (per_process // group_size) + g
            facts = [
                f"a {rng.choice(_COLOURS)} {obj} {rng.choice(_PLACES)}" for obj in rng.sample(_OBJECTS, 8)
            ]
            reference = ". ".join(facts) + "."
            image = _png(seed * 1000 + group)
            for r in range(group_size):
                n = max(2, min(24, round(rng.lognormvariate(2.0, 0.5))))  # clauses: median 7, long tail
                clauses = [rng.choice(facts) if rng.random() < 0.7 else f"a {rng.choice(_COLOURS)} "
                           f"{rng.choice(_OBJECTS)} {rng.choice(_PLACES)}" for _ in range(n)]  # fmt: skip
                caption = f"Step {seed} rollout {group}-{r}. " + ". ".join(clauses) + "."
                local.append((len(caption), JudgeRequest(image=image, caption=caption, reference=reference)))
        longest = max(length for length, _ in local)
        for i, (length, request) in enumerate(local):
            finish = end * (0.2 + 0.8 * length / longest)
            rollouts.append(Rollout(p, (p * per_process + i) // group_size, request, finish))
    return StepPlan(rollouts, ends)


@dataclass
class StepResult:
    schedule: str
    step: int
    generation_s: float  # the last process's generation end
    logprob_end_s: float  # the last process's old-log-prob end: when the rewards are wanted
    first_judge_s: float  # the schedule's first judge call start
    rewards_ready_s: float
    exposed_s: float
    ideal_ready_s: float  # the ideal (IDEAL) of this schedule's start times
    client_cpu_s: float  # this process's CPU over the step: the clients (the server runs apart)
    server_cpu_s: float  # the loopback server's CPU over the step (it shares the machine)
    calls: int
    hedges: int
    failures: int
    attempts_served: int  # requests the server answered (first attempts, retries and hedges; 429s apart)
    stalls_served: int
    rate_limited_served: int
    rewards: torch.Tensor = field(repr=False)
    advantages: torch.Tensor = field(repr=False)

    @property
    def stage_s(self) -> float:
        return self.rewards_ready_s - self.first_judge_s

    @property
    def ideal_stage_s(self) -> float:
        return self.ideal_ready_s - self.first_judge_s

    @property
    def cpu_busy(self) -> float:
        """The share of the step the client's CPU was busy (one event loop: at most 1)."""
        return self.client_cpu_s / self.rewards_ready_s

    @property
    def cpu_vs_ideal(self) -> float:
        """Client and server CPU of the step, over its ideal stage: above the cores they can get, the
        stage is bound by CPU, not by the judge's latency."""
        return (self.client_cpu_s + self.server_cpu_s) / self.ideal_stage_s

    @property
    def server_busy(self) -> float:
        """The same for the loopback server: near 1, the server, not the latency model, sets the pace."""
        return self.server_cpu_s / self.rewards_ready_s

    def row(self) -> dict[str, Any]:
        data = {k: v for k, v in asdict(self).items() if k not in ("rewards", "advantages")}
        return {
            **data,
            "stage_s": self.stage_s,
            "ideal_stage_s": self.ideal_stage_s,
            "cpu_busy": self.cpu_busy,
        }


def ideal_latency_s(model: LatencyModel, caption: str, floor_s: float) -> float:
    """A call's latency in the ideal (:data:`IDEAL`): its first attempt's, or, when that attempt stalls
    or is slower, the hedge floor plus its second attempt's."""
    first, second = model.timing(caption, 0), model.timing(caption, 1)
    duplicate = floor_s + second.total_s
    return duplicate if first.stalled else min(first.total_s, duplicate)


def _cpu_of(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _server_counts(base_url: str, reset: bool = False) -> dict[str, int]:
    root = base_url.removesuffix("/v1")
    request = urllib.request.Request(
        f"{root}/latency/reset" if reset else f"{root}/latency", method="POST" if reset else "GET"
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.loads(answer.read())


async def run_schedule(
    schedule: str, step: int, plan: StepPlan, early: list[EarlyJudge], logprob_s: float, model: LatencyModel,
    base_url: str, floor_s: float, server_pid: int,
) -> StepResult:  # fmt: skip
    """One step under one schedule; ``early``: one client per process, each wrapped as the trainer wraps
    it, kept from step to step as a training run keeps them (their connections, the hedging's observed
    times, and the time from the end of generation to the rewards asked for: the judge's deadline)."""
    _server_counts(base_url, reset=True)
    processes = len(early)
    t0, cpu0, server0 = time.perf_counter(), time.process_time(), _cpu_of(server_pid)
    starts: dict[int, float] = {}  # rollout index -> when its judging started (s from t0)
    ready: list[float] = [0.0] * processes
    outcomes: list[Any] = [None] * len(plan.rollouts)
    usage: Counter[str] = Counter()  # the calls and hedges the processes' batches spent

    async def at(when_s: float) -> None:
        await asyncio.sleep(max(0.0, t0 + when_s - time.perf_counter()))

    async def process(p: int) -> None:
        mine = [i for i, r in enumerate(plan.rollouts) if r.process == p]
        gen_end = plan.generation_end_s[p]
        if schedule.startswith("per_rollout"):
            for i in sorted(mine, key=lambda i: plan.rollouts[i].finish_s):
                await at(plan.rollouts[i].finish_s)
                starts[i] = time.perf_counter() - t0
                early[p].start([plan.rollouts[i].request])
        await at(gen_end)
        early[p].generation_done()
        if schedule == "after_generation":
            for i in mine:
                starts[i] = time.perf_counter() - t0
            early[p].start([plan.rollouts[i].request for i in mine])
        await at(gen_end + logprob_s)
        if schedule == "today":
            for i in mine:
                starts[i] = time.perf_counter() - t0
        answers, spent = await early[p].judge_batch_counted([plan.rollouts[i].request for i in mine])
        ready[p] = time.perf_counter() - t0
        usage.update(spent)
        for i, outcome in zip(mine, answers, strict=True):
            outcomes[i] = outcome

    await asyncio.gather(*(process(p) for p in range(processes)))
    cpu, server_cpu = time.process_time() - cpu0, _cpu_of(server_pid) - server0
    counts = _server_counts(base_url)
    rewards = rewards_tensor(outcomes, dtype=torch.float64)
    groups = torch.tensor([r.group for r in plan.rollouts])
    advantages = c_gdpo_advantages(rewards, groups, (1.0, 1.0, 1.0))
    ideal = max(
        starts[i] + ideal_latency_s(model, r.request.caption, floor_s) for i, r in enumerate(plan.rollouts)
    )
    logprob_end = max(plan.generation_end_s) + logprob_s
    return StepResult(
        schedule=schedule,
        step=step,
        generation_s=max(plan.generation_end_s),
        logprob_end_s=logprob_end,
        first_judge_s=min(starts.values()),
        rewards_ready_s=max(ready),
        exposed_s=max(0.0, max(ready) - logprob_end),
        ideal_ready_s=ideal,
        client_cpu_s=cpu,
        server_cpu_s=server_cpu,
        calls=int(usage["calls"]),
        hedges=int(usage["hedges"]),
        failures=sum(isinstance(outcome, JudgeFailure) for outcome in outcomes),
        attempts_served=counts["served"],
        stalls_served=counts["stalls"],
        rate_limited_served=counts["rate_limited"],
        rewards=rewards,
        advantages=advantages,
    )


def _start_server(model: LatencyModel) -> tuple[subprocess.Popen, str]:
    params = {
        k: v
        for k, v in asdict(model).items()
        if not k.startswith("_") and k not in ("served", "stalls", "rate_limited")
    }
    process = subprocess.Popen(
        [sys.executable, "-c", _SERVER, json.dumps(params)], stdout=subprocess.PIPE, text=True
    )
    line = process.stdout.readline() if process.stdout else ""
    if "http://" not in line:
        process.kill()
        raise RuntimeError(f"the judge server did not start (printed {line!r})")
    return process, line.split()[-1]


def cores_available() -> float:
    """About what a runnable process gets of this machine now: C cores / load average (at most C)."""
    cpus = os.cpu_count() or 1
    return min(cpus, cpus / max(1.0, os.getloadavg()[0]))


def summarise(results: list[StepResult], cores: float) -> dict[str, Any]:
    by: dict[str, list[StepResult]] = {}
    for r in results:
        by.setdefault(r.schedule, []).append(r)
    today = {r.step: r for r in by["today"]}
    base = {r.step: r for r in by.get(BASELINE, by["today"])}

    def ratio(a: float, b: float) -> float:
        return a / b if b > 0 else float("nan")

    summary: dict[str, Any] = {"ideal": IDEAL}
    for schedule, rows in by.items():
        calls = sum(r.calls for r in rows)
        cpu_busy = statistics.median(r.cpu_busy for r in rows)
        cpu_vs_ideal = statistics.median(r.cpu_vs_ideal for r in rows)
        summary[schedule] = {
            "steps": len(rows),
            "median_exposed_s": statistics.median(r.exposed_s for r in rows),
            "median_exposed_vs_today": statistics.median(
                ratio(r.exposed_s, today[r.step].exposed_s) for r in rows
            ),
            f"median_exposed_vs_{BASELINE}": statistics.median(
                ratio(r.exposed_s, base[r.step].exposed_s) for r in rows
            ),
            "median_rewards_ready_vs_today": statistics.median(
                r.rewards_ready_s / today[r.step].rewards_ready_s for r in rows
            ),
            "median_stage_vs_ideal": statistics.median(r.stage_s / r.ideal_stage_s for r in rows),
            "max_stage_vs_ideal": max(r.stage_s / r.ideal_stage_s for r in rows),
            "client_cpu_per_call_ms": 1000 * sum(r.client_cpu_s for r in rows) / calls if calls else 0.0,
            "median_client_cpu_busy": cpu_busy,
            "median_cpu_vs_ideal": cpu_vs_ideal,
            "cores_available": cores,
            "client_cpu_bound": cpu_vs_ideal > cores,
            "median_server_cpu_busy": statistics.median(r.server_busy for r in rows),
            "calls": calls,
            "hedges": sum(r.hedges for r in rows),
            "hedged_share": sum(r.hedges for r in rows) / calls if calls else 0.0,
            "failures": sum(r.failures for r in rows),
            "stalls_served": sum(r.stalls_served for r in rows),
            "rate_limited_served": sum(r.rate_limited_served for r in rows),
            "rewards_identical_to_today": all(
                torch.equal(r.rewards.nan_to_num(-1.0), today[r.step].rewards.nan_to_num(-1.0)) for r in rows
            ),
            "advantages_identical_to_today": all(
                torch.equal(r.advantages, today[r.step].advantages) for r in rows
            ),
        }
    return summary


def sized(args: argparse.Namespace) -> None:
    """Fill the size-dependent defaults: the quick or the paper size, limits scaled with the rollouts
    (the paper step's calls in flight and rate per rollout), the results file of the size."""
    steps, rollouts = SIZES["paper" if args.paper else "quick"]
    args.steps = steps if args.steps is None else args.steps
    args.rollouts = rollouts if args.rollouts is None else args.rollouts
    share = args.rollouts / PAPER_ROLLOUTS
    for name, paper_value in PAPER_LIMITS.items():
        if getattr(args, name) is None:
            setattr(args, name, max(1, round(paper_value * share)))
    if args.auto_max is None:  # auto's bound: the step's calls all in flight at once
        args.auto_max = args.rollouts
    if args.concurrency != "auto":
        args.concurrency = int(args.concurrency)
    if args.out is None:
        args.out = RESULTS if args.paper else QUICK_RESULTS


DOCS = Path(__file__).parent.parent / "docs" / "measurements.md"
SECTION = "## The judge stage of a training step"


FIXED_RESULTS = RESULTS.with_name("judge_stage_c256.json")  # --paper --concurrency 256: the recipe's former
# --paper --time-scale 1: a hosted judge's own speed, where a 2-core machine's CPU does not bind
REAL_RESULTS = RESULTS.with_name("judge_stage_real.json")


def _ideal_exposed(record: dict[str, Any], schedule: str) -> str:
    """The ideal's exposed time, median over the schedule's steps: its last answer (every call in flight
    at once, first-attempt latencies) minus the end of generation and old log-probs."""
    rows = [step for step in record["steps"] if step["schedule"] == schedule]
    exposed = [max(0.0, step["ideal_ready_s"] - step["logprob_end_s"]) for step in rows]
    return f"{statistics.median(exposed):.2f} s" if exposed else "-"


def _attempts_per_call(record: dict[str, Any], schedule: str) -> str:
    """Requests the server answered per judge call in the schedule's steps (1.00: no attempt wasted;
    retries add to it, a hedge is a call of its own); "-" for a record from before the server's count
    was kept."""
    rows = [step for step in record["steps"] if step["schedule"] == schedule]
    if not rows or any("attempts_served" not in step for step in rows):
        return "-"
    return f"{sum(step['attempts_served'] for step in rows) / sum(step['calls'] for step in rows):.2f}"


def _per_step(record: dict[str, Any]) -> str:
    """Each step's exposed time under ``per_rollout`` and under the baseline, and their ratio: the
    goal's median is over these, and a step's ratio swings with the draws of its slowest calls."""
    by = {(r["schedule"], r["step"]): r["exposed_s"] for r in record["steps"]}
    steps = sorted({r["step"] for r in record["steps"]})
    cells, ratios = [], {}
    for step in steps:
        ours, base = by.get(("per_rollout", step)), by.get((BASELINE, step))
        if ours is not None and base:
            ratios[step] = ours / base
            cells.append(f"step {step}: {ours:.2f} / {base:.2f} s = {ratios[step]:.2f}")
    told = [ratio for step, ratio in ratios.items() if step > steps[0]]  # the deadline: learned in the first
    return (
        f"Per step, `per_rollout` / `{BASELINE}` exposed: " + "; ".join(cells) + ". "
        + (f"Median ratio over every step: {statistics.median(ratios.values()):.3f}; over the steps after the "
           f"first (the judge told the trainer's deadline, learned in the first): {statistics.median(told):.3f}; "
           f"{sum(r <= 0.4 for r in ratios.values())} of {len(ratios)} steps at or under 0.4." if told else "")
    )  # fmt: skip


def _failed_calls(record: dict[str, Any]) -> str:
    """The calls that failed after every retry, by schedule: a failed call has no reward, so a step
    where one schedule failed a call and another did not differs there."""
    failed = [f"{name} {row['failures']}" for name, row in record["summary"].items() if name != "ideal"]
    return "calls failed after every retry: " + ", ".join(failed)


def docs_section(
    paper: dict[str, Any],
    quick: dict[str, Any] | None,
    fixed: dict[str, Any] | None = None,
    real: dict[str, Any] | None = None,
) -> str:
    """The judge-stage section of docs/measurements.md, from the results of a ``--paper`` run (and of a
    quick one): every figure with its definition."""

    def table(record: dict[str, Any]) -> list[str]:
        rows = [
            f"| schedule | exposed judge time, median | the ideal's, median | vs {BASELINE}, median "
            "| stage vs ideal, median (max) | hedged calls | attempts per call | client CPU per call | bound by |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for schedule in SCHEDULES:
            row = record["summary"].get(schedule)
            if row is None:
                continue
            bound = (
                f"CPU ({row['median_cpu_vs_ideal']:.2f}x the ideal in CPU-seconds, "
                f"{row['cores_available']:.2f} cores free)"
                if row["client_cpu_bound"]
                else "latency"
            )
            rows.append(
                f"| {schedule} | {row['median_exposed_s']:.2f} s | {_ideal_exposed(record, schedule)} "
                f"| {row[f'median_exposed_vs_{BASELINE}']:.2f} "
                f"| {row['median_stage_vs_ideal']:.2f} ({row['max_stage_vs_ideal']:.2f}) "
                f"| {row['hedges']} of {row['calls']:,} ({row['hedged_share']:.1%}) "
                f"| {_attempts_per_call(record, schedule)} "
                f"| {row['client_cpu_per_call_ms']:.2f} ms | {bound} |"
            )
        same = all(
            row["rewards_identical_to_today"] and row["advantages_identical_to_today"]
            for name, row in record["summary"].items()
            if name != "ideal"
        )
        settings = record["settings"]
        rows.append("")
        rows.append(
            f"{settings['steps']} step{'' if settings['steps'] == '1' else 's'} of {settings['rollouts']} rollouts "
            f"over {settings['processes']} processes, concurrency {settings['concurrency']}"
            + (f" (bound {settings['auto_max']})" if settings["concurrency"] == "auto" else "")
            + f", requests_per_minute "
            f"{settings['rpm_cap']} (the server's cap), streamed {settings['stream']}; load average "
            f"{record.get('load_average_1m', float('nan')):.1f} on {record.get('cpus', '?')} cores at the end of "
            f"the run. Rewards and c-GDPO advantages bit-identical to today's in every step: {same}"
            + ("." if same else f" ({_failed_calls(record)})."),
        )
        return rows

    lines = [
        SECTION,
        "",
        "```bash",
        "PYTHONPATH=src nice -n 10 .venv/bin/python benchmarks/bench_judge_stage.py --paper --steps N",
        "PYTHONPATH=src .venv/bin/python benchmarks/bench_judge_stage.py --write-docs   # this section",
        "```",
        "",
        "A step of 2,048 rollouts over 8 GPU processes (groups of 8) against a loopback judge at a hosted "
        "judge's speed (`LatencyModel`: median call about 6 s, p99 about 30 s, the heavy tail in the time to "
        "first token; 0.3% of attempts stall past any timeout; everything 10x faster here), with the project's "
        "real client, one per process with its share of the limits. Every schedule runs with the same client "
        "settings (the defaults: `concurrency: auto`, hedging, tail limits), so the schedules are compared at "
        "equal concurrency; `per_rollout_unhedged` differs only in hedging. Definitions:",
        "",
        f"- exposed judge time: rewards ready minus the end of generation and old log-probs (the part of the "
        f"stage a step waits for); compared with `{BASELINE}` (judging when generation ends) in the same step;",
        f"- stage: rewards ready minus the schedule's first judge call; the {IDEAL};",
        "- client CPU per call: the benchmark process's CPU over the step (the clients; the server runs apart) "
        "per call made (its judge calls: a hedge is one more); attempts per call: the requests the server "
        "answered per judge call (a hedge is a call of its own; retries after a timeout add to 1.00); a step is "
        "CPU-bound when client and server need more CPU-seconds than the ideal stage "
        "times the cores a process gets (cores / load average). Where a row says CPU, the loopback server and "
        "the client shared a machine too busy for them, and the figure measures that machine, not the "
        "judge's latency: a hosted judge spends none of the client's CPU, and the client's own share is "
        "the CPU per call given.",
        "",
        f"Paper-sized (`{paper['command']}`, `benchmarks/results/judge_stage.json` has every step):",
        "",
        *table(paper),
    ]
    if fixed is not None:
        lines += ["", f"Paper-sized at a fixed concurrency (`{fixed['command']}`):", "", *table(fixed)]
    if real is not None:
        lines += [
            "",
            f"Paper-sized at a hosted judge's own speed (`{real['command']}`: nothing scaled, so the "
            "client needs a few percent of a core and latency, not this machine's CPU, bounds the stage):",
            "",
            *table(real),
            "",
            _per_step(real),
            "",
            "Step 8's draws (the model's, by caption and attempt, the same in every run) hold a call whose "
            "first attempt answers past the 30 s first-byte limit and whose second stalls. A client that sent "
            "the second as the duplicate and, when the first was cut, waited on it until its own limit made "
            "that step slower than no duplicates at all; a copy left alone with no first byte is now watched "
            "by the same rule as a first attempt ([the judge's docs](judge.md)), and this run is measured "
            "with it.",
            "",
            "Reading the ideal's column: the ideal gives every first attempt slower than the hedge floor "
            "(`hedge_floor_s`) plus a second attempt that second attempt, sent at the floor, however many "
            "calls that is; the client sends a duplicate only past the 98th percentile of the times to first "
            "byte it has seen, and to at most 5% of the calls (`hedge_quantile`, `hedge_max_share`).",
            "",
            "What a trace of one step showed (step 0, `per_rollout`, fresh clients, every attempt's start, "
            "first byte, duplicate and end logged), before the percentile was a product-limit estimate: "
            "each process spent its 12 duplicates (5% of 256 calls) between 21 and 51 s on calls that had "
            "waited 5-13 s, the 82nd-96th percentile of the model's first byte, because it read the waits of "
            "calls just started as first bytes; the step's last call, a stall started at 40.8 s, was refused "
            "its duplicate (cap spent), cut at the 30 s first-byte limit and retried: rewards at 98.7 s, as "
            "unhedged (98.8 s). No duplicate waited for a slot or a rate limit. Traced again with the "
            "estimate (`judge/tail.py`), the same step spends 30 duplicates where it spent 96, and its last "
            "call is the same stall, sent its duplicate after 26.3 s: each process estimates the 98th percentile from its own "
            "calls, 13-23 s in that step (the model's is 17.7 s), and a long caption's second attempt adds "
            "10-14 s, past the 15 s of old log-probs. `after_generation` gains as much from the estimate, so "
            "the exposed ratio does not fall to 0.4; the same rule replayed with the percentile known gives "
            "about the same ratio ([what a hedging rule can reach](#what-a-hedging-rule-can-reach)). The "
            "fixed-concurrency table above was measured before the estimate changed; the others after.",
            "",
            "Hedging against the trainer's deadline ([the judge's docs](judge.md)): the real-speed and quick "
            "tables are measured with it, the paper-sized ones at 1/10 before it. The benchmark keeps each "
            "process's `EarlyJudge` from step to step, as a trainer does, so the first step learns the time from "
            "the end of generation to the rewards asked for and hedges by the quantile alone; from the second "
            "step on, each call still without a first byte at the floor that would answer past the deadline and "
            "past every call's typical answer gets its duplicate then. Before it, the real-speed run (2 steps) "
            "gave `per_rollout` a median 14.13 s exposed against `after_generation`'s 22.64 s, a median "
            "ratio of 0.60 (the medians are over steps; a ratio's median is not the ratio of the medians).",
        ]
    if quick is not None:
        lines += ["", f"Quick (`{quick['command']}`, what `make bench` runs):", "", *table(quick)]
    return "\n".join(lines) + "\n"


def write_docs(path: Path = DOCS) -> None:
    """Replace the judge-stage section of ``path`` with :func:`docs_section` of the stored results."""
    paper = json.loads(RESULTS.read_text())
    quick = json.loads(QUICK_RESULTS.read_text()) if QUICK_RESULTS.exists() else None
    fixed = json.loads(FIXED_RESULTS.read_text()) if FIXED_RESULTS.exists() else None
    real = json.loads(REAL_RESULTS.read_text()) if REAL_RESULTS.exists() else None
    text = path.read_text()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    rest = "" if end < 0 else text[end:]
    path.write_text(text[:start] + docs_section(paper, quick, fixed, real) + rest)


def main() -> None:
    if "--write-docs" in sys.argv[1:]:
        write_docs()
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--paper", action="store_true",
        help="the paper-shaped run: steps of 2,048 rollouts (results/judge_stage.json)",
    )  # fmt: skip
    parser.add_argument("--steps", type=int, default=None, help="default: 4, or 20 with --paper")
    parser.add_argument(
        "--first-step", type=int, default=0,
        help="the first step's draws; the clients start fresh there, as in a run's first step",
    )  # fmt: skip
    parser.add_argument("--processes", type=int, default=PROCESSES)
    parser.add_argument(
        "--rollouts",
        type=int,
        default=None,
        help="per step, over all processes; default: 512, or 2,048 with --paper",
    )
    parser.add_argument("--group-size", type=int, default=GROUP_SIZE)
    parser.add_argument("--time-scale", type=float, default=10.0, help="real seconds per benchmark second")
    parser.add_argument(
        "--generation-s", type=float, default=GENERATION_S, help="a process's generation, real seconds"
    )
    parser.add_argument(
        "--logprob-s", type=float, default=LOGPROB_S, help="the old-log-prob forward, real seconds"
    )
    parser.add_argument("--stall-p", type=float, default=STALL_P, help="probability an attempt stalls")
    parser.add_argument(
        "--rpm-cap", type=int, default=None,
        help="the server's requests per (real) minute; default 10,000 per 2,048 rollouts",
    )  # fmt: skip
    parser.add_argument(
        "--concurrency", default="auto",
        help="judge calls in flight for every schedule, whole run: auto (default) or a number",
    )  # fmt: skip
    parser.add_argument(
        "--auto-max", type=int, default=None, help="auto's bound for the run; default the step's rollouts"
    )
    parser.add_argument("--timeout-s", type=float, default=60.0, help="per attempt, real seconds (recipe)")
    parser.add_argument(
        "--no-stream", dest="stream", action="store_false",
        help="unstreamed answers (on a 2-core machine the loopback server's events cost CPU a hosted judge "
        "does not charge the client)",
    )  # fmt: skip
    parser.add_argument("--schedules", default=",".join(SCHEDULES))
    parser.add_argument("--out", type=Path, default=None, help="default: results/judge_stage[_quick].json")
    args = parser.parse_args()
    sized(args)

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the server too (the finally below)
    scale = args.time_scale
    model = latency_model(scale, args.stall_p, args.rpm_cap)
    server, base_url = _start_server(model)
    # The client's clocks at the benchmark's scale: its rate-limit minute and first latency guess.
    throughput.RATE_WINDOW_S = 60.0 / scale
    throughput.FIRST_LATENCY_S = throughput.FIRST_LATENCY_S / scale
    floor_s = JudgeConfig.model_fields["hedge_floor_s"].default / scale
    tail_s = JudgeConfig.model_fields["first_byte_timeout_s"].default / scale
    # One client config for every schedule (the stated limit: the server's own), hedging apart.
    base = JudgeConfig(
        base_url=base_url, model="balcaprl-local-judge", api_key_env=None, cache_path=None,
        concurrency=args.concurrency, auto_max_concurrency=args.auto_max, requests_per_minute=args.rpm_cap,
        timeout_s=args.timeout_s / scale, max_retries=4, hedge=True, hedge_floor_s=floor_s,
        stream=args.stream, first_byte_timeout_s=tail_s if args.stream else None, chunk_gap_timeout_s=tail_s,
    )  # fmt: skip
    configs = {s: base for s in SCHEDULES} | {
        "per_rollout_unhedged": base.model_copy(update={"hedge": False})
    }
    schedules = [s for s in args.schedules.split(",") if s]
    if "today" not in schedules:
        parser.error("--schedules must include today (the baseline)")
    per_process = args.rollouts // args.processes
    results: list[StepResult] = []

    async def run_all() -> None:
        judges = {
            s: [
                build_judge(configs[s], processes=args.processes, no_cache=True)
                for _ in range(args.processes)
            ]
            for s in schedules
        }
        loop = asyncio.get_running_loop()
        early = {s: [EarlyJudge(judge, loop) for judge in clients] for s, clients in judges.items()}
        for step in range(args.first_step, args.first_step + args.steps):
            plan = plan_step(step, args.processes, per_process, args.group_size, args.generation_s / scale)
            for schedule in schedules:
                result = await run_schedule(
                    schedule,
                    step,
                    plan,
                    early[schedule],
                    args.logprob_s / scale,
                    model,
                    base_url,
                    floor_s,
                    server.pid,
                )
                results.append(result)
                print(
                    f"step {step:2d} {schedule:19s} gen {result.generation_s:5.2f}s ready {result.rewards_ready_s:6.2f}s "
                    f"exposed {result.exposed_s:5.2f}s stage/ideal {result.stage_s / result.ideal_stage_s:4.2f} "
                    f"cpu/call {1000 * result.client_cpu_s / max(1, result.calls):4.2f}ms busy {result.cpu_busy:4.2f} "
                    f"server busy {result.server_busy:4.2f} "
                    f"calls {result.calls} attempts {result.attempts_served} hedges {result.hedges} "
                    f"failures {result.failures} "
                    f"stalls {result.stalls_served} 429s {result.rate_limited_served}",
                    flush=True,
                )
        for clients in judges.values():
            for judge in clients:
                await judge.aclose()

    try:
        asyncio.run(run_all())
    finally:
        server.terminate()
        server.wait(timeout=10)
    summary = summarise(results, cores_available())
    print(json.dumps(summary, indent=2))
    print(IDEAL)
    for schedule in schedules:
        row = summary[schedule]
        bound = (
            f"CPU-bound: client+server CPU {row['median_cpu_vs_ideal']:.2f}x the ideal stage, "
            f"{row['cores_available']:.2f} cores available"
            if row["client_cpu_bound"]
            else "latency-bound"
        )
        print(
            f"{schedule:19s} stage/ideal {row['median_stage_vs_ideal']:.2f} (median; max {row['max_stage_vs_ideal']:.2f})  "
            f"exposed vs {BASELINE} {row[f'median_exposed_vs_{BASELINE}']:.2f}  client CPU "
            f"{row['client_cpu_per_call_ms']:.2f} ms/call, busy {row['median_client_cpu_busy']:.0%}; "
            f"loopback server busy {row['median_server_cpu_busy']:.0%} ({bound})"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "command": " ".join(["benchmarks/bench_judge_stage.py", *sys.argv[1:]]),
        "settings": {k: str(v) for k, v in vars(args).items() if k != "out"},
        "load_average_1m": os.getloadavg()[0],
        "cpus": os.cpu_count(),
        "latency_model": {k: v for k, v in asdict(model).items() if not k.startswith("_")},
        "summary": summary,
        "steps": [r.row() for r in results],
    }
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    tmp.replace(args.out)


if __name__ == "__main__":
    main()
