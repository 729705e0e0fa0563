"""The async ``compute_score``: one judge call per rollout, the length mask in the policy's tokens, and a
failed judge reaching verl as NaN (never 0) through verl's own reward manager."""

from __future__ import annotations

import asyncio
import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("verl")

from omegaconf import OmegaConf  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.experimental.reward_loop.reward_manager import get_reward_manager_cls  # noqa: E402
from verl.trainer.ppo.reward import get_custom_reward_fn  # noqa: E402
from verl_testkit import JUDGES, train_testkit  # noqa: E402

from balcaprl import linear_length_penalty  # noqa: E402
from balcaprl.errors import ConfigError  # noqa: E402
from balcaprl.rewards import LengthControlConfig, RewardConfig, RolloutRecord, score_verdict  # noqa: E402
from balcaprl.train.verl_backend import reward as reward_module  # noqa: E402
from balcaprl.train.verl_backend.reward import RewardSettings, compute_score  # noqa: E402

REFERENCE = "a red circle on the left ."
# What compute_score returns for every rollout: verl's score, the record's row form, the judging's times.
RESULT_KEYS = (
    "score",
    *(f.name for f in dataclasses.fields(RolloutRecord)),
    "judge_started_s",
    "judge_finished_s",
)


def kwargs(policy: Path, dataset: Path, length: dict | None = None, **overrides):
    """reward_kwargs as rendered: the reward config as one JSON string, the worker's set-up beside it."""
    values = {
        "rewards": RewardConfig(length=LengthControlConfig(**(length or {}))).to_json(),
        "tokenizer": str(policy),
        "judge_factory": "verl_testkit:scripted_judge",
        "image_root": str(dataset),
    }
    values.update(overrides)
    return values


def extra_info(**more):
    return {
        "id": "scene-000",
        "image": "images/scene-000.png",
        "reference_tokens": None,
        "tokenizer": None,
        **more,
    }


def score(caption, policy, dataset, info=None, **overrides):
    return asyncio.run(
        compute_score(
            "balcaprl/tiny", caption, REFERENCE, info or extra_info(), **kwargs(policy, dataset, **overrides)
        )
    )


@pytest.fixture(autouse=True)
def fresh_scorers():
    reward_module._JUDGES.clear()
    JUDGES.clear()
    yield
    reward_module._JUDGES.clear()


def test_a_judged_rollout_returns_every_key_with_the_judges_rewards(tiny_qwen, tiny_dataset):
    caption = "a red circle on the left ."
    result = score(caption, tiny_qwen, tiny_dataset)
    assert tuple(result) == RESULT_KEYS
    expected = score_verdict(train_testkit().ScriptedJudge(fail_every=None).verdict(caption, REFERENCE))
    assert result["precision"] == pytest.approx(expected.precision)
    assert result["recall"] == pytest.approx(expected.recall)
    assert result["linguistic"] == pytest.approx(expected.linguistic)  # rho = 7/7, in the band
    assert result["score"] == pytest.approx(
        0.1 * expected.precision + 0.3 * expected.recall + 0.3 * expected.linguistic
    )
    assert result["failure"] is None and result["failure_detail"] == "" and result["id"] == "scene-000"
    assert result["caption"] == caption and RolloutRecord.from_row(result).judged
    assert result["caption_tokens"] == 7 and result["reference_tokens"] == 7  # word-level policy tokenizer
    assert result["length_penalty"] == 0.0
    judge = JUDGES["scripted"]
    assert judge.calls == 1
    assert Path(judge.requests[0].image) == tiny_dataset / "images" / "scene-000.png"


@pytest.mark.parametrize(
    ("pointability", "rubric"), [(True, "training"), (False, "training_without_pointability")]
)
def test_the_reward_config_picks_the_judges_rubric(tiny_qwen, tiny_dataset, pointability, rubric):
    caption = "this image shows a red circle"  # 'this', 'image', 'shows' are not pointable
    rewards = RewardConfig(pointability=pointability).to_json()
    result = score(caption, tiny_qwen, tiny_dataset, rewards=rewards)
    # the "w/o pointability" run asks the judge for the rubric with the pointability test removed
    assert [r.rubric for r in JUDGES["scripted"].requests] == [rubric]
    verdict = train_testkit().ScriptedJudge(fail_every=None).verdict(caption, REFERENCE)
    assert result["precision"] == pytest.approx(score_verdict(verdict, pointability=pointability).precision)
    if pointability:
        assert result["non_pointable_share"] == pytest.approx(3 / 6)
    else:  # not judged under the ablation's rubric: unknown, never 0
        assert math.isnan(result["non_pointable_share"])


def test_the_length_mask_uses_the_policy_tokenizer_counts(tiny_qwen, tiny_dataset):
    long_caption = "a red circle on the left . " * 3  # 21 tokens against 7: rho = 3 > tau_high
    result = score(long_caption, tiny_qwen, tiny_dataset)
    assert result["caption_tokens"] == 21 and result["length_ratio"] == pytest.approx(3.0)
    assert result["linguistic"] == 0.0 and result["linguistic_raw"] > 0 and result["masked"] is True
    kept = score(long_caption, tiny_qwen, tiny_dataset, length={"tau_high": 3.0})
    assert kept["linguistic"] == kept["linguistic_raw"] > 0 and kept["masked"] is False


def test_a_stored_reference_length_is_used_only_for_the_policys_tokenizer(tiny_qwen, tiny_dataset):
    same = score(
        "a red circle", tiny_qwen, tiny_dataset, extra_info(reference_tokens=4, tokenizer=str(tiny_qwen))
    )
    assert same["reference_tokens"] == 4
    other = score(
        "a red circle", tiny_qwen, tiny_dataset, extra_info(reference_tokens=4, tokenizer="characters")
    )
    assert other["reference_tokens"] == 7  # recounted with the policy's tokenizer


def test_linear_mode_returns_the_penalty_and_keeps_linguistic(tiny_qwen, tiny_dataset):
    caption = "a red circle on the left . " * 3
    result = score(caption, tiny_qwen, tiny_dataset, length={"mode": "linear", "linear_strength": 0.5})
    assert result["length_penalty"] == pytest.approx(float(linear_length_penalty(21, 7, 0.5, 2.0, 0.5)))
    assert result["linguistic"] == result["linguistic_raw"] > 0


@pytest.mark.parametrize(
    "factory, reason",
    [("verl_testkit:failing_judge", "timeout"), ("verl_testkit:raising_judge", "judge_exception")],
)
def test_a_failed_judge_is_nan_never_zero(tiny_qwen, tiny_dataset, factory, reason):
    result = score("a red circle", tiny_qwen, tiny_dataset, judge_factory=factory)
    assert tuple(result) == RESULT_KEYS  # the same keys as a judged rollout (verl requires it)
    for key in ("score", "precision", "recall", "linguistic", "linguistic_raw"):
        assert math.isnan(result[key]), key
    assert result["masked"] is False  # the mask acts on a verdict; there is none
    assert result["failure"] == reason and not RolloutRecord.from_row(result).judged
    assert result["caption_tokens"] == 3  # lengths are still known


@pytest.mark.parametrize("stored", [True, False])
def test_a_reference_that_is_no_valid_unicode_is_nan_and_never_sent(tiny_qwen, tiny_dataset, stored):
    # verl's reward path calls judge_rollouts, as TRL's does: a lone surrogate that a JSON escape put
    # into a row's ground truth fails the rollout as bad_input, naming the text and the row. With the
    # length stored by the export or recounted by the policy's tokenizer, the same one line.
    info = extra_info(reference_tokens=7, tokenizer=str(tiny_qwen)) if stored else extra_info()
    result = asyncio.run(
        compute_score("balcaprl/tiny", "a red circle", "a red \ud800circle on the left .", info,
                      **kwargs(tiny_qwen, tiny_dataset))
    )  # fmt: skip
    assert tuple(result) == RESULT_KEYS
    for key in ("score", "precision", "recall", "linguistic"):
        assert math.isnan(result[key]), key
    assert result["failure"] == "bad_input" and result["failure_detail"] == (
        "the reference of row 'scene-000' is not valid Unicode: a lone surrogate U+D800 at character 7"
    )
    assert "scripted" not in JUDGES or JUDGES["scripted"].calls == 0  # no call was made


def test_settings_are_checked(tiny_qwen, tiny_dataset):
    with pytest.raises(ConfigError, match="tau_hihg: unknown key; allowed here: image_root, judge_config"):
        RewardSettings.from_kwargs({**kwargs(tiny_qwen, tiny_dataset), "tau_hihg": 3})
    with pytest.raises(ConfigError, match="exactly one"):
        RewardSettings.from_kwargs({**kwargs(tiny_qwen, tiny_dataset), "judge_config": "judge.yaml"})
    with pytest.raises(
        ConfigError, match=r"rewards\.length\.mode: Input should be 'mask', 'linear' or 'none'"
    ):
        RewardSettings.from_kwargs(
            kwargs(tiny_qwen, tiny_dataset, rewards='{"length": {"mode": "sometimes"}}')
        )
    # verl's own additions are accepted; the JSON is validated by the reward config's own model
    settings = RewardSettings.from_kwargs(
        {**kwargs(tiny_qwen, tiny_dataset, length={"tau_low": 0.25}), "reward_router_address": None}
    )
    assert settings.rewards == RewardConfig(length=LengthControlConfig(tau_low=0.25))


def test_a_judge_config_shares_its_limits_between_reward_workers(tmp_path, tiny_qwen, tiny_dataset):
    judge_yaml = tmp_path / "judge.yaml"
    judge_yaml.write_text(
        "base_url: http://127.0.0.1:9/v1\nmodel: m\napi_key_env: null\nconcurrency: 256\n"
        "requests_per_minute: 1000\ncache_path: null\n"
    )
    settings = RewardSettings.from_kwargs(
        {**kwargs(tiny_qwen, tiny_dataset, judge_factory=None), "judge_config": str(judge_yaml), "workers": 8}
    )
    judge = reward_module.judge_for(settings)  # build_judge(processes=workers) shares the limits
    assert judge.config.concurrency == 32 and judge.config.requests_per_minute == 125


# ---------------------------------------------------------------- through verl's own reward loop


def reward_config(policy, dataset, judge_factory="verl_testkit:scripted_judge"):
    return OmegaConf.create(
        {
            "trainer": {"experiment_name": "test"},
            "reward": {
                "custom_reward_function": {
                    "path": "pkg://balcaprl.train.verl_backend.reward",
                    "name": "compute_score",
                    "reward_kwargs": kwargs(policy, dataset, judge_factory=judge_factory),
                }
            },
        }
    )


def one_rollout(tokenizer, caption: str) -> DataProto:
    """A rollout as verl's reward loop sees it: prompt ids, response ids (EOS and padding), masks."""
    prompt = torch.tensor([tokenizer.convert_tokens_to_ids("<|im_start|>")] * 4)
    ids = tokenizer(caption, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    response = torch.tensor(ids + [tokenizer.pad_token_id] * 3)
    attention = torch.cat([torch.ones(4), torch.ones(len(ids)), torch.zeros(3)]).long()
    return DataProto.from_dict(
        tensors={"prompts": prompt[None], "responses": response[None], "attention_mask": attention[None]},
        non_tensors={
            "data_source": np.array(["balcaprl/tiny"], dtype=object),
            "reward_model": np.array([{"ground_truth": REFERENCE}], dtype=object),
            "extra_info": np.array([extra_info()], dtype=object),
        },
    )


@pytest.mark.parametrize(
    "factory", ["verl_testkit:scripted_judge", "verl_testkit:failing_judge", "verl_testkit:raising_judge"]
)
def test_verls_naive_reward_manager_passes_nan_through(tiny_qwen, tiny_dataset, factory):
    """verl loads compute_score from the config (get_custom_reward_fn, async detected) and its naive
    manager returns our dict unchanged: NaN for a failed judge reaches rm_scores and the reward columns."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen)
    config = reward_config(tiny_qwen, tiny_dataset, factory)
    manager_cls = get_reward_manager_cls("naive")
    fn = get_custom_reward_fn(config)

    async def run():
        manager = manager_cls(config=config, tokenizer=tokenizer, compute_score=fn)
        assert manager.is_async_reward_score
        return await manager.run_single(one_rollout(tokenizer, "a red circle on the left ."))

    out = asyncio.run(run())
    info = out["reward_extra_info"]
    assert set(info) == set(RESULT_KEYS)
    if factory.endswith("scripted_judge"):
        assert info["failure"] is None and out["reward_score"] == pytest.approx(info["score"])
        assert info["caption_tokens"] == 7  # decoded without EOS/padding, counted with the policy tokenizer
    else:
        assert math.isnan(out["reward_score"]) and math.isnan(info["precision"]) and info["failure"]
    # verl writes the score on the last response token: NaN stays NaN there.
    rm = manager_cls.assemble_rm_scores(
        one_rollout(tokenizer, "a red circle on the left ."), [out["reward_score"]]
    )
    assert math.isnan(rm.sum().item()) == (not factory.endswith("scripted_judge"))


def test_verls_rate_limited_manager_would_turn_a_crash_into_zero(tiny_qwen, tiny_dataset):
    """The behaviour balcaprl avoids (and why compute_score never raises for a judge failure): verl's
    rate_limited manager reports reward 0.0 when the reward function raises."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen)

    async def crashing(**_):
        raise RuntimeError("judge down")

    config = OmegaConf.create({"trainer": {"experiment_name": "t"}, "reward": {"timeout": 5}})
    manager_cls = get_reward_manager_cls("rate_limited")

    async def run():
        manager = manager_cls(config=config, tokenizer=tokenizer, compute_score=crashing)
        return await manager.run_single(one_rollout(tokenizer, "a red circle"))

    out = asyncio.run(run())
    assert out["reward_score"] == 0.0 and "error" in out["reward_extra_info"]


def test_compute_score_never_raises_for_a_bad_set_up(tiny_qwen, tiny_dataset, tmp_path, monkeypatch):
    """verl would swallow an exception into a silently padded group; a bad set-up is a NaN with a reason."""
    typo = asyncio.run(
        compute_score(
            "s", "a red circle", REFERENCE, extra_info(), **kwargs(tiny_qwen, tiny_dataset), tau_hihg=3
        )
    )
    assert (
        typo["failure"] == "bad_input" and "tau_hihg" in typo["failure_detail"] and math.isnan(typo["score"])
    )
    assert tuple(typo) == RESULT_KEYS and typo["caption_tokens"] is None  # not counted
    no_image = asyncio.run(
        compute_score(
            "s", "a red circle", REFERENCE, {"id": "x"}, **kwargs(tiny_qwen, tiny_dataset, image_root=None)
        )
    )
    assert no_image["failure"] == "bad_input" and "export" in no_image["failure_detail"]
    judge_yaml = tmp_path / "judge.yaml"
    judge_yaml.write_text("model: m\napi_key_env: BALCAPRL_TEST_KEY_THAT_IS_NOT_SET\ncache_path: null\n")
    monkeypatch.delenv("BALCAPRL_TEST_KEY_THAT_IS_NOT_SET", raising=False)
    no_key = score("a red circle", tiny_qwen, tiny_dataset, judge_factory=None, judge_config=str(judge_yaml))
    assert (
        no_key["failure"] == "judge_exception"
        and "BALCAPRL_TEST_KEY_THAT_IS_NOT_SET" in no_key["failure_detail"]
    )
    assert math.isnan(no_key["precision"]) and no_key["caption_tokens"] == 3


def test_balcaprls_reward_manager_hands_compute_score_the_generated_ids(tiny_qwen, tiny_dataset):
    """The rendered manager (reward_manager.BalcaprlRewardManager, loaded as verl loads it from the
    config) passes the rollout's unpadded response ids, EOS included, in extra_info; compute_score
    counts the caption from them, as TRL's reward functions do."""
    from transformers import AutoTokenizer
    from verl.trainer.ppo.reward import resolve_reward_manager_cls

    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen)
    config = reward_config(tiny_qwen, tiny_dataset)
    config.reward.reward_manager = {
        "source": "importlib",
        "name": "BalcaprlRewardManager",
        "module": {"path": "pkg://balcaprl.train.verl_backend.reward_manager"},
    }
    manager_cls = resolve_reward_manager_cls(config)
    fn = get_custom_reward_fn(config)
    seen = []

    async def spying(**kwargs):
        seen.append(list(kwargs["extra_info"].get("response_ids", [])))
        return await fn(**kwargs)

    rollout = one_rollout(tokenizer, "a red circle on the left .")
    expected = rollout.batch["responses"][0][: int(rollout.batch["attention_mask"][0][4:].sum())].tolist()

    async def run():
        return await manager_cls(config=config, tokenizer=tokenizer, compute_score=spying).run_single(rollout)

    out = asyncio.run(run())
    assert seen == [expected] and expected[-1] == tokenizer.eos_token_id
    assert out["reward_extra_info"]["caption_tokens"] == len(expected) - 1  # EOS is special
