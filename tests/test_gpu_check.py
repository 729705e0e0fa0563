"""The GPU check's tiny CPU mode, as a real process without TRL, accelerate, peft or pydantic: every
section runs and its JSON holds the figures the GPU run reports (the equalities checked here are exact on
CPU in float32)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


# What a bare GPU machine may lack: the check must not import any of it (torch and transformers only).
ABSENT = ("pydantic", "trl", "accelerate", "peft", "datasets", "openai", "typer", "vllm", "fastapi", "orjson")
RUN_WITHOUT = (
    "import runpy, sys\n"
    "for name in {absent!r}: sys.modules[name] = None  # importing it raises ImportError\n"
    "sys.argv = ['gpu_check.py', '--tiny', '--out', {out!r}]\n"
    "runpy.run_path({script!r}, run_name='__main__')\n"
)


def test_the_gpu_check_runs_tiny_on_cpu_and_writes_one_json(tmp_path):
    out = tmp_path / "check.json"
    code = RUN_WITHOUT.format(absent=ABSENT, out=str(out), script=str(ROOT / "benchmarks" / "gpu_check.py"))
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=tmp_path
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert {"driver", "vision", "layer_bytes", "packing", "update"} <= report.keys()
    assert not any(
        "error" in report[name] for name in ("driver", "vision", "layer_bytes", "packing", "update")
    )
    assert report["driver"]["refused"] is False and report["driver"]["seen"]
    assert report["vision"]["equal"] and report["vision"]["route"] == "loop"
    layer = report["layer_bytes"]
    assert layer["within_5_percent"]
    for case in ("no_mask", "padding_mask", "packed"):
        assert layer[case]["measured"] == layer[case]["plan"]  # the plan's arithmetic, byte for byte
    packing = report["packing"]
    assert 0 < packing["real_token_share"] < 1 and packing["real_tokens"] < packing["padded_tokens"]
    assert packing["max_abs_diff"] < 1e-4  # packed rows give the padded rows' outputs
    update = report["update"]
    assert update["model_tflop"] > 0 and update["layers_kept"] == 1 and update["mfu"] is None
