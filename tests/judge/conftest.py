"""Fixtures for the judge tests: a loopback judge server (real uvicorn on 127.0.0.1, port 0)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # judge_testkit, whatever pytest's import mode

from balcaprl.testing.judge_server import FaultScript, JudgeServer  # noqa: E402
from balcaprl.testing.scripted_judge import ScriptedJudge  # noqa: E402


@pytest.fixture
def judge_server() -> Iterator[Callable[..., JudgeServer]]:
    """``judge_server(rules={...}, judge=..., api_key=...)`` starts a server; all stop at teardown."""
    started: list[JudgeServer] = []

    def start(rules: dict[str, list[str]] | None = None, judge=None, **kwargs) -> JudgeServer:
        # copies: the script uses its fault lists up, and a parametrized test passes the same ones again
        rules = {needle: list(faults) for needle, faults in (rules or {}).items()}
        faults = FaultScript(rules=rules, **{k: kwargs.pop(k) for k in ("always", "slow_s") if k in kwargs})
        server = JudgeServer(judge or ScriptedJudge(), faults, **kwargs).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
