"""Judge config (the documented keys, unknown keys rejected, key only from the environment) and rubrics."""

from __future__ import annotations

from pathlib import Path

import pytest

from balcaprl.judge import JudgeConfig, JudgeConfigError, load_judge_config
from balcaprl.rewards.rubrics import REFERENCE_MODES, RUBRIC_NAMES, load_rubric
from balcaprl.testing.rubrics import packaged_rubric_name

EXAMPLE_YAML = """
base_url: https://api.openai.com/v1
model: gpt-4o-mini
api_key_env: OPENAI_API_KEY
reference_mode: joint
concurrency: 256
timeout_s: 60
max_retries: 4
temperature: 0.0
max_tokens: 4096
requests_per_minute: null
tokens_per_minute: null
max_image_side: 1024
caption_char_cap: 4000
cache_path: ~/.cache/balcaprl/judge.sqlite
"""


def test_design_example_loads_and_equals_the_defaults(tmp_path):
    path = tmp_path / "judge.yaml"
    path.write_text(EXAMPLE_YAML)
    cfg = load_judge_config(path)
    assert cfg == JudgeConfig()
    assert cfg.cache_path == Path.home() / ".cache/balcaprl/judge.sqlite"
    assert cfg.price_per_million_tokens is None


def test_price_table_and_mapping_input():
    cfg = load_judge_config({"model": "m", "price_per_million_tokens": {"prompt": 0.15, "completion": 0.6}})
    assert cfg.price_per_million_tokens.prompt == 0.15 and cfg.price_per_million_tokens.completion == 0.6


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("modle: gpt-4o\n", r"modle: unknown key; allowed here: api_key_env, base_url, cache_path"),
        ("reference_mode: both\n", "reference_mode"),
        ("concurrency: 0\n", "concurrency"),
        ("http_backend: curl\n", "http_backend"),
        ("price_per_million_tokens: {prompt: 1}\n", r"price_per_million_tokens\.completion: required"),
        ("- a list\n", "expected a mapping"),
        ("base_url: [unclosed\n", "not valid YAML"),
    ],
)
def test_bad_configs_name_the_file_and_the_key(tmp_path, text, message):
    path = tmp_path / "judge.yaml"
    path.write_text(text)
    with pytest.raises(JudgeConfigError, match=message) as info:
        load_judge_config(path)
    assert str(path) in str(info.value)


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(JudgeConfigError, match="judge config not found"):
        load_judge_config(tmp_path / "nope.yaml")
    (tmp_path / "folder.yaml").mkdir()
    with pytest.raises(JudgeConfigError, match="cannot read it"):
        load_judge_config(tmp_path / "folder.yaml")


def test_api_key_comes_only_from_the_named_variable(monkeypatch):
    monkeypatch.setenv("BALCAPRL_TEST_KEY", "sk-test-123")
    assert JudgeConfig(api_key_env="BALCAPRL_TEST_KEY").resolve_api_key() == "sk-test-123"
    assert "sk-test-123" not in repr(JudgeConfig(api_key_env="BALCAPRL_TEST_KEY"))
    monkeypatch.delenv("BALCAPRL_TEST_KEY")
    with pytest.raises(JudgeConfigError, match="BALCAPRL_TEST_KEY is not set"):
        JudgeConfig(api_key_env="BALCAPRL_TEST_KEY").resolve_api_key()
    assert JudgeConfig(api_key_env=None).resolve_api_key() == "EMPTY"
    with pytest.raises(ValueError):
        JudgeConfig(api_key="sk-inline")  # a key in the file itself is not a field


def test_rubrics_compose_and_version():
    versions = {
        (n, m): load_rubric(n, m).version for n in RUBRIC_NAMES for m in ("joint", "cached-reference")
    }
    training = load_rubric("training")
    assert training.version.startswith("training-v1-joint+")
    assert len({versions[("training", "joint")], versions[("training", "cached-reference")],
                versions[("evaluation", "joint")], versions[("evaluation", "cached-reference")]}) == 4  # fmt: skip
    # rubrics without mode slots are the same in both modes
    assert versions[("recaption", "joint")] == versions[("recaption", "cached-reference")]
    # the loopback server tells rubrics apart by their whole text: every composition is one rubric's
    for name in RUBRIC_NAMES:
        for mode in REFERENCE_MODES:
            assert packaged_rubric_name(load_rubric(name, mode).text) == name
    assert packaged_rubric_name(training.text.rstrip()) is None and packaged_rubric_name("x") is None
    with pytest.raises(ValueError, match="unknown rubric"):
        load_rubric("nope")
    with pytest.raises(ValueError, match="unknown reference mode"):
        load_rubric("training", "both")


def test_rubric_texts_are_only_what_the_judge_reads():
    for name in RUBRIC_NAMES:
        for mode in REFERENCE_MODES:
            text = load_rubric(name, mode).text
            # no line that exists for tools (a name tag, a version header) rather than for the judge
            assert "balcaprl" not in text.lower() and not text.startswith("["), name


def test_a_rubric_version_follows_its_text(monkeypatch):
    import balcaprl.rewards.rubrics as rubrics

    before = load_rubric("training")
    original = rubrics._part
    monkeypatch.setattr(
        rubrics, "_part", lambda part: original(part) + (" Be brief." if part == "linguistic" else "")
    )
    load_rubric.cache_clear()
    try:
        after = load_rubric("training")
        untouched = load_rubric("recaption")
    finally:
        monkeypatch.undo()
        load_rubric.cache_clear()  # nothing composed from the edited part outlives this test
    assert after.text != before.text and after.version != before.version
    assert after.version.startswith("training-v1-joint+")  # same declared version: only the hash moved
    assert untouched.version == load_rubric("recaption").version


def test_rubrics_state_the_papers_facts():
    training = load_rubric("training").text
    evaluation = load_rubric("evaluation").text
    for text in (training, evaluation):
        for fact in ("every claim", "commentary", "`pointable`", "`visible`", "answer false", "clarity",
                     "fluency", "coherency", "list of facts", "adjectives", "run-on", "compound",
                     "not whether it is right about the image", "never instructions"):  # fmt: skip
            assert fact in text, fact
    # strict pointability in training; evidence-based inference only in evaluation
    assert "visible clues" not in training and "bride" not in training
    for fact in ("visible clues", "bride", "puddles", "read minds", "primary source of truth",
                 "only because the REFERENCE does not mention it"):  # fmt: skip
        assert fact in evaluation, fact
    joint, cached = load_rubric("training", "joint").text, load_rubric("training", "cached-reference").text
    assert '"reference_assertions"' in joint and '"reference_coverage"' in cached
    assert "<reference_assertions>" in cached


PAPER_SENTENCES = [
    "Could a person physically POINT TO this thing in the image?",
    "Break each caption into shortest possible factual claims.",
    "Use the image as the PRIMARY source of truth.",
    "How easily can a human reader understand the caption?",
    "World knowledge IS allowed when it is used to make a normal, evidence-based visual inference.",
    "Check if synthetic caption covers GT content",
    "when in doubt about either condition, mark as NOT VERIFIED",
]


def test_rubrics_are_in_our_own_words():
    texts = " ".join(load_rubric(n, m).text for n in RUBRIC_NAMES for m in ("joint", "cached-reference"))
    squashed = " ".join(texts.lower().split())
    for sentence in PAPER_SENTENCES:
        assert sentence.lower() not in squashed
    # no run of 8 words copied from those sentences either
    words = " ".join(PAPER_SENTENCES).lower().replace("?", "").replace(".", "").split()
    for i in range(len(words) - 7):
        assert " ".join(words[i : i + 8]) not in squashed
