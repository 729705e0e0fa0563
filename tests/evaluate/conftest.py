"""Fixtures for the evaluation tests: a loopback judge server (scripted verdict judge + a scripted
handler for the protocols' generic calls) on 127.0.0.1, port 0."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # evaluate_testkit, whatever pytest's import mode

from balcaprl.testing.judge_server import FaultScript, JudgeServer  # noqa: E402
from balcaprl.testing.scripted_judge import ScriptedJudge  # noqa: E402


@pytest.fixture
def eval_server() -> Iterator[Callable[..., JudgeServer]]:
    """``eval_server(handler, judge=None, rules=None)`` starts a server; all stop at teardown."""
    started: list[JudgeServer] = []

    def start(handler=None, judge=None, rules=None, **kwargs) -> JudgeServer:
        server = JudgeServer(
            judge or ScriptedJudge(), FaultScript(rules=rules or {}), handler=handler, **kwargs
        )
        started.append(server.start())
        return server

    yield start
    for server in started:
        server.stop()
