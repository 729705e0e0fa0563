"""A judge endpoint that rejects the key stops training at once (issue 23): one line, exit status 2, the
checkpoints written so far kept, no final model. Real HTTP: the tiny policy's rollouts are judged by
the OpenAI-compatible client against a loopback judge server."""

from __future__ import annotations

import gc

import pytest
import yaml
from train_testkit import tiny_recipe_dict
from transformers import TrainerCallback
from typer.testing import CliRunner

import balcaprl.train.trl_backend as trl_backend
from balcaprl.cli import app
from balcaprl.testing.judge_server import JudgeServer
from balcaprl.testing.revocation import RevokedKey
from balcaprl.testing.scripted_judge import ScriptedJudge


class RevokeAfterStep(TrainerCallback):
    """Revokes the judge's key once ``step`` optimizer steps are done."""

    def __init__(self, script: RevokedKey, step: int):
        self.script, self.step = script, step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= self.step:
            self.script.revoke()


def quiet_after(caplog) -> list[str]:
    """What asyncio logged once the run's objects are gone: a judge call's exception left unread in a
    future prints its traceback then, after the one line."""
    gc.collect()
    return [r.getMessage() for r in caplog.records if r.name == "asyncio" or r.exc_info]


def run_train(tmp_path, tiny_policy, tiny_dataset, server: JudgeServer, **judge_settings):
    recipe = tmp_path / "recipe.yaml"
    out = tmp_path / "run"
    recipe.write_text(
        yaml.safe_dump(tiny_recipe_dict(tiny_policy, tiny_dataset, out, train={"max_steps": 3}))
    )
    judge = tmp_path / "judge.yaml"
    settings = {"base_url": server.base_url, "model": "judge", "api_key_env": None, "cache_path": None,
                "max_retries": 0, **judge_settings}  # fmt: skip
    judge.write_text(yaml.safe_dump(settings))
    result = CliRunner(env={"COLUMNS": "60"}).invoke(app, ["train", str(recipe), "--judge", str(judge)])
    return result, out


def test_a_key_revoked_mid_run_stops_training_with_one_line(
    tiny_policy, tiny_dataset, tmp_path, monkeypatch, caplog
):
    script = RevokedKey()
    build = trl_backend.build_trainer
    monkeypatch.setattr(
        trl_backend,
        "build_trainer",
        lambda recipe, judge, callbacks=(), **kw: build(
            recipe, judge, callbacks=[*callbacks, RevokeAfterStep(script, 1)], **kw
        ),
    )
    with JudgeServer(ScriptedJudge(), script) as server:
        result, out = run_train(tmp_path, tiny_policy, tiny_dataset, server)
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "HTTP 401" in errors[0] and "training stopped" in errors[0]
    assert "Traceback" not in result.output and "done:" not in result.output
    assert quiet_after(caplog) == []
    assert (out / "checkpoint-1").is_dir()  # the step done before the key was revoked is kept
    assert not (out / "checkpoint-2").exists() and not (out / "final").exists()


def test_a_wrong_key_from_the_start_is_one_line_and_exit_2(
    tiny_policy, tiny_dataset, tmp_path, monkeypatch, caplog
):
    monkeypatch.setenv("TRUST_JUDGE_KEY", "wrong")
    with JudgeServer(ScriptedJudge(), api_key="right") as server:
        result, out = run_train(tmp_path, tiny_policy, tiny_dataset, server, api_key_env="TRUST_JUDGE_KEY")
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "HTTP 401" in errors[0] and "wrong" not in errors[0]
    assert "Traceback" not in result.output and quiet_after(caplog) == []
    assert not list(out.glob("checkpoint-*")) and not (out / "final").exists()


def test_the_batch_step_of_either_backend_stops_on_the_first_rejected_batch():
    """verl's advantage step runs the same BatchStep: a rejected key stops it on its first such batch,
    not after max_failed_batches_in_a_row (a judge outage)."""
    from balcaprl.errors import UserError
    from balcaprl.rewards import RewardConfig, failed_rollout
    from balcaprl.train.advantages import AdvantageStep
    from balcaprl.train.judging import JUDGE_REJECTED
    from balcaprl.train.step import BatchStep

    refused = "the judge endpoint http://127.0.0.1:9/v1 rejected the request with HTTP 401"
    records = [failed_rollout(JUDGE_REJECTED, refused, RewardConfig(), 5, 10, id=i) for i in "aabb"]
    step = BatchStep(AdvantageStep(weights=(0.1, 0.3, 0.3)), max_failed_batches_in_a_row=3)
    with pytest.raises(UserError, match=r"HTTP 401; training stopped before this batch's update"):
        step(records, [r.id for r in records])
    assert step.failed_in_a_row == 0
