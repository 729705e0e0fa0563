"""TRL's server mode against a real vLLM server on 127.0.0.1, started with the command line balcaprl
prints for it (``rollout_engine.server_command``, run through ``trl vllm-serve``): two training steps
whose rollouts come from the server over HTTP (image features, then one request per prompt), with the
special-token mask sent along, the image-token counts compared, and each prompt's rollouts judged as
its response arrives; then two processes (``accelerate launch``) on the same server, every process's
rollouts judged on the main process as their responses arrive.

CPU only, in the test set-up: TRL pushes weights to a server over NCCL, which needs CUDA
(``VLLMClient.init_communicator`` refuses a CPU device), so the weight push is skipped here; the
colocated slice checks weight sync.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("vllm")

import requests  # noqa: E402
from engine_kit import StampedJudge  # noqa: E402
from train_testkit import run_on_two_processes, tiny_recipe_dict  # noqa: E402

from balcaprl.recipe import recipe_from_dict  # noqa: E402
from balcaprl.train.metrics import read_jsonl  # noqa: E402
from balcaprl.train.rollout_engine import server_command  # noqa: E402

TWO_PROCESSES = Path(__file__).with_name("served_two_processes_worker.py")
START_S = 420  # importing vLLM and starting its server takes a minute or two on 2 loaded cores


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def server(tiny_qwen2_5_vl, tmp_path_factory):
    """``trl vllm-serve`` for the tiny Qwen2.5-VL on 127.0.0.1, the trainer's settings, test-sized."""
    from balcaprl.recipe import ModelConfig
    from balcaprl.train.modeling import image_grid, load_processor

    grid = image_grid(load_processor(ModelConfig(path=str(tiny_qwen2_5_vl))))
    line = shlex.split(server_command(str(tiny_qwen2_5_vl), "fp32", grid.processor_kwargs()))
    port = _free_port()
    trl = Path(sys.executable).with_name("trl")
    command = [str(trl), *line[1:], "--host", "127.0.0.1", "--port", str(port), "--enforce_eager", "true",
               "--max_model_len", "512"]  # fmt: skip
    log = tmp_path_factory.mktemp("server") / "server.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ))
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_S
        while True:
            if process.poll() is not None:
                pytest.fail(f"the vLLM server exited ({process.returncode}):\n{log.read_text()[-3000:]}")
            try:
                if requests.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"the vLLM server did not answer within {START_S} s:\n{log.read_text()[-3000:]}")
            time.sleep(1)
        yield {"url": url, "port": port, "command": command}
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def served_run(server, tiny_qwen2_5_vl, tiny_dataset, tmp_path_factory):
    from trl.generation.vllm_client import VLLMClient

    from balcaprl.train import build_trainer

    out = tmp_path_factory.mktemp("served")
    judge = StampedJudge()
    recipe = recipe_from_dict(
        tiny_recipe_dict(
            tiny_qwen2_5_vl,
            tiny_dataset,
            out,
            rollout={
                "vllm": {"mode": "server", "server_base_url": server["url"]},
                "max_caption_tokens": 24,
                "temperature": 1.5,
            },
            train={"max_steps": 2, "use_cpu": False, "judge_overlap": "per_rollout"},
        )  # fmt: skip
    )
    posts: list[dict] = []
    with pytest.MonkeyPatch.context() as monkeypatch:
        # CPU: no NCCL weight push (see the module docstring); generation goes through the server as on GPUs
        monkeypatch.setattr(VLLMClient, "init_communicator", lambda self, device=0: None)
        monkeypatch.setattr(VLLMClient, "update_named_params", lambda self, metadata, params: None)
        post = VLLMClient._post

        def recording(self, url, **kwargs):
            posts.append({"url": url, "json": kwargs.get("json")})
            return post(self, url, **kwargs)

        monkeypatch.setattr(VLLMClient, "_post", recording)
        trainer = build_trainer(recipe, judge)
        trainer.train()
    return {"trainer": trainer, "judge": judge, "out": out, "posts": posts}


def test_two_steps_train_on_the_servers_rollouts_with_the_mask_sent(served_run):
    trainer, posts = served_run["trainer"], served_run["posts"]
    assert trainer.state.global_step == 2
    generate = [p["json"] for p in posts if p["url"].endswith("/inference/v1/generate")]
    assert len(generate) == 2 * 2  # one request per prompt, 2 prompts a step
    banned = set(trainer.banned_tokens.values())
    assert all(set(body["sampling_params"]["bad_words"]) == banned for body in generate)
    rows = [row for row in read_jsonl(served_run["out"] / "rollouts.jsonl")]
    assert len(rows) == 16 and all("<|" not in row["caption"] for row in rows)


def test_each_prompts_rollouts_are_judged_as_its_response_arrives(served_run):
    shares = [row["judge/started_early_share"] for row in read_jsonl(served_run["out"] / "metrics.jsonl")
              if "judge/started_early_share" in row]  # fmt: skip
    assert len(shares) == 2 and all(share == 1.0 for share in shares)  # one process: every rollout


@pytest.fixture(scope="module")
def two_processes(server, tiny_qwen2_5_vl, tiny_dataset, tmp_path_factory):
    out = tmp_path_factory.mktemp("served-two-processes")
    run_on_two_processes(
        TWO_PROCESSES, tiny_qwen2_5_vl, tiny_dataset, server["url"], out, timeout=420, accelerate=True
    )
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)]


def test_on_two_processes_every_rollout_is_judged_as_its_response_arrives(two_processes):
    main, other = two_processes
    for process in (main, other):
        assert process["global_step"] == 2
        shares = [metrics["judge/started_early_share"] for metrics in process["metrics"]]
        assert shares == [1.0, 1.0]  # every rollout of each process, on both steps
    assert main["judged_here"] == 2 * 4 and other["judged_here"] == 0  # the main process judged them all
