"""``balcaprl demo``: the whole loop, offline, on a laptop CPU.

    build a synthetic dataset  ->  SFT warm start  ->  held-out eval (before)
        ->  c-GDPO RL with the oracle judge (per variant)  ->  held-out eval (after)  ->  report

Every stage writes into the run folder and is skipped when its output is already there and was made
with the same settings (a stage made with other settings is an error, never silently reused):

    OUTPUT/data/                 the dataset (pinned format + scenes.jsonl)
    OUTPUT/sft/                  the warm-started policy (+ sft_result.json)
    OUTPUT/rl/VARIANT/           the RL run: recipe.yaml, metrics.jsonl, rollouts.jsonl, checkpoints, final/
    OUTPUT/eval/NAME.json        held-out captions and their oracle scores, per scene
    OUTPUT/training_curves.png   rewards and caption length over RL steps (one per variant in rl/VARIANT/)
    OUTPUT/samples.md            held-out captions before and after RL
    OUTPUT/summary.json          every number the final tables show
    OUTPUT/comparison.md/.csv    the variant comparison (when more than one variant ran)
    OUTPUT/steps-N/              the same report of a run with --steps N (never over the top-level one)

An interrupted RL run resumes from its newest checkpoint.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from balcaprl.demo.config import DemoConfig
from balcaprl.demo.report import (
    BootstrapInterval,
    HeldOut,
    comparison_csv,
    comparison_markdown,
    comparison_rows,
    paired_bootstrap,
    plot_training_curves,
)
from balcaprl.demo.variants import Variant
from balcaprl.errors import UserError
from balcaprl.progress import Progress

STAGE_FILE = "demo_stage.json"
SUMMARY_FILE = "summary.json"


Log = Callable[[str], None]
# Makes the reporter of one long stage: ``factory(description, total=n, unit="steps")`` (``Progress``
# itself, or a partial of it with the demo's stream or a test's clock).
ProgressFactory = Callable[..., Progress]


# ------------------------------------------------------------------------------------- stage cache


def _fingerprint(settings: Any) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def _stage_matches(folder: Path, settings: dict[str, Any], what: str) -> bool:
    """True when ``folder`` holds this stage made with ``settings``; False when it is absent or
    incomplete; raises when it was made with other settings."""
    marker = folder / STAGE_FILE
    if not marker.is_file():
        return False
    recorded = json.loads(marker.read_text(encoding="utf-8"))
    if recorded.get("fingerprint") == _fingerprint(settings):
        return True
    old = recorded.get("settings", {})
    changed = sorted(k for k in set(old) | set(settings) if old.get(k) != settings.get(k))
    details = ", ".join(f"{k}: {old.get(k)!r} -> {settings.get(k)!r}" for k in changed[:4])
    raise UserError(
        f"{folder} holds a {what} made with other settings ({details}). Delete that folder to redo it, "
        "or pass another --out."
    )


def _mark_stage(folder: Path, settings: dict[str, Any], **extra: Any) -> None:
    record = {"fingerprint": _fingerprint(settings), "settings": settings, **extra}
    (folder / STAGE_FILE).write_text(json.dumps(record, indent=2, default=str) + "\n", encoding="utf-8")


# ------------------------------------------------------------------------------------------ stages


def ensure_dataset(config: DemoConfig, root: Path, log: Log) -> Path:
    from balcaprl.synthetic.build import GENERATOR_VERSION, build_dataset

    folder = root / "data"
    # The generator's version too: a folder built by an older world is not this world's dataset.
    settings = {**config.dataset.model_dump(), "generator_version": GENERATOR_VERSION}
    if _stage_matches(folder, settings, "dataset"):
        log(f"dataset: reusing {folder}")
        return folder
    if folder.exists():
        shutil.rmtree(folder)  # an interrupted build (no stage marker): start it again
    d = config.dataset
    log(
        f"dataset: building {d.n_train} train + {d.n_eval} held-out scenes ({d.min_objects}-{d.max_objects} shapes)"
    )
    build_dataset(folder, d.n_train, d.n_eval, d.seed, image_size=d.image_size, spec=d.scene_spec())
    _mark_stage(folder, settings)
    return folder


def ensure_sft(
    config: DemoConfig, data_dir: Path, root: Path, log: Log, progress: ProgressFactory = Progress
) -> Path:
    from balcaprl.synthetic.policy import PolicySpec
    from balcaprl.synthetic.sft import SFTConfig, run_sft

    folder = root / "sft"
    s = config.sft
    policy = dict(config.policy.model_extra or {})
    settings = {**s.model_dump(), "dataset": _file_digest(data_dir / "dataset.json")}
    if policy:  # only when set, so folders made before this option existed still match
        settings["policy"] = policy
    if _stage_matches(folder, settings, "SFT policy"):
        log(f"sft: reusing {folder}")
        return folder
    if folder.exists():
        shutil.rmtree(folder)
    log(
        f"sft: {s.steps} teacher-forced steps (batch {s.batch_size}, lr {s.lr:g}, {s.flawed_fraction:.0%} flawed targets)"
    )
    sft_config = SFTConfig(
        steps=s.steps,
        batch_size=s.batch_size,
        lr=s.lr,
        vision_lr_scale=s.vision_lr_scale,
        warmup_steps=s.warmup_steps,
        micro_batches=s.micro_batches,
        flawed_fraction=s.flawed_fraction,
        seed=s.seed,
        eval_limit=0,  # the demo evaluates the SFT policy itself, on more scenes
    )
    with progress("sft", total=s.steps, unit="steps") as reporter:
        run_sft(data_dir, folder, spec=PolicySpec(**policy), config=sft_config, progress=reporter)
    _mark_stage(folder, settings)
    return folder


@dataclass
class Evaluation:
    """Held-out captions of one policy and their per-scene oracle scores."""

    held_out: HeldOut
    records: list[dict[str, Any]]

    def per_scene(self, key: str) -> list[float]:
        return [r[key] for r in self.records]


def evaluate_heldout(
    policy_dir: Path,
    data_dir: Path,
    config: DemoConfig,
    label: str,
    oracle: Any = None,
    progress: ProgressFactory = Progress,
) -> Evaluation:
    """Caption the first ``evaluation.scenes`` held-out images (sampled at the evaluation temperature
    with a fixed seed, or greedily at 0) and judge each caption once with the oracle (the b-CapScore
    rubric, scored as the metric is defined: ``BCAPSCORE_REWARDS``); every figure below comes from
    that one judgement."""
    import torch
    from PIL import Image

    from balcaprl.data.format import read_split_rows
    from balcaprl.synthetic.evaluation import score_captions
    from balcaprl.synthetic.oracle import OracleJudge
    from balcaprl.synthetic.policy import caption_token_counts, generate_captions, load_policy

    e = config.evaluation
    oracle = oracle or OracleJudge.from_dataset(data_dir)
    rows = read_split_rows(data_dir, "eval")[: e.scenes]
    model, processor = load_policy(policy_dir)
    images = [Image.open(r["image_path"]).convert("RGB") for r in rows]
    temperature = config.evaluation_temperature()
    torch.manual_seed(e.seed)  # the same draws for every policy evaluated with these settings
    with progress(f"eval ({label})", total=len(images), unit="captions") as reporter:
        captions = generate_captions(
            model, processor, images, max_new_tokens=e.max_new_tokens,
            do_sample=temperature > 0, temperature=temperature or 1.0, on_batch=reporter.advance,
        )  # fmt: skip
    scores = score_captions(oracle, rows, captions)  # the headline numbers, as `synthetic sft` prints them
    tokens = caption_token_counts(processor, captions)
    records = []
    for row, caption, n_tokens, b, outcome, v in zip(
        rows, captions, tokens, scores.per_caption, scores.outcomes, scores.scored, strict=True
    ):
        record: dict[str, Any] = {"id": row["id"], "caption": caption, "tokens": n_tokens, "b_capscore": b}
        if v is not None:
            record.update(
                precision=v.precision,
                recall=v.recall,
                linguistic=v.linguistic,
                non_pointable_share=v.non_pointable_share,
                non_visible_share=v.non_visible_share,
                fluency=outcome.verdict.fluency,
                explanation=outcome.verdict.explanation,
            )
        else:  # counted as 0, as score_captions does
            record.update(precision=0.0, recall=0.0, linguistic=0.0, failure=outcome.reason)
        records.append(record)

    def mean(key: str) -> float:
        values = [r[key] for r in records if r.get(key) is not None]
        return sum(values) / len(values) if values else math.nan

    held = HeldOut(
        label=label,
        b_capscore=scores.b_capscore,
        precision=mean("precision"),
        recall=mean("recall"),
        linguistic=mean("linguistic"),
        mean_tokens=sum(tokens) / len(tokens),
        n=len(records),
        non_pointable_share=mean("non_pointable_share"),
        non_visible_share=mean("non_visible_share"),
        fluency=mean("fluency"),
        truncated_share=sum(n >= e.max_new_tokens for n in tokens) / len(tokens),
    )
    return Evaluation(held, records)


def ensure_evaluation(
    policy_dir: Path,
    data_dir: Path,
    config: DemoConfig,
    name: str,
    label: str,
    root: Path,
    log: Log,
    oracle: Any,
    progress: ProgressFactory = Progress,
) -> Evaluation:
    path = root / "eval" / f"{name}.json"
    settings = {
        "policy_weights": _file_digest(policy_dir / "model.safetensors"),
        "dataset": _file_digest(data_dir / "dataset.json"),
        **config.evaluation.model_dump(include={"scenes", "max_new_tokens", "seed"}),
        "temperature": config.evaluation_temperature(),
    }
    if path.is_file():
        stored = json.loads(path.read_text(encoding="utf-8"))
        if stored.get("fingerprint") == _fingerprint(settings):
            log(f"eval: reusing {path}")
            return Evaluation(HeldOut(**stored["held_out"]), stored["records"])
    start = time.perf_counter()
    evaluation = evaluate_heldout(policy_dir, data_dir, config, label, oracle, progress)
    h = evaluation.held_out
    log(
        f"eval ({label}): b-CapScore {h.b_capscore:.1f}  P {h.precision:.3f}  R {h.recall:.3f}  "
        f"L {h.linguistic:.3f}  {h.mean_tokens:.0f} tokens  ({h.n} held-out scenes, {time.perf_counter() - start:.0f} s)"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    held = {k: v for k, v in h.__dict__.items()}
    path.write_text(
        json.dumps({"fingerprint": _fingerprint(settings), "held_out": held, "records": evaluation.records})
        + "\n",
        encoding="utf-8",
    )
    return evaluation


@contextlib.contextmanager
def oracle_judge(config: DemoConfig, data_dir: Path, oracle: Any, log: Log) -> Iterator[Any]:
    """The training judge: the real HTTP client against an in-process ``judge serve --oracle`` on
    127.0.0.1 (default), or the oracle itself (``judge.transport: in-process``)."""
    if config.judge.transport == "in-process":
        log("judge: the oracle, in process")
        yield oracle
        return
    try:
        from balcaprl.judge import build_judge
        from balcaprl.testing.judge_server import JudgeServer
    except ImportError as error:  # fastapi / uvicorn live in the [serve] extra
        raise UserError(
            f"the HTTP judge needs the [serve] extra ({error}); install it, or run with --judge in-process"
        ) from None
    with JudgeServer(oracle) as server:
        log(f"judge: OpenAI-compatible client -> oracle judge server at {server.base_url}")
        judge = build_judge(
            {
                "base_url": server.base_url,
                "model": "balcaprl-oracle",
                "api_key_env": None,
                "concurrency": config.judge.concurrency,
                "timeout_s": 60,
                "max_retries": 2,
                "cache_path": None,  # every rollout is a fresh caption; a cache would only grow
            },
            image_root=data_dir,
        )
        try:
            yield judge
        finally:
            with contextlib.suppress(Exception):
                import asyncio

                asyncio.run(judge.aclose())


def _without_paths(recipe: dict[str, Any]) -> dict[str, Any]:
    """A recipe without the three paths the demo fills in (a moved run folder is still the same run)."""
    out = json.loads(json.dumps(recipe))
    for section, key in (("model", "path"), ("data", "path"), ("run", "output_dir")):
        out.get(section, {}).pop(key, None)
    return out


def rl_folder_name(variant: Variant, steps: int | None) -> str:
    return variant.name if steps is None else f"{variant.name}-{steps}steps"


def ensure_rl(
    recipe: Any, judge_factory: Callable[[], contextlib.AbstractContextManager], log: Log
) -> tuple[Path, float]:
    """Train (or resume, or reuse) one RL run; returns its final policy folder and training seconds."""
    from balcaprl.train import train
    from balcaprl.train.checkpointing import RECIPE_FILE, latest_checkpoint

    out = Path(recipe.run.output_dir)
    final = out / "final"
    marker = out / STAGE_FILE
    if final.is_dir() and marker.is_file():
        recorded = json.loads(marker.read_text(encoding="utf-8"))
        if _without_paths(recorded.get("recipe", {})) == _without_paths(recipe.to_dict()):
            log(f"rl: reusing {out}")
            return final, float(recorded.get("train_s", 0.0))
        raise UserError(f"{out} holds an RL run of another recipe; delete it or pass another --out")
    resume = latest_checkpoint(out) is not None if out.is_dir() else False
    if out.is_dir() and not resume:
        # Nothing to resume from (stopped before the first checkpoint): start the run again cleanly.
        for name in ("metrics.jsonl", "rollouts.jsonl", RECIPE_FILE):
            (out / name).unlink(missing_ok=True)
    log(f"rl: {'resuming' if resume else 'training'} {out.name} ({recipe.train.max_steps} steps)")
    start = time.perf_counter()
    with judge_factory() as judge:
        result = train(recipe, judge, resume=resume)
    train_s = time.perf_counter() - start
    if result.final_model_dir is None:
        raise UserError(f"the RL run in {out} stopped before its last step; run the demo again to resume it")
    marker.write_text(json.dumps({"recipe": recipe.to_dict(), "train_s": train_s}, default=str) + "\n")
    return result.final_model_dir, train_s


# --------------------------------------------------------------------------------------------- run


def quiet_library_progress_bars() -> None:
    """transformers' and datasets' tqdm bars (weights loading, shard writing) and a deprecation warning
    that TRL triggers at every save would bury the demo's own output."""
    import warnings

    import datasets
    import transformers

    transformers.utils.logging.disable_progress_bar()
    datasets.disable_progress_bars()
    warnings.filterwarnings(
        "ignore", message=".*is_gradient_checkpointing.*is deprecated", category=FutureWarning
    )


@dataclass
class VariantResult:
    variant: Variant
    run_dir: Path
    after: Evaluation
    ci: BootstrapInterval
    reward_cis: dict[str, BootstrapInterval]
    steps: int
    train_s: float

    @property
    def balanced_rise(self) -> bool:
        """The demo's claim: b-CapScore up with an interval above zero, and no reward's mean down."""
        return self.ci.low > 0 and all(ci.delta >= 0 for ci in self.reward_cis.values())


@dataclass
class DemoResult:
    root: Path
    before: Evaluation
    variants: list[VariantResult] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)  # wall seconds per stage
    cpu_timings: dict[str, float] = field(default_factory=dict)  # CPU seconds per stage
    summary_path: Path | None = None
    comparison_path: Path | None = None
    report_dir: Path | None = None  # where summary.json and the rest went: root, or root/steps-N
    written: list[str] = field(default_factory=list)  # the report's files this run wrote there


def _samples_markdown(
    data_dir: Path,
    before: Evaluation,
    results: Sequence[VariantResult],
    n: int,
    temperature: float,
    where: Path,
) -> str:
    """The page written in ``where``, whose image links are relative to it."""
    from balcaprl.data.format import read_split_rows

    rows = read_split_rows(data_dir, "eval")[:n]
    how = "Greedy captions" if temperature == 0 else f"Captions sampled at temperature {temperature:g}"
    lines = ["# Held-out captions before and after RL", ""]
    lines.append(f"{how} of the first held-out scenes; scores from the oracle judge (b-CapScore rubric).")
    lines.append("")

    def scored(record: dict[str, Any]) -> str:
        return (
            f"b-CapScore {100 * record['b_capscore']:.1f} · P {record['precision']:.2f} · R {record['recall']:.2f}"
            f" · L {record['linguistic']:.2f} · {record['tokens']} tokens"
        )

    for i, row in enumerate(rows):
        image = Path(os.path.relpath(data_dir / row["image"], where)).as_posix()
        lines += [f"## {row['id']}", "", f"![{row['id']}]({image})", ""]
        lines += [f"**reference** — {row['reference']}", ""]
        lines += [
            f"**SFT (before RL)** — {scored(before.records[i])}",
            "",
            f"> {before.records[i]['caption']}",
            "",
        ]
        for result in results:
            record = result.after.records[i]
            lines += [
                f"**{result.variant.name} (after RL)** — {scored(record)}",
                "",
                f"> {record['caption']}",
                "",
            ]
    return "\n".join(lines)


def _step_rows(metrics_path: Path) -> list[dict[str, Any]]:
    from balcaprl.train.metrics import read_jsonl

    return [m for m in read_jsonl(metrics_path) if m.get("kind") == "step"]


def check_rl_recipes(config: DemoConfig, variants: Sequence[Variant], steps: int | None, root: Path) -> None:
    """Each variant's RL recipe as TRL will get it (one process; the batch layout, pass-through values),
    so a setting the trainer refuses fails now; the paths do not matter for that."""
    from balcaprl.errors import ConfigError
    from balcaprl.train.trl_backend import grpo_config

    for variant in variants:
        overrides = list(variant.overrides) + ([f"train.max_steps={steps}"] if steps is not None else [])
        recipe = config.training_recipe(root / "sft", root / "data", root / "rl" / variant.name, overrides)
        try:
            grpo_config(recipe, world_size=1)
        except ConfigError as error:
            raise ConfigError(f"recipe (variant {variant.name}): {error}") from None


def run_demo(
    config: DemoConfig,
    variants: Sequence[Variant],
    *,
    steps: int | None = None,
    log: Log = print,
    progress: ProgressFactory = Progress,
) -> DemoResult:
    """Run the pipeline for ``variants`` (all sharing one dataset, SFT policy and "before" evaluation).
    ``steps`` overrides the recipe's ``train.max_steps`` (quick sweeps). ``log`` gets one line per
    stage; ``progress`` makes the reporters of the long stages (SFT steps, held-out captions)."""
    from balcaprl.synthetic.oracle import OracleJudge

    if not variants:
        raise UserError("no variant to run")
    root = Path(config.output_dir).expanduser()
    check_rl_recipes(config, variants, steps, root)  # before the first stage, not after an hour of them
    import torch

    torch.set_num_threads(config.threads)
    root.mkdir(parents=True, exist_ok=True)
    (root / "demo_config.yaml").write_text(config.to_yaml(), encoding="utf-8")
    timings: dict[str, float] = {}
    cpu_timings: dict[str, float] = {}
    clock, cpu_clock = time.perf_counter(), time.process_time()

    def lap(name: str) -> None:
        # Wall and CPU seconds (this process's threads, the judge server's included) per stage: on a
        # busy machine wall time grows with the load, CPU time much less.
        nonlocal clock, cpu_clock
        now, cpu_now = time.perf_counter(), time.process_time()
        timings[name] = round(timings.get(name, 0.0) + now - clock, 1)
        cpu_timings[name] = round(cpu_timings.get(name, 0.0) + cpu_now - cpu_clock, 1)
        clock, cpu_clock = now, cpu_now

    data_dir = ensure_dataset(config, root, log)
    lap("dataset")
    sft_dir = ensure_sft(config, data_dir, root, log, progress)
    lap("sft")
    oracle = OracleJudge.from_dataset(data_dir)
    before = ensure_evaluation(sft_dir, data_dir, config, "sft", "SFT", root, log, oracle, progress)
    lap("eval_before")

    result = DemoResult(root=root, before=before, timings=timings, cpu_timings=cpu_timings)
    e = config.evaluation
    for variant in variants:
        overrides = list(variant.overrides) + ([f"train.max_steps={steps}"] if steps is not None else [])
        run_dir = root / "rl" / rl_folder_name(variant, steps)
        recipe = config.training_recipe(sft_dir.resolve(), data_dir.resolve(), run_dir, overrides)
        final, train_s = ensure_rl(recipe, lambda: oracle_judge(config, data_dir, oracle, log), log)
        lap(f"rl/{variant.name}")
        after = ensure_evaluation(
            final, data_dir, config, run_dir.name, variant.name, root, log, oracle, progress
        )
        lap(f"eval/{variant.name}")
        boot = dict(samples=e.bootstrap_samples, level=e.level, seed=e.seed)
        ci = paired_bootstrap(
            before.per_scene("b_capscore"), after.per_scene("b_capscore"), scale=100.0, **boot
        )
        reward_cis = {
            k: paired_bootstrap(before.per_scene(k), after.per_scene(k), **boot)
            for k in ("precision", "recall", "linguistic")
        }
        step_rows = _step_rows(run_dir / "metrics.jsonl")
        if step_rows:
            plot_training_curves(
                step_rows, run_dir / "training_curves.png", title=f"balcaprl demo, {variant.name}"
            )
        result.variants.append(
            VariantResult(variant, run_dir, after, ci, reward_cis, recipe.train.max_steps or 0, train_s)
        )

    # The report: at the top of the run folder for a run of the recipe's length; a run with --steps (a
    # smoke test, a quick sweep) reports in a folder of its own, so it never overwrites the results of
    # a finished run. One variant's curves are copied up; with several, each is in rl/VARIANT/, and
    # the curves of an earlier single-variant report here would be stale, so they go.
    report = result.report_dir = root if steps is None else root / f"steps-{steps}"
    report.mkdir(parents=True, exist_ok=True)
    curves = report / "training_curves.png"
    if len(result.variants) == 1 and (result.variants[0].run_dir / "training_curves.png").is_file():
        shutil.copyfile(result.variants[0].run_dir / "training_curves.png", curves)
        result.written.append(curves.name)
    else:
        curves.unlink(missing_ok=True)
    (report / "samples.md").write_text(
        _samples_markdown(data_dir, before, result.variants, e.show, config.evaluation_temperature(), report),
        encoding="utf-8",
    )
    result.written.append("samples.md")
    if len(result.variants) > 1:
        rows = comparison_rows(
            before.held_out, [(r.variant.name, r.after.held_out, r.ci, r.steps) for r in result.variants]
        )
        (report / "comparison.md").write_text(comparison_markdown(rows), encoding="utf-8")
        (report / "comparison.csv").write_text(comparison_csv(rows), encoding="utf-8")
        result.comparison_path = report / "comparison.md"
        result.written += ["comparison.md", "comparison.csv"]
    lap("report")
    result.summary_path = write_summary(result, config)
    return result


def write_summary(result: DemoResult, config: DemoConfig) -> Path:
    summary = {
        "output_dir": str(result.root),
        "judge_transport": config.judge.transport,
        "evaluation_temperature": config.evaluation_temperature(),
        "held_out_scenes": result.before.held_out.n,
        "before": result.before.held_out.to_json(),
        "variants": {
            r.variant.name: {
                "run_dir": str(r.run_dir),
                "paper_row": r.variant.paper_row,
                "overrides": list(r.variant.overrides),
                "steps": r.steps,
                "train_s": round(r.train_s, 1),
                "after": r.after.held_out.to_json(),
                "b_capscore_change": r.ci.to_json(),
                "reward_changes": {k: ci.to_json() for k, ci in r.reward_cis.items()},
                "balanced_rise": r.balanced_rise,
            }
            for r in result.variants
        },
        "timings_s": result.timings,
        "cpu_timings_s": result.cpu_timings,
        "config": config.model_dump(mode="json"),
    }
    path = result.report_dir / SUMMARY_FILE
    result.written.insert(0, SUMMARY_FILE)
    path.write_text(json.dumps(summary, indent=2, allow_nan=False, default=str) + "\n", encoding="utf-8")
    return path
