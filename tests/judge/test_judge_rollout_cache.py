"""The verdict cache in training: off for RL rollouts unless the config asks, kept for evaluation."""

from __future__ import annotations

from balcaprl.judge import build_judge


def _config(tmp_path, **extra):
    return {
        "base_url": "http://127.0.0.1:9/v1",
        "api_key_env": None,
        "cache_path": str(tmp_path / "c.sqlite"),
        **extra,
    }


def test_rollouts_have_no_cache_by_default(tmp_path):
    judge = build_judge(_config(tmp_path), rollouts=True)
    assert judge.cache is None
    assert not (tmp_path / "c.sqlite").exists()


def test_cache_rollouts_turns_it_on(tmp_path):
    judge = build_judge(_config(tmp_path, cache_rollouts=True), rollouts=True)
    assert judge.cache is not None
    judge.cache.close()


def test_evaluation_keeps_the_cache(tmp_path):
    judge = build_judge(_config(tmp_path))
    assert judge.cache is not None and (tmp_path / "c.sqlite").exists()
    judge.cache.close()
