"""docs/offline.md, run as written: every command against `judge serve --oracle`, offline.

The guide's shell block is read from the file: `cat > FILE <<'EOF'` writes FILE, the `judge serve ...
&` line starts the server in a process of its own (on a free port, which then replaces the guide's
8765), and each other `balcaprl ...` line runs in this process from a scratch folder and must exit 0.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from balcaprl.cli import app

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "offline.md"
GUIDE_PORT = "8765"


def guide_steps() -> list[tuple[str, str]]:
    """("file", "PATH\\nTEXT") for a here-document, ("serve", LINE) or ("run", LINE), in order."""
    text = GUIDE.read_text(encoding="utf-8")
    block = text.split("```bash\n", 1)[1].split("\n```", 1)[0]
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


def test_the_guide_lists_every_protocol_and_command():
    commands = " ".join(line for kind, line in guide_steps() if kind != "file")
    for command in ("judge serve --oracle", "caption", "score", "evaluate", "report", "inspect", "judge audit",
                    "data recaption", "train"):  # fmt: skip
        assert f"balcaprl {command}" in commands, command


@pytest.mark.filterwarnings("ignore::ResourceWarning")
def test_the_offline_guide_runs_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "120")
    port, server = GUIDE_PORT, None
    try:
        for kind, step in guide_steps():
            if kind == "file":
                path, body = step.split("\n", 1)
                Path(path).write_text(body.replace(GUIDE_PORT, port), encoding="utf-8")
            elif kind == "serve":
                args = shlex.split(step.rstrip("&").replace(f"--port {GUIDE_PORT}", "--port 0"))
                server = subprocess.Popen([sys.executable, "-m", "balcaprl.cli", *args[1:]],
                                          stdout=subprocess.PIPE, text=True)  # fmt: skip
                line = ""
                while not line.startswith("balcaprl judge server: "):
                    line = server.stdout.readline()
                    assert line, "the server stopped before it announced its address"
                port = line.rsplit(":", 1)[1].split("/")[0]
            else:
                args = shlex.split(step.replace(GUIDE_PORT, port))
                assert args[0] == "balcaprl"
                result = CliRunner().invoke(app, args[1:])
                assert result.exit_code == 0, (step, result.output, result.exception)
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=10)
            server.stdout.close()

    offline = tmp_path / "offline"
    score = json.loads((offline / "score" / "summary.json").read_text())
    assert score["n_scored"] == score["n_captions"] == 8  # the caption file's keys matched the references
    for name in ("eval-policy", "eval-references"):
        record = json.loads((offline / name / "eval.json").read_text())
        assert all(
            record["results"][p]["complete"] for p in ("bcapscore", "dcscore", "captionqa", "caparena")
        )
    references = json.loads((offline / "eval-references" / "eval.json").read_text())["headline"]
    assert references["captionqa"] == 100.0 and references["dcscore"] > 90  # what the rules give the truth
    card = json.loads((offline / "data" / "dataset.json").read_text())
    assert card["recaption"]["recaptioned"] == 16 and card["recaption"]["limit"] is None  # trial, then all
    assert (offline / "run" / "final" / "README.md").is_file()
