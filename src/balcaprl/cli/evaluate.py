"""Evaluation commands: ``balcaprl caption``, ``score``, ``evaluate``, ``report``, ``evaluate-general``.

Thin on purpose: arguments in, one call into the evaluate (or judge) modules, a printed result out.
``score`` and the b-CapScore protocol of ``evaluate`` share one implementation
(:func:`balcaprl.evaluate.score.score_captions`).
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from balcaprl.cli.common import MIN_SCORED_HELP, OVERWRITE_HELP, RESUME_HELP, exit_if_short, implied_resume
from balcaprl.errors import InputError, UserError
from balcaprl.threads import DEFAULT_CPU_THREADS, THREADS_HELP


def caption(
    model: str = typer.Option(..., "--model", help="Checkpoint folder or hub id of the captioning model."),
    out: Path = typer.Option(..., "--out", help="Caption JSONL to write (the benchmark's own format goes next to it)."),
    images: Path | None = typer.Option(
        None, "--images", help="A balcaprl dataset folder, an image folder, or the benchmark's image folder."
    ),
    benchmark: str | None = typer.Option(
        None, "--benchmark", help="decapbench | captionqa | caparena: caption that benchmark's images."
    ),
    annotations: Path | None = typer.Option(
        None, "--annotations",
        help="The benchmark's file: DeCapBench annotation JSONL, CaptionQA questions, caparena_auto_600.json.",
    ),
    split: str = typer.Option("eval", "--split", help="Dataset split, for a balcaprl dataset."),
    limit: int | None = typer.Option(None, "--limit", min=1, help="Caption only the first N images."),
    backend: str = typer.Option("transformers", "--backend", help="transformers | vllm (the vllm extra)."),
    prompt: str = typer.Option(
        "detailed", "--prompt",
        help="Preset (detailed: 'Describe this image in detail.'; dataset: each row's own prompt) or your text.",
    ),
    max_new_tokens: int | None = typer.Option(
        None, "--max-new-tokens", min=1,
        help="Cap on each caption's tokens (default 250: even one unbroken sentence stays within the "
        "judge's 1,000-character bound on a claim, at ~4 characters a token).",
    ),
    temperature: float = typer.Option(0.0, "--temperature", min=0.0, help="0 = greedy."),
    top_p: float = typer.Option(
        1.0, "--top-p", min=0.0, max=1.0, help="Nucleus sampling mass (with --temperature > 0)."
    ),
    seed: int = typer.Option(0, "--seed", help="Sampling seed (with --temperature > 0)."),
    batch_size: int = typer.Option(8, "--batch-size", min=1, help="Images captioned at once."),
    device: str = typer.Option("auto", "--device", help="transformers: auto | cpu | cuda | cuda:1 ..."),
    dtype: str = typer.Option("auto", "--dtype", help="transformers: auto | float32 | bfloat16 | float16."),
    tensor_parallel: int = typer.Option(1, "--tensor-parallel", min=1, help="vllm: tensor_parallel_size."),
    multi_image: str = typer.Option(
        "lmms-eval", "--multi-image",
        help="CaptionQA entries with several images: lmms-eval (all of them, as lmms-eval's official task "
        "sends them), captionqa (all, after the count line the benchmark's own script adds; read from "
        "--official-captionqa-repo) or first (the first only).",
    ),
    official_captionqa_repo: Path | None = typer.Option(
        None, "--official-captionqa-repo",
        help="A checkout of the CaptionQA repository: --multi-image captionqa reads its count line from caption.py.",
    ),
    resume: bool = typer.Option(False, "--resume", help=RESUME_HELP + " (OUT, or OUT.part of an unfinished run)"),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace OUT and discard an unfinished run's OUT.part."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Report progress on stderr."),
    threads: int = typer.Option(DEFAULT_CPU_THREADS, "--threads", min=1, help=THREADS_HELP),
) -> None:  # fmt: skip
    """Caption images with a model; resumable (--resume); writes JSONL and the benchmark's own input format."""
    from balcaprl.evaluate.captioning import (
        GenerationSettings,
        TransformersCaptioner,
        VLLMCaptioner,
        caption_items,
        collect_items,
    )
    from balcaprl.model_paths import check_model_path
    from balcaprl.outputs import claim_output_file
    from balcaprl.progress import Progress

    if backend not in ("transformers", "vllm"):
        raise UserError(f"--backend {backend}: choose transformers or vllm")
    if multi_image not in ("captionqa", "lmms-eval", "first"):
        raise UserError(f"--multi-image {multi_image}: choose lmms-eval, captionqa or first")
    line = None
    if official_captionqa_repo is not None:
        from balcaprl.evaluate.official import load_captionqa_multi_image_line

        line, _ = load_captionqa_multi_image_line(official_captionqa_repo)
    items = collect_items(
        images, benchmark=benchmark, annotations=annotations, split=split, limit=limit,  # type: ignore[arg-type]
        multi_image=multi_image, multi_image_line=line,  # type: ignore[arg-type]
    )  # fmt: skip
    part = out.with_name(out.name + ".part")
    claim_output_file(out, what="--out", partial=[part], resume=resume, overwrite=overwrite)
    check_model_path(model, "--model")  # before anything is written; an unreachable hub: the cache or exit 2
    chosen = {"max_new_tokens": max_new_tokens} if max_new_tokens is not None else {}
    settings = GenerationSettings(
        **chosen,
        temperature=temperature,
        top_p=top_p,
        seed=seed,
        batch_size=batch_size,
    )
    if backend == "transformers":
        from balcaprl.threads import use_cpu_threads

        use_cpu_threads(threads, on_cpu=None if device == "auto" else device == "cpu")
        captioner = TransformersCaptioner(model, device=device, dtype=dtype)
    else:
        most = max((len(i.images) for i in items), default=1)
        captioner = VLLMCaptioner(
            model, tensor_parallel_size=tensor_parallel, limit_mm_per_prompt={"image": most}
        )
    with Progress(f"captioning with {model}", total=len(items), unit="images", enabled=progress) as bar:
        run = caption_items(
            items, captioner, out, prompt=prompt, benchmark=benchmark, settings=settings, overwrite=overwrite,
            on_progress=lambda done, total: setattr(bar, "completed", done),
        )  # fmt: skip
    typer.echo(
        f"{len(run.rows)} captions ({run.generated} generated now, {len(run.rows) - run.generated} resumed)"
    )
    typer.echo(f"wrote {run.out}\nwrote {run.native}")


def score(
    images: Path = typer.Option(
        ..., "--images", help="Folder the caption files' image names are relative to."
    ),
    captions: Path = typer.Option(
        ..., "--captions", help='JSONL {"image", "caption"} lines, or a JSON {image: caption}.'
    ),
    references: Path = typer.Option(
        ..., "--references", help="Same formats; the reference caption per image."
    ),
    judge: Path = typer.Option(..., "--judge", help="Judge config YAML (base_url, model, api_key_env, ...)."),
    out: Path = typer.Option(..., "--out", help="Folder for scores.jsonl and summary.json."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Do not read or write the verdict cache."),
    cache: Path | None = typer.Option(None, "--cache", help="Verdict cache file (overrides cache_path)."),
    resamples: int = typer.Option(
        1000, "--bootstrap-resamples", min=100, help="Bootstrap resamples for the CIs."
    ),
    seed: int = typer.Option(0, "--seed", help="Bootstrap seed."),
    resume: bool = typer.Option(False, "--resume", help=RESUME_HELP),
    overwrite: bool = typer.Option(False, "--overwrite", help=OVERWRITE_HELP),
    min_scored: float = typer.Option(1.0, "--min-scored", min=0.0, max=1.0, help=MIN_SCORED_HELP),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Report progress on stderr."),
) -> None:
    """b-CapScore (x100) with precision, recall and linguistic quality, judged with the evaluation rubric.

    Every scored caption is recorded in OUT as it arrives: after an interruption, run the same
    command with --resume and only the unscored captions are judged (also with --no-cache).
    """
    from balcaprl.evaluate.score import score_captions, score_results
    from balcaprl.judge.client import build_judge
    from balcaprl.judge.protocol import JudgeFailure
    from balcaprl.outputs import claim_output_dir, shortfall
    from balcaprl.progress import Progress, make_console

    if not images.is_dir():
        raise InputError(f"--images {images} is not a folder")
    target = claim_output_dir(
        out, what="--out", results=score_results, resume=resume, overwrite=overwrite, resumable=(".score",)
    )
    judge_client = build_judge(judge, image_root=images, no_cache=no_cache, cache_path=cache)
    failed = 0

    def started(total: int, resumed: int) -> None:
        bar.total, bar.completed = total, resumed
        if resumed:
            bar.log(f"{resumed} captions scored by an earlier run (from {target.final}/.score/record.jsonl)")

    def judged(i: int, outcome) -> None:
        nonlocal failed
        if isinstance(outcome, JudgeFailure):
            failed += 1
            bar.status = f"{failed} failed"
        bar.advance()

    with target.committing(), Progress("judging", unit="captions", enabled=progress, transient=True) as bar:
        run = score_captions(
            judge_client, captions, references, target.work, resamples=resamples, seed=seed,
            on_start=started, on_outcome=judged,
        )  # fmt: skip
    from rich.table import Table  # after the last verdict: not on the way to the first call

    summary = run.summary
    table = Table(title=f"b-CapScore — {summary['n_scored']}/{summary['n_captions']} captions scored")
    for column in ("metric", "mean (x100)", "95% CI"):
        table.add_column(column)
    for name, figures in summary["metrics"].items():
        # every figure x100 with one decimal, as `evaluate` prints them (summary.json keeps the rewards
        # in [0, 1] and b-CapScore x100)
        scale = 1.0 if name == "b_capscore" else 100.0
        if figures is None:
            table.add_row(name, "-", "-")
        else:
            low, high = (scale * figures[k] for k in ("ci95_low", "ci95_high"))
            table.add_row(name, f"{scale * figures['mean']:.1f}", f"[{low:.1f}, {high:.1f}]")
    make_console().print(table)
    if summary["n_empty_captions"]:
        typer.echo(f"empty captions (scored 0, in the means): {summary['n_empty_captions']}")
    if summary["failures"]:
        typer.echo(f"failures (left out of the means): {json.dumps(summary['failures'])}")
        first = _first_failure(target.final / run.scores_path.name)
        if first is not None:
            typer.echo(f"first failure: {first}")
    if run.resumed:
        typer.echo(f"resumed: {run.resumed} captions scored by an earlier run, not judged again")
    typer.echo(_cache_line(summary["accounting"], judge_client.cache))
    final = target.final
    typer.echo(f"wrote {final / run.scores_path.name}\nwrote {final / run.summary_path.name}")
    reason = shortfall(summary["n_scored"], summary["n_captions"], min_scored, unit="captions", verb="scored")
    exit_if_short(reason, _retry_advice(summary["failures"]))


def _scored_nothing(out: Path, protocols: list[str]) -> str | None:
    """What ``out`` holds, in words, when its eval.json records the suite's protocols and none of them
    scored an item (a caption file whose keys matched nothing, say): nothing a refusal should keep.
    None otherwise."""
    from balcaprl.evaluate.suite import read_eval

    try:
        recorded = read_eval(out).get("results") or {}
    except (OSError, ValueError):
        return None
    results = [recorded.get(p) for p in protocols if p in recorded]
    if not results or any(not isinstance(r, dict) or r.get("n_scored", 1) != 0 for r in results):
        return None
    return f"the evaluation in {out}, which scored nothing"


def _first_failure(scores: Path) -> str | None:
    """``image: reason (detail)`` of the first failed row of ``scores.jsonl`` (read line by line)."""
    with scores.open(encoding="utf-8") as rows:
        for line in rows:
            row = json.loads(line)
            if row.get("failure"):
                detail = f" ({row['detail']})" if row.get("detail") else ""
                return f"{row['image']}: {row['failure']}{detail}"
    return None


def _cache_line(accounting: dict, cache) -> str:
    """Where the answers came from: a verdict from the cache was paid for by an earlier run."""
    where = (
        "the judge cache is off"
        if cache is None
        else f"{accounting['cache_hits']} from the judge cache {cache.path}"
    )
    return f"answers: {accounting['judged']} judged by {accounting['calls']} calls, {where}"


# Failures that the same request gets again: asking again cannot help, their cause must be fixed.
DETERMINISTIC_CAUSES = {
    "bad_input": "fix the bad inputs (each row's 'detail' says what)",
    "oversized_answer": (
        "the judge's answer broke a length bound (e.g. one claim over 1,000 characters: a caption "
        "written as one unbroken sentence); caption again with a smaller --max-new-tokens"
    ),
}


def _retry_advice(failures: dict[str, int]) -> str:
    """What to do about failed items: a deterministic failure's cause, named; anything else (a
    timeout, a server error, a rate limit) is retried by --resume."""
    if not failures:
        return ""
    causes = [DETERMINISTIC_CAUSES[reason] for reason in failures if reason in DETERMINISTIC_CAUSES]
    if not causes:
        return "run the same command with --resume to retry only the failed ones"
    if len(causes) == len(failures):
        return "; ".join(causes)
    return "; ".join([*causes, "run the same command with --resume to retry the other failed ones"])


def evaluate(
    captions: list[str] = typer.Option(
        ..., "--captions", help="Caption file (repeatable); BENCHMARK=FILE says which benchmark it is for."
    ),
    suite: str | None = typer.Option(
        None, "--suite", help="Comma-separated protocols to run (default: every protocol)."
    ),
    out: Path = typer.Option(..., "--out", help="Evaluation folder (eval.json + one folder per protocol)."),
    config: Path | None = typer.Option(None, "--config", help="Evaluation config YAML (files, judges, settings)."),
    judge: Path | None = typer.Option(None, "--judge", help="Judge config YAML for every protocol."),
    judge_for: list[str] = typer.Option(
        [], "--judge-for", help="PROTOCOL=JUDGE.yaml: another judge for one protocol (repeatable)."
    ),
    decapbench: Path | None = typer.Option(None, "--decapbench", help="DeCapBench annotation JSONL."),
    decapbench_images: Path | None = typer.Option(None, "--decapbench-images", help="DeCapBench image folder."),
    captionqa: Path | None = typer.Option(None, "--captionqa", help="CaptionQA question file."),
    caparena: Path | None = typer.Option(None, "--caparena", help="caparena_auto_600.json."),
    caparena_images: Path | None = typer.Option(None, "--caparena-images", help="CapArena image folder."),
    official_decapbench: Path | None = typer.Option(
        None, "--official-decapbench", help="A DeCapBench checkout: DCScore runs with its official prompts."
    ),
    official_caparena: Path | None = typer.Option(
        None, "--official-caparena", help="A CapArena checkout: CapArena runs with its official prompts."
    ),
    official_captionqa: str | None = typer.Option(
        None, "--official-captionqa",
        help="lmms-eval (the installed package) or an lmms-eval checkout: CaptionQA with its official prompts.",
    ),
    label: str | None = typer.Option(None, "--label", help="The run's name in reports (default: the folder)."),
    cache: Path | None = typer.Option(None, "--cache", help="Judge cache file (default: the judge config's, or OUT/)."),
    no_cache: bool = typer.Option(
        False, "--no-cache",
        help="No shared judge cache; OUT keeps its own record of paid answers, so --resume still pays once.",
    ),
    resume: bool = typer.Option(False, "--resume", help=RESUME_HELP),
    overwrite: bool = typer.Option(
        False, "--overwrite", help="Replace the suite's results in OUT (other protocols' results are kept)."
    ),
    min_scored: float = typer.Option(1.0, "--min-scored", min=0.0, max=1.0, help=MIN_SCORED_HELP),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Report progress on stderr."),
) -> None:  # fmt: skip
    """Score captions with b-CapScore, DCScore, CaptionQA and CapArena-Auto; resumable (--resume)."""
    from balcaprl.evaluate.config import PROTOCOLS, load_evaluation_config
    from balcaprl.evaluate.suite import ANSWER_RECORD, evaluation_results, read_eval, run_suite
    from balcaprl.files import read_utf8_text
    from balcaprl.outputs import claim_output_dir, remove, shortfall
    from balcaprl.progress import Progress

    flags = {"--decapbench": decapbench, "--decapbench-images": decapbench_images, "--captionqa": captionqa,
             "--caparena": caparena, "--caparena-images": caparena_images}  # fmt: skip
    overrides: dict = {
        "judge": str(judge) if judge else None,
        **{
            name: {key: flags.get(flag) for key, (_, flag) in protocol.section.INPUTS.items()}
            for name, protocol in PROTOCOLS.items()
        },
        "official": {
            "decapbench": official_decapbench,
            "caparena": official_caparena,
            "captionqa": official_captionqa,
        },
    }
    for spec in judge_for:
        protocol, _, path = spec.partition("=")
        if not path or protocol not in PROTOCOLS:
            raise UserError(f"--judge-for {spec!r}: expected PROTOCOL=FILE with a protocol of the suite")
        overrides[protocol]["judge"] = path
    names = [p.strip() for p in suite.split(",") if p.strip()] if suite is not None else list(PROTOCOLS)
    settings = load_evaluation_config(config, overrides)
    for spec in captions:  # text inputs must be UTF-8: an error naming the byte, never a traceback
        benchmark, _, rest = spec.partition("=")
        path = rest if rest and benchmark in {p.benchmark for p in PROTOCOLS.values()} else spec
        if not read_utf8_text(path, "--captions").strip():
            exit_if_short(f"--captions {path} holds no captions: nothing scored")
    for flag, path in flags.items():
        if path is not None and path.is_file():
            read_utf8_text(path, flag)
    resume = implied_resume(resume, overwrite, _scored_nothing(out, names))
    target = claim_output_dir(
        out, what="--out", results=lambda folder: evaluation_results(folder, names), resume=resume,
        overwrite=overwrite, copy=["*"], resumable=["judge_cache.sqlite*", f"{ANSWER_RECORD}*"],
    )  # fmt: skip
    if target.replacing:  # the suite's protocols start afresh; the other protocols' results stay
        remove(target.work, names)
        label = label or read_eval(target.final).get("label") or target.final.name
    if no_cache:  # no shared cache, but every paid answer is kept in OUT for --resume
        cache = target.work / ANSWER_RECORD
    bars: dict[str, Progress] = {}

    def on_start(protocol: str, n: int) -> None:
        for bar in bars.values():
            bar.close()
        bars[protocol] = Progress(protocol, total=n, unit="items", enabled=progress, transient=True).start()

    def on_progress(protocol: str, done: int, total: int) -> None:
        bars[protocol].total, bars[protocol].completed = total, done

    try:
        with target.committing():
            results = run_suite(
                captions, names, target.work, settings, label=label, cache_path=cache, no_cache=False,
                on_start=on_start, on_progress=on_progress,
            )  # fmt: skip
    finally:
        for bar in bars.values():
            bar.close()
    for name, result in results.items():
        value = "–" if result.score is None else f"{result.score:.1f}"
        line = f"{name:>10}: {value}  ({result.n_scored} scored"
        if result.failures:
            line += f", failed: {json.dumps(result.failures)}"
        if result.missing:
            line += (
                f", {len(result.missing)} without a caption (first: {result.missing[0]!r})"  # the key sought
            )
        if result.refused:
            line += f", {len(result.refused)} benchmark rows refused (see eval.json)"
        if result.metrics.get("n_invalid"):
            line += f", {result.metrics['n_invalid']} invalid (left out, as the official scorer does)"
        prompts = (result.settings.get("prompts") or {}).get("kind")
        if prompts:
            line += f", {prompts} prompts"
        if "cache_hits" in result.stats:  # a cached answer was paid for by an earlier run
            line += (
                f", {result.stats['calls']} judge calls, {result.stats['cache_hits']} answers from the cache"
            )
        typer.echo(line + ")")
        if name == "caparena" and result.metrics.get("length_words") is not None:
            typer.echo(f"{'length':>10}: {result.metrics['length_words']:.0f} words")
    if any(r.failures for r in results.values()):
        typer.echo("failures are left out of the scores")
    typer.echo(f"wrote {target.final / 'eval.json'}")
    reasons = []
    for name, result in results.items():
        attempted = result.n_scored + sum(result.failures.values())
        reason = shortfall(result.n_scored, attempted, min_scored, unit="items with a caption", verb="scored")
        if reason is not None:
            reasons.append(f"{name}: {reason}")
    failures: dict[str, int] = {}
    for result in results.values():
        for key, n in result.failures.items():
            failures[key] = failures.get(key, 0) + n
    exit_if_short("; ".join(reasons) or None, _retry_advice(failures))


def report(
    runs: list[Path] = typer.Argument(None, help="Evaluation folders, or run folders holding them."),
    out: Path = typer.Option(Path("report"), "--out", help="Folder for report.md, report.csv, report.png."),
    baseline: str | None = typer.Option(None, "--baseline", help="The row the deltas are taken against."),
    published: str | None = typer.Option(
        None, "--published",
        help="Add the paper's Table 1 rows: all, or ids/families (qwen2.5-vl-3b, proprietary, llava-1.5-7b/baseline).",
    ),
    human_ranking: Path | None = typer.Option(
        None, "--human-ranking", help="Human ranking (models best first, or CSV model,score) for Spearman."
    ),
    title: str = typer.Option("Caption evaluation", "--title", help="Heading of report.md and report.png."),
) -> None:  # fmt: skip
    """Table 1 of the paper for your runs (deltas, best marked), a comparison figure, and Spearman."""
    from balcaprl.evaluate.report import build_report

    result = build_report(  # an InputError (a UserError) says what is wrong
        runs or [], out, baseline=baseline, published=published, human_ranking=human_ranking, title=title
    )
    typer.echo(result.markdown)
    typer.echo(f"wrote {out / 'report.md'}, {out / 'report.csv'}, {out / 'report.png'}")


def evaluate_general(
    model: str | None = typer.Option(None, "--model", help="Checkpoint to evaluate (lmms-eval's pretrained=)."),
    out: Path = typer.Option(..., "--out", help="Evaluation folder; results go into its eval.json."),
    benchmarks: str | None = typer.Option(
        None, "--benchmarks", help="Comma-separated subset (default: the paper's ten)."
    ),
    model_type: str = typer.Option(
        "qwen2_5_vl", "--model-type", help="lmms-eval --model: qwen2_5_vl, llava_hf, llava_onevision, ..."
    ),
    model_args: str | None = typer.Option(None, "--model-args", help="Extra model_args, e.g. max_pixels=12845056."),
    batch_size: int = typer.Option(1, "--batch-size", min=1, help="lmms-eval --batch_size."),
    num_processes: int = typer.Option(1, "--num-processes", min=1, help="GPUs, through accelerate launch."),
    limit: int | None = typer.Option(None, "--limit", min=1, help="lmms-eval --limit (smoke tests)."),
    extra: list[str] = typer.Option([], "--lmms-eval-arg", help="More lmms-eval arguments (repeatable)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the command, run nothing."),
    import_only: Path | None = typer.Option(
        None, "--import-only", help="Import this lmms-eval *_results.json (or folder) instead of running."
    ),
    label: str | None = typer.Option(None, "--label", help="The run's name in reports."),
) -> None:  # fmt: skip
    """Run lmms-eval's general benchmarks (Table 2) on a checkpoint and import the scores."""
    from balcaprl.evaluate.general import (
        find_results_file,
        import_lmms_eval_results,
        lmms_eval_command,
        record_general,
        run_lmms_eval,
        select,
        shell_line,
    )

    chosen = select([b.strip() for b in benchmarks.split(",")] if benchmarks else None)
    output_path = out / "lmms_eval"
    if import_only is None:
        if model is None:
            raise UserError("give --model (or --import-only FILE)")
        argv = lmms_eval_command(
            model, output_path, benchmarks=chosen, model_type=model_type, model_args=model_args,
            batch_size=batch_size, num_processes=num_processes, limit=limit, extra=extra,
        )  # fmt: skip
        typer.echo(shell_line(argv))
        if dry_run:
            return
        status = run_lmms_eval(argv, model=model)  # UserError when lmms-eval is not installed
        if status != 0:
            raise UserError(f"lmms-eval exited with status {status}; nothing imported")
        source = output_path
    else:
        source = import_only
    results_file = source if Path(source).is_file() else find_results_file(Path(source))
    imported = import_lmms_eval_results(results_file)
    path = record_general(out, imported, label=label)
    for name, value in imported["scores"].items():
        typer.echo(f"{name:>10}: {value:.2f}")
    if imported["missing"]:
        typer.echo(f"not in the results: {', '.join(imported['missing'])}")
    typer.echo(f"wrote {path}")
