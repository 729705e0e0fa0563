"""``balcaprl synthetic ...``: the offline synthetic world piece by piece. Thin: parse arguments,
call into the modules, print."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import typer

from balcaprl.cli.common import OVERWRITE_HELP
from balcaprl.errors import UserError
from balcaprl.synthetic.sft_config import SFTConfig
from balcaprl.threads import DEFAULT_CPU_THREADS, THREADS_HELP

_SFT = SFTConfig()  # the warm start's defaults, one copy for this command, the demo and the library


def build(
    out: Path = typer.Option(..., "--out", help="Dataset folder to write."),
    n_train: int = typer.Option(2000, "--n-train", min=1, help="Training scenes."),
    n_eval: int = typer.Option(200, "--n-eval", min=1, help="Held-out scenes."),
    seed: int = typer.Option(0, "--seed", help="Same seed, same dataset."),
    image_size: int = typer.Option(224, "--image-size", min=24, help="Rendered image side in pixels."),
    world: str = typer.Option(
        "full",
        "--world",
        help="full: the whole world (2-7 shapes, every kind, colour, word and texture); demo: the corner "
        "`balcaprl demo` trains in (2-3 shapes, fewer kinds and colours), where its warm start learns to see.",
    ),
    min_objects: int | None = typer.Option(
        None, "--min-objects", min=1, max=9, help="Fewest shapes in a scene (default: the world's)."
    ),
    max_objects: int | None = typer.Option(
        None, "--max-objects", min=1, max=9, help="Most shapes in a scene (default: the world's)."
    ),
    policy: Path | None = typer.Option(
        None, "--policy", help="Count reference_tokens with this policy's tokenizer."
    ),
    resume: bool = typer.Option(
        False, "--resume", help="Keep the dataset in --out if it is this build; else finish or redo it."
    ),
    overwrite: bool = typer.Option(False, "--overwrite", help=OVERWRITE_HELP),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Report rendering progress."),
) -> None:
    """Write scenes, images and reference captions in the pinned dataset format (+ scenes.jsonl)."""
    from balcaprl.outputs import claim_output_dir, remove
    from balcaprl.synthetic.build import build_dataset, build_results, build_settings, built_settings
    from balcaprl.synthetic.scenes import SceneSpec

    if world not in ("full", "demo"):
        raise UserError(f"--world {world}: choose full or demo")
    spec = SceneSpec()
    if world == "demo":
        from balcaprl.demo.config import DatasetSettings

        spec = DatasetSettings().scene_spec()
    bounds = {"min_objects": min_objects, "max_objects": max_objects}
    spec = dataclasses.replace(
        spec, **{k: v for k, v in bounds.items() if v is not None}
    )  # ConfigError names them
    target = claim_output_dir(out, what="--out", results=build_results, resume=resume, overwrite=overwrite)
    if target.mode == "resume" and build_results(target.final):
        wanted = build_settings(n_train, n_eval, seed, image_size, spec, policy)
        existing = built_settings(target.final)
        if existing == wanted:
            typer.echo(f"{target.final} already holds this dataset ({n_train} train + {n_eval} eval scenes)")
            return
        if existing is not None:
            changed = ", ".join(k for k in wanted if wanted[k] != existing.get(k))
            raise UserError(
                f"--out {target.final} holds a synthetic dataset built with other settings ({changed}); "
                "--resume only finishes the same build: pass --overwrite to replace it"
            )
        remove(target.final, build_results(target.final))  # an unfinished build: nothing is kept
    with target.committing():
        build_dataset(
            target.work, n_train, n_eval, seed, image_size=image_size, spec=spec, policy_dir=policy,
            progress=progress,
        )  # fmt: skip
    typer.echo(f"wrote {n_train} train + {n_eval} eval scenes to {target.final}")


def sft(
    data: Path = typer.Option(..., "--data", help="Dataset folder from `balcaprl synthetic build`."),
    out: Path = typer.Option(..., "--out", help="Policy folder to write (loadable with from_pretrained)."),
    policy: Path | None = typer.Option(
        None, "--policy", help="Start from this policy (default: a fresh tiny one)."
    ),
    steps: int = typer.Option(_SFT.steps, "--steps", min=1, help="Optimizer steps."),
    batch_size: int = typer.Option(
        _SFT.batch_size, "--batch-size", min=1, help="Captions per optimizer step."
    ),
    lr: float = typer.Option(
        _SFT.lr, "--lr", help="Peak learning rate (warm-up, then cosine decay to a tenth of it)."
    ),
    flawed_fraction: float = typer.Option(
        _SFT.flawed_fraction,
        "--flawed-fraction",
        min=0.0,
        max=1.0,
        help="Share of targets replaced by a flawed caption (terse, enumerating, ...), as real SFT data has.",
    ),
    seed: int = typer.Option(
        _SFT.seed, "--seed", help="Seed of the run: starting weights, data order, flawed captions."
    ),
    eval_limit: int = typer.Option(
        _SFT.eval_limit, "--eval-limit", min=0, help="Held-out scenes to score (0: skip)."
    ),
    evaluate_before: bool = typer.Option(False, "--evaluate-before", help="Also score the starting policy."),
    overwrite: bool = typer.Option(
        False, "--overwrite", help="Replace the policy already in --out (kept until the new one is saved)."
    ),
    progress: bool = typer.Option(
        True,
        "--progress/--no-progress",
        help="Report progress on stderr (a bar, or periodic lines in a log).",
    ),
    threads: int = typer.Option(DEFAULT_CPU_THREADS, "--threads", min=1, help=THREADS_HELP),
) -> None:
    """Teacher-forced warm start on references mixed with flawed captions; prints held-out b-CapScore."""
    from balcaprl.outputs import claim_output_dir
    from balcaprl.progress import Progress
    from balcaprl.synthetic.sft import policy_results, run_sft
    from balcaprl.threads import use_cpu_threads

    use_cpu_threads(threads, on_cpu=True)  # the synthetic policy always runs on the CPU

    if evaluate_before and eval_limit == 0:
        raise UserError("--evaluate-before scores held-out scenes: give --eval-limit above 0")
    config = SFTConfig(
        steps=steps,
        batch_size=batch_size,
        lr=lr,
        flawed_fraction=flawed_fraction,
        seed=seed,
        eval_limit=eval_limit,
    )
    # No --resume: an SFT run keeps no checkpoint to continue from.
    target = claim_output_dir(
        out, what="--out", results=policy_results, overwrite=overwrite, offers_resume=False
    )
    # A bar on a terminal; a line every 30 s with steps, rate and ETA in a log.
    with target.committing(), Progress("sft", total=steps, unit="steps", enabled=progress) as reporter:
        result = run_sft(
            data, target.work, policy=policy, config=config, progress=reporter,
            evaluate_before=evaluate_before, final_dir=target.final,
        )  # fmt: skip
    typer.echo(
        f"saved policy to {result.policy_dir} ({result.steps} steps, {result.wall_s:.0f} s of training)"
    )
    for label, scores in (
        ("before", result.before),
        ("after SFT", result.after),
        ("references", result.references),
    ):
        if scores is not None:
            typer.echo(f"held-out {label:>10}: {scores.summary()}")


def show(
    data: Path = typer.Option(..., "--data", help="Dataset folder from `balcaprl synthetic build`."),
    index: int = typer.Option(0, "--index", min=0, help="Row of the split."),
    split: str = typer.Option("eval", "--split", help="Dataset split: train or eval."),
    caption: str | None = typer.Option(
        None, "--caption", help="Judge this caption instead of the reference."
    ),
    rubric: str = typer.Option(
        "training", "--rubric", help="training | evaluation | training_without_pointability"
    ),
) -> None:
    """Print one sample's scene graph, reference, and the oracle's verdict on a caption."""
    from balcaprl.data.format import read_split_rows
    from balcaprl.judge.protocol import Judgement, JudgeRequest
    from balcaprl.judge.rubrics import VERDICT_RUBRICS
    from balcaprl.rewards import BCAPSCORE_REWARDS, b_capscore, score_rollout
    from balcaprl.synthetic.oracle import OracleJudge

    if rubric not in VERDICT_RUBRICS:
        raise UserError(f"--rubric {rubric}: choose {', '.join(VERDICT_RUBRICS)}")
    rows = read_split_rows(data, split)
    if index >= len(rows):
        raise UserError(f"--index {index} out of range: {split} has {len(rows)} rows")
    row = rows[index]
    oracle = OracleJudge.from_dataset(data)
    scene = oracle.lookup(row["image_path"])
    outcome = oracle.judge(
        JudgeRequest(row["image_path"], caption or row["reference"], row["reference"], rubric)
    )  # type: ignore[arg-type]
    typer.echo(
        f"image: {row['image_path']}\nscene: {json.dumps(scene.to_dict())}\nreference: {row['reference']}"
    )
    if caption:
        typer.echo(f"caption: {caption}")
    if isinstance(outcome, Judgement):
        r = score_rollout(outcome.verdict, BCAPSCORE_REWARDS)
        typer.echo(json.dumps(outcome.verdict.model_dump(), indent=2))
        typer.echo(  # x100 with one decimal, as score, evaluate and inspect print them
            f"precision {100 * r.precision:.1f}  recall {100 * r.recall:.1f}  linguistic {100 * r.linguistic:.1f}  "
            f"b-CapScore {100 * b_capscore(r.precision, r.recall, r.linguistic):.1f}  (x100)"
        )
    else:
        typer.echo(f"judge failure: {outcome.reason}: {outcome.detail}")


def caption(
    policy: Path = typer.Option(..., "--policy", help="Policy folder (e.g. from `balcaprl synthetic sft`)."),
    data: Path = typer.Option(..., "--data", help="Dataset folder from `balcaprl synthetic build`."),
    n: int = typer.Option(5, "--n", min=1, help="Held-out images to caption."),
    split: str = typer.Option("eval", "--split", help="Dataset split: train or eval."),
    threads: int = typer.Option(DEFAULT_CPU_THREADS, "--threads", min=1, help=THREADS_HELP),
) -> None:
    """Caption held-out images greedily with a policy and score each caption with the oracle."""
    from PIL import Image

    from balcaprl.threads import use_cpu_threads

    use_cpu_threads(threads, on_cpu=True)  # the synthetic policy always runs on the CPU

    from balcaprl.data.format import read_split_rows
    from balcaprl.synthetic.evaluation import score_captions
    from balcaprl.synthetic.oracle import OracleJudge
    from balcaprl.synthetic.policy import generate_captions, load_policy

    model, processor = load_policy(policy)
    rows = read_split_rows(data, split)[:n]
    captions = generate_captions(model, processor, [Image.open(r["image_path"]) for r in rows])
    scores = score_captions(OracleJudge.from_dataset(data), rows, captions)
    for row, text, value in zip(rows, captions, scores.per_caption, strict=True):
        typer.echo(
            f"{row['id']}  b-CapScore {100 * value:5.1f}\n  caption:   {text}\n  reference: {row['reference']}"
        )
    typer.echo(scores.summary())


def init_policy(
    out: Path = typer.Option(..., "--out", help="Folder for a fresh random-initialised tiny policy."),
    seed: int = typer.Option(0, "--seed", help="Seed of the random weights."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace the policy already in --out."),
) -> None:
    """Save an untrained tiny policy (model + processor + chat template)."""
    from balcaprl.outputs import claim_output_dir
    from balcaprl.synthetic.policy import create_policy
    from balcaprl.synthetic.sft import policy_results

    target = claim_output_dir(
        out, what="--out", results=policy_results, overwrite=overwrite, offers_resume=False
    )
    with target.committing():
        create_policy(target.work, seed=seed)
    typer.echo(f"wrote {target.final}")


def probe(
    policy: Path = typer.Option(..., "--policy", help="Policy folder (e.g. from `balcaprl synthetic sft`)."),
    data: Path = typer.Option(..., "--data", help="Dataset folder from `balcaprl synthetic build`."),
    prompts: int = typer.Option(48, "--prompts", min=1, help="Training images, one group each."),
    rollouts: int = typer.Option(8, "--rollouts", min=2, help="Sampled captions per image."),
    temperature: float = typer.Option(0.7, "--temperature", min=0.01, help="Sampling temperature."),
    max_new_tokens: int = typer.Option(
        192, "--max-new-tokens", min=1, help="Caption cap (the demo's rollout cap)."
    ),
    seed: int = typer.Option(0, "--seed", help="Sampling seed."),
    save: Path | None = typer.Option(
        None, "--save", help="Also keep the sampled groups as JSON lines (a fixed sample for tests)."
    ),
) -> None:
    """Measure the world's incentives at a policy's RL start: length band, terse share, correlations."""
    from balcaprl.synthetic.probe import policy_groups, probe_groups, save_groups

    groups = policy_groups(
        policy, data, prompts=prompts, rollouts=rollouts, temperature=temperature,
        max_new_tokens=max_new_tokens, seed=seed,
    )  # fmt: skip
    if save is not None:
        command = (
            f"balcaprl synthetic probe --policy {policy} --data {data} --prompts {prompts} --rollouts {rollouts} "
            f"--temperature {temperature:g} --max-new-tokens {max_new_tokens} --seed {seed} --save {save}"
        )
        save_groups(groups, save, command=command)
        typer.echo(f"saved {len(groups)} groups to {save}")
    found = probe_groups(groups)
    p, r, ling = found.variance_shares
    lp, lr, ll = found.length_corr
    typer.echo(
        f"{found.n_captions} captions ({prompts} x {rollouts}), Table 3's equal weights, length mask 0.5 / 2\n"
        f"length ratio: mean {found.mean_ratio:.2f}, below tau_l {found.below_band_share:.1%}, "
        f"above tau_u {found.above_band_share:.1%}; terse (below tau_l, precision 1) {found.terse_share:.1%}\n"
        f"within-group correlation precision-recall {found.precision_recall_corr:+.2f}; "
        f"with length P {lp:+.2f} R {lr:+.2f} L {ll:+.2f}\n"
        f"c-GDPO vs GRPO advantage correlation {found.advantage_corr:.3f}; "
        f"GRPO within-group variance shares P {p:.2f} R {r:.2f} L {ling:.2f}"
    )
