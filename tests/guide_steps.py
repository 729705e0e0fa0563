"""A guide's shell block, run as written: the shared reader and runner of the guide tests.

A block's lines are: ``cat > FILE <<'EOF'`` ... ``EOF`` (a here-document: FILE is written), a
``balcaprl judge serve ... &`` line (the server starts in a process of its own, on a free port that
then replaces the guide's port in every later line and file), and ``balcaprl ...`` lines, each run in
this process and required to exit 0. ``substitutions`` replace text in a line before it runs (a hub id
by a local folder); everything else runs as the guide prints it.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from contextlib import ExitStack, contextmanager
from pathlib import Path

from typer.testing import CliRunner

from balcaprl.cli import app

REPO = Path(__file__).resolve().parents[1]


def block_after(text: str, marker: str) -> str:
    """The first ```bash block after ``marker`` in ``text``."""
    return text.split(marker, 1)[1].split("```bash\n", 1)[1].split("\n```", 1)[0]


def guide_steps(block: str) -> list[tuple[str, str]]:
    """("file", "PATH\\nTEXT") for a here-document, ("serve", LINE) or ("run", LINE), in order."""
    lines = block.replace("\\\n", " ").split("\n")
    steps, i = [], 0
    while i < len(lines):
        line = lines[i].split("   #", 1)[0].strip()
        if line.startswith("cat > "):
            path = line.split()[2]
            end = lines.index("EOF", i + 1)
            steps.append(("file", path + "\n" + "\n".join(lines[i + 1 : end]) + "\n"))
            i = end + 1
            continue
        if line:
            steps.append(("serve" if line.endswith("&") else "run", line))
        i += 1
    return steps


@contextmanager
def oracle_server(line: str, port: str):
    """``judge serve ... --port PORT &`` started on a free port; yields the port it took."""
    args = shlex.split(line.rstrip("&").replace(f"--port {port}", "--port 0"))
    server = subprocess.Popen(
        [sys.executable, "-m", "balcaprl.cli", *args[1:]], stdout=subprocess.PIPE, text=True
    )
    try:
        announced = ""
        while not announced.startswith("balcaprl judge server: "):
            announced = server.stdout.readline()
            assert announced, "the server stopped before it announced its address"
        yield announced.rsplit(":", 1)[1].split("/")[0]
    finally:
        server.terminate()
        server.wait(timeout=10)
        server.stdout.close()


def run_steps(
    steps: list[tuple[str, str]], *, port: str = "8765", substitutions: dict[str, str] | None = None
):
    """Run ``steps`` (see the module docstring) from the current directory; returns each run's output.
    ``port``: the guide's port, replaced by the started server's in every later step."""
    outputs: list[str] = []
    live = port
    with ExitStack() as servers:
        for kind, step in steps:
            for old, new in (substitutions or {}).items():
                step = step.replace(old, new)
            if kind == "serve":
                live = servers.enter_context(oracle_server(step, port))
                continue
            step = step.replace(port, live)
            if kind == "file":
                path, body = step.split("\n", 1)
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                Path(path).write_text(body, encoding="utf-8")
            else:
                args = shlex.split(step)
                assert args[0] == "balcaprl", step
                result = CliRunner().invoke(app, args[1:])
                assert result.exit_code == 0, (step, result.output, result.exception)
                outputs.append(result.output)
    return outputs
