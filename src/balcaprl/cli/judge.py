"""``balcaprl judge serve``: a local judge behind the OpenAI-compatible API (for tests and the demo)."""

from __future__ import annotations

from pathlib import Path

import typer

from balcaprl.errors import InputError, UserError

__all__ = ["serve"]

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
) -> None:
    """Serve a local judge behind an OpenAI-compatible /v1/chat/completions (for tests and the demo)."""
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
    else:
        from balcaprl.testing.scripted_judge import ScriptedJudge

        local_judge = ScriptedJudge(latency_s=latency)
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
        serve_forever(local_judge, host=host, port=port, faults=script, api_key=key, on_ready=announce)
    except OSError as error:
        if ready:
            raise
        raise UserError(
            f"--host {host} --port {port}: cannot listen there ({error.strerror or error}); choose another "
            "--port, or --port 0 for a free one"
        ) from None
