"""``balcaprl judge serve``: a local judge behind the OpenAI-compatible API (for tests and the demo).
``balcaprl judge audit``: re-judge a sample of captions and measure how far to trust a judge."""

from __future__ import annotations

from pathlib import Path

import typer

from balcaprl.errors import InputError, UserError

LOOPBACK = ("127.0.0.1", "::1", "localhost")


def serve(
    host: str = typer.Option("127.0.0.1", "--host", help="Interface to bind; keep the loopback default."),
    port: int = typer.Option(0, "--port", min=0, max=65535, help="Port; 0 picks a free one (printed)."),
    oracle: Path | None = typer.Option(
        None,
        "--oracle",
        help="Serve the synthetic oracle judge of this dataset folder instead of the scripted judge.",
    ),
    latency: float = typer.Option(0.0, "--latency", min=0.0, help="Scripted judge: seconds per answer."),
    faults: str | None = typer.Option(
        None,
        "--faults",
        help="Scripted faults: a JSON FaultScript file, or the JSON itself ('{\"rules\": ...}').",
    ),
    api_key_env: str | None = typer.Option(
        None, "--api-key-env", help="Require the key in this environment variable (default: no auth)."
    ),
    flip_rate: float = typer.Option(
        0.0, "--flip-rate", min=0.0, max=1.0,
        help="--oracle: flip each pointable/visible/covered flag with this probability (a judge of known error).",
    ),
    flip_seed: int = typer.Option(0, "--flip-seed", help="Seed of the flips (--flip-rate)."),
    benchmarks: Path | None = typer.Option(
        None, "--benchmarks",
        help="--oracle: first write its held-out split as DeCapBench, CaptionQA and CapArena files (and "
        "references.json) in this folder (docs/offline.md).",
    ),
) -> None:  # fmt: skip
    """Serve a local judge behind an OpenAI-compatible /v1/chat/completions (for tests and the demo).

    With --oracle it answers every command's calls from the synthetic world's scene graphs: the
    verdicts (train, score, the b-CapScore of evaluate), DCScore, CaptionQA, CapArena and
    re-captioning, so each command can be tried offline (docs/offline.md).
    """
    import json
    import os

    from balcaprl.files import read_utf8_text
    from balcaprl.testing.judge_server import FaultScript, serve_forever

    if oracle is not None:
        try:
            from balcaprl.synthetic.oracle import OracleJudge
        except ImportError as error:
            raise UserError(
                f"--oracle needs balcaprl.synthetic.oracle, which is not available ({error})"
            ) from error
        try:
            local_judge = OracleJudge.from_dataset(oracle)
        except UserError as error:  # says which file is missing and how to make one
            raise InputError(f"--oracle: {error}") from None
        except (OSError, ValueError, KeyError) as error:  # not a synthetic dataset, or a broken one
            detail = str(error) if not isinstance(error, KeyError) else f"missing field {error}"
            raise InputError(
                f"--oracle {oracle}: {detail}; give a folder written by `balcaprl synthetic build`"
            ) from None
        unflipped = local_judge
        if flip_rate > 0:
            from balcaprl.testing.flipping_judge import FlippingJudge

            local_judge = FlippingJudge(local_judge, flip_rate, seed=flip_seed)
    elif flip_rate > 0:
        raise UserError("--flip-rate needs --oracle (it flips the oracle judge's flags)")
    else:
        from balcaprl.testing.scripted_judge import ScriptedJudge

        local_judge = ScriptedJudge(latency_s=latency)
    handler = None
    if oracle is not None:
        from balcaprl.testing.oracle_protocols import OracleProtocols, write_synthetic_benchmarks

        handler = OracleProtocols.from_dataset(unflipped, oracle)
        if benchmarks is not None:
            for name, path in write_synthetic_benchmarks(oracle, benchmarks).items():
                typer.echo(f"wrote {path} ({name})")
    elif benchmarks is not None:
        raise UserError("--benchmarks needs --oracle (the files are its dataset's held-out split)")
    script = None
    if faults is not None:
        inline = faults.lstrip().startswith("{")
        where = "--faults" if inline else f"--faults {faults}"
        try:
            text = faults if inline else read_utf8_text(faults)
            script = FaultScript.from_json(json.loads(text))
        except json.JSONDecodeError as error:
            raise InputError(f"{where}: not JSON ({error.msg} at line {error.lineno})") from None
        except UserError as error:
            raise InputError(f"{where}: {error}") from None
    if host not in LOOPBACK and api_key_env is None:
        typer.secho(
            f"warning: serving on {host} without --api-key-env: anyone who can reach it can use it",
            fg=typer.colors.YELLOW,
            err=True,
        )
    key = None
    if api_key_env is not None:
        key = os.environ.get(api_key_env)
        if not key:
            raise UserError(f"--api-key-env {api_key_env}: the variable is not set")
    ready = False

    def announce(url: str) -> None:
        nonlocal ready
        ready = True
        typer.echo(f"balcaprl judge server: {url}", nl=True)

    try:
        serve_forever(
            local_judge, host=host, port=port, faults=script, api_key=key, on_ready=announce, handler=handler
        )
    except OSError as error:
        if ready:
            raise
        raise UserError(
            f"--host {host} --port {port}: cannot listen there ({error.strerror or error}); choose another "
            "--port, or --port 0 for a free one"
        ) from None
    except KeyboardInterrupt:  # Ctrl-C is how a server is stopped: nothing to resume, nothing kept
        typer.echo("balcaprl judge server: stopped", err=True)


def audit(
    data: Path = typer.Option(..., "--data", help="The dataset folder the captions' images and references come from."),
    captions: Path = typer.Option(
        ..., "--captions", help='Caption file: JSONL {"image", "caption"} (image: row id or path) or {image: caption}.'
    ),
    judge: list[Path] = typer.Option(
        ..., "--judge", help="Judge config YAML; give it twice to compare two judges (one judge: test-retest)."
    ),
    sample: int = typer.Option(1000, "--sample", min=1, help="Re-judge this many captions (a seeded sample)."),
    out: Path = typer.Option(..., "--out", help="Folder for audit.json and items.jsonl."),
    seed: int = typer.Option(0, "--seed", help="Seed of the sample."),
    rubric: str = typer.Option("training", "--rubric", help="training or evaluation (b-CapScore's)."),
    reference: str = typer.Option(
        "auto", "--reference", help="auto: the synthetic oracle when DATA is a synthetic dataset; none: no reference."
    ),
    retest: bool | None = typer.Option(
        None, "--retest/--no-retest", help="Judge each judge twice (default: only when there is one judge)."
    ),
    overwrite: bool = typer.Option(
        False, "--overwrite",
        help="Replace the audit already in --out (kept until the new one is written; the judges are paid again).",
    ),
) -> None:  # fmt: skip
    """Re-judge a sample of captions: agreement between judges, test-retest noise, errors, cost."""
    from balcaprl.judge import build_judge, load_judge_config
    from balcaprl.judge.audit import (
        audit_results,
        audit_tables,
        judge_names,
        read_audit_items,
        run_audit,
        write_audit,
    )
    from balcaprl.outputs import claim_output_dir
    from balcaprl.progress import Progress, make_console

    if not 1 <= len(judge) <= 2:
        raise UserError(f"--judge: give one or two judge configs, got {len(judge)}")
    if rubric not in ("training", "evaluation"):
        raise UserError(f"--rubric {rubric}: choose training or evaluation")
    if reference not in ("auto", "none"):
        raise UserError(f"--reference {reference}: choose auto or none")
    items = read_audit_items(data, captions, sample=sample, seed=seed)
    configs = [load_judge_config(path) for path in judge]  # a bad config fails here, before any call
    for config in configs:
        config.resolve_api_key()
    oracle = None
    if reference == "auto" and (data / "scenes.jsonl").is_file():
        from balcaprl.synthetic.oracle import OracleJudge

        scenes = OracleJudge.from_dataset(data)
        oracle = ("oracle", lambda: scenes)
    # the config files' stems, kept apart from each other and from the reference (oracle.yaml: "oracle.yaml")
    names = judge_names(judge, taken=[oracle[0]] if oracle else [])
    judges = [
        (name, lambda config=config: build_judge(config, image_root=data.resolve(), no_cache=True))
        for name, config in zip(names, configs, strict=True)
    ]
    # Before the first paid call: an earlier audit in --out is refused (or, with --overwrite, kept until
    # the new one is written in a sibling folder and swapped in).
    target = claim_output_dir(
        out, what="--out", results=audit_results, overwrite=overwrite, offers_resume=False
    )
    bars: dict[tuple[str, int], Progress] = {}

    def progress(name: str, repeat: int, total: int) -> None:
        bar = bars.get((name, repeat))
        if bar is None:
            for old in bars.values():
                old.close()
            bar = bars[(name, repeat)] = Progress(
                f"judging with {name} (run {repeat})", total=total, unit="captions"
            )
            bar.start()
        bar.advance()

    try:
        report = run_audit(
            items, judges, reference=oracle, retest=retest, rubric=rubric, on_progress=progress
        )  # type: ignore[arg-type]
    finally:
        for bar in bars.values():
            bar.close()
    report["settings"] = {"data": str(data), "captions": str(captions), "judges": [str(p) for p in judge],
                          "sample": sample, "seed": seed, "cache": "off"}  # fmt: skip
    with target.committing():
        written = write_audit(report, target.work)
    audit_path, items_path = (target.final / path.name for path in written)
    for run in report["runs"]:
        if run["judged"] == 0:
            reasons = ", ".join(f"{k} {v}" for k, v in run["failures"].items())
            typer.secho(f"warning: {run['judge']} failed on every caption ({reasons})", fg="yellow", err=True)
    console = make_console()
    for table in audit_tables(report):
        console.print(table)
    typer.echo(f"wrote {audit_path}\nwrote {items_path}")
