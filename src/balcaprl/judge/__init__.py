"""Judges: the interface, and (soon) the OpenAI-compatible client, its cache and a loopback server."""

from balcaprl.judge.protocol import FailureReason, Judge, JudgeFailure, JudgeOutcome, JudgeRequest, Judgement

__all__ = ["FailureReason", "Judge", "JudgeFailure", "JudgeOutcome", "JudgeRequest", "Judgement"]
