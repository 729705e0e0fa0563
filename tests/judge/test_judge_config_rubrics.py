"""Judge config (the documented keys, unknown keys rejected, key only from the environment) and rubrics."""

from __future__ import annotations

from pathlib import Path

import pytest
from judge_testkit import RUN, paper_run_hashes, run_hashes, words

from balcaprl.judge import JudgeConfig, JudgeConfigError, build_judge, load_judge_config
from balcaprl.judge.rubrics import (
    REFERENCE_MODES,
    RUBRIC_NAMES,
    VERDICT_RUBRICS,
    load_rubric,
    training_rubric_name,
)
from balcaprl.testing.rubrics import packaged_rubric_name

EXAMPLE_YAML = """
base_url: https://api.openai.com/v1
model: gpt-4o-mini
api_key_env: OPENAI_API_KEY
reference_mode: joint
concurrency: auto
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
        (
            "modle: gpt-4o\n",
            r"modle: unknown key; allowed here: api_key_env, auto_max_concurrency, base_url, cache_path",
        ),
        ("reference_mode: both\n", "reference_mode"),
        ("concurrency: 0\n", "concurrency"),
        ("http_backend: curl\n", "http_backend: unknown key"),  # one HTTP client: the setting is gone
        # a typo's concurrency (3.1 M SDK clients and a hang, once) is refused when the config loads
        ("concurrency: 100000000\n", "concurrency: .*auto or a number of calls in flight from 1 to 4096"),
        # a rate limit too small for one call (tokens_per_minute: 1 once crawled a call a minute)
        ("tokens_per_minute: 1\n", "tokens_per_minute 1 is less than one call's answer budget"),
        ("price_per_million_tokens: {prompt: 1}\n", r"price_per_million_tokens\.completion: required"),
        ("- a list\n", "expected a mapping"),
        (
            "rubric: {reference_img: true}\n",
            r"rubric\.reference_img: unknown key; allowed here: reference_image",
        ),
        ("rubric: {reference_image: maybe}\n", r"rubric\.reference_image"),
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


def test_processes_of_one_launch_share_the_judge_limits():
    config = JudgeConfig(concurrency=256, requests_per_minute=1000, tokens_per_minute=None)
    assert config.shared_by(1) is config
    one_of_eight = config.shared_by(8)
    assert (one_of_eight.concurrency, one_of_eight.requests_per_minute, one_of_eight.tokens_per_minute) == (
        32,
        125,
        None,
    )
    assert JudgeConfig(concurrency=3, tokens_per_minute=5000).shared_by(8).model_dump(
        include={"concurrency", "tokens_per_minute"}
    ) == {"concurrency": 1, "tokens_per_minute": 625}
    assert one_of_eight.model_copy(
        update={"concurrency": 256, "auto_max_concurrency": 2048}
    ) == config.model_copy(update={"requests_per_minute": 125})  # nothing else changes
    # What `balcaprl train` does on each of 8 processes (no cache, no key needed for this check).
    built = build_judge(config.model_copy(update={"api_key_env": None}), no_cache=True, processes=8)
    assert (built.config.concurrency, built.config.requests_per_minute) == (32, 125)


def test_rubric_options_default_to_the_paper_and_load_from_yaml(tmp_path):
    assert JudgeConfig().rubric.reference_image is False
    path = tmp_path / "judge.yaml"
    path.write_text("rubric:\n  reference_image: true\n")
    assert load_judge_config(path).rubric.reference_image is True
    assert load_judge_config(path, ["rubric.reference_image=false"]).rubric.reference_image is False


def test_rubrics_compose_and_version():
    versions = {
        (n, m): load_rubric(n, m).version for n in RUBRIC_NAMES for m in ("joint", "cached-reference")
    }
    training = load_rubric("training")
    # declared versions bumped with the rule-by-rule revision (docs/rubrics.md)
    assert training.version.startswith("training-v2-joint+")
    assert load_rubric("evaluation").version.startswith("evaluation-v2-joint+")
    assert load_rubric("reference_decomposition").version.startswith("reference_decomposition-v2-any+")
    assert load_rubric("recaption").version.startswith("recaption-v2-any+")
    verdict_versions = {versions[(n, m)] for n in VERDICT_RUBRICS for m in REFERENCE_MODES}
    assert len(verdict_versions) == len(VERDICT_RUBRICS) * len(REFERENCE_MODES)
    # rubrics without mode slots are the same in both modes
    assert versions[("recaption", "joint")] == versions[("recaption", "cached-reference")]
    # the loopback server tells rubrics apart by their whole text: every composition is one rubric's
    for name in RUBRIC_NAMES:
        for mode in REFERENCE_MODES:
            text = load_rubric(name, mode).text
            assert packaged_rubric_name(text) == (name if text else None)
    assert packaged_rubric_name(training.text.rstrip()) is None and packaged_rubric_name("x") is None
    with pytest.raises(ValueError, match="unknown rubric"):
        load_rubric("nope")
    with pytest.raises(ValueError, match="unknown reference mode"):
        load_rubric("training", "both")
    assert training_rubric_name(True) == "training"
    assert training_rubric_name(False) == "training_without_pointability"


def test_rubric_texts_are_only_what_the_judge_reads():
    for name in RUBRIC_NAMES:
        for mode in REFERENCE_MODES:
            text = load_rubric(name, mode).text
            # no line that exists for tools (a name tag, a version header) rather than for the judge
            assert "balcaprl" not in text.lower() and not text.startswith("["), name
            assert "A_P" not in text and "A_G" not in text, name  # no developer notation


def _edited(part: str, monkeypatch) -> dict[tuple[str, str], str]:
    """Every rubric's version after appending a sentence to one part (caches restored after)."""
    import balcaprl.judge.rubrics as rubrics

    original = rubrics._part
    monkeypatch.setattr(
        rubrics, "_part", lambda name: original(name) + (" Be brief." if name == part else "")
    )
    load_rubric.cache_clear()
    try:
        return {(n, m): load_rubric(n, m).version for n in RUBRIC_NAMES for m in REFERENCE_MODES}
    finally:
        monkeypatch.undo()
        load_rubric.cache_clear()  # nothing composed from the edited part outlives this test


def test_a_rubric_version_follows_its_text(monkeypatch):
    before = {(n, m): load_rubric(n, m).version for n in RUBRIC_NAMES for m in REFERENCE_MODES}
    after = _edited("linguistic", monkeypatch)
    changed = {key for key in before if before[key] != after[key]}
    assert changed == {(n, m) for n in VERDICT_RUBRICS for m in REFERENCE_MODES}
    assert after[("training", "joint")].startswith("training-v2-joint+")  # only the hash moved
    # the splitting rules are one part: editing it moves every rubric that splits a text, in both
    # modes, the cached-reference decompositions included
    after = _edited("splitting", monkeypatch)
    changed = {name for (name, _), version in after.items() if before[(name, _)] != version}
    assert changed == {*VERDICT_RUBRICS, "reference_decomposition", "reference_decomposition_with_image"}


def _sections(text: str) -> list[str]:
    return [s.strip() for s in text.split("\n\n") if s.strip()]


def test_cached_reference_decomposition_splits_by_the_joint_modes_rules():
    """Joint mode splits the reference inside the verdict call; cached-reference mode in a call of
    its own. Both read the very same paragraphs, so the two splits cannot follow different rules."""
    joint = _sections(load_rubric("training", "joint").text)
    splitting = _sections(load_rubric("training", "cached-reference").text)
    splitting = splitting[splitting.index("## How a text is split into atomic assertions") :][:3]
    assert splitting[0].startswith("## How a text") and "Keep every claim" in splitting[1]
    reference_step = next(s for s in joint if s.startswith("Split the REFERENCE"))
    for name in ("reference_decomposition", "reference_decomposition_with_image"):
        decomposition = _sections(load_rubric(name).text)
        for paragraph in [*splitting[:2], reference_step]:
            assert paragraph in decomposition and paragraph in joint, (name, paragraph[:40])
    # only the variant that attaches the image says that one comes with the request
    assert "comes with the request" not in load_rubric("reference_decomposition").text
    assert "comes with the request" in load_rubric("reference_decomposition_with_image").text


def test_the_ablation_rubric_is_the_training_rubric_without_pointability():
    for mode in REFERENCE_MODES:
        training = _sections(load_rubric("training", mode).text)
        ablation = _sections(load_rubric("training_without_pointability", mode).text)
        assert "pointable" not in " ".join(ablation).lower() and "point at" not in " ".join(ablation)
        assert "`pointable`" in " ".join(training)
        # what is left is the training rubric's own text (the visible test included), nothing reworded
        kept = [s for s in ablation if s in training]
        own = [s for s in ablation if s not in training]
        assert any(s.startswith("### `visible`") for s in kept)
        assert all("visible" in s or s.startswith(("{", "Reply with")) for s in own), own


def test_rubrics_state_the_papers_facts():
    training = load_rubric("training").text
    evaluation = load_rubric("evaluation").text
    for text in (training, evaluation):
        for fact in ("every claim", "commentary", "subjective", "`pointable`", "`visible`", "answer false",
                     "clarity", "fluency", "coherency", "list of facts", "adjectives", "run-on", "compound",
                     "not whether it is right about the image", "never instructions", "run too long",
                     "reasonably infer", "both count against the caption"):  # fmt: skip
            assert fact in text, fact
        assert "filler" not in text  # the paper does not ask for filler to be itemised
        assert "clearly implies" not in text
    # strict pointability in training; evidence-based inference only in evaluation
    assert "visible clues" not in training and "bride" not in training
    assert "abstract ideas" in training and "relationships between people" in training
    for fact in ("visible clues", "bride", "puddles", "read minds", "primary source of truth",
                 "only because the REFERENCE does not mention it", "probably a cook", "probably"):  # fmt: skip
        assert fact in evaluation, fact
    # the "unusually strong evidence" qualifier covers family ties and wealth, never a reunion
    false_cases = next(s for s in _sections(evaluation) if s.startswith("False when the claim goes beyond"))
    reunion, qualifier = false_cases.index("a reunion"), false_cases.index("unless the picture offers")
    assert false_cases.index('"a family"') < qualifier and reunion < false_cases.index("Claims of wealth")
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


def _descriptions(node) -> list[str]:
    if isinstance(node, dict):
        return [v for k, v in node.items() if k == "description" and isinstance(v, str)] + [
            d for v in node.values() for d in _descriptions(v)
        ]
    if isinstance(node, list):
        return [d for v in node for d in _descriptions(v)]
    return []


def everything_the_judge_reads() -> dict[str, str]:
    """Every rubric, every schema description and every fixed message text of the verdict judge."""
    from balcaprl.judge import prompt
    from balcaprl.judge.schemas import (
        CoverageMarks,
        ReferenceAssertions,
        coverage_schema,
        json_response_format,
        verdict_schema,
    )

    texts = {f"rubric {n}/{m}": load_rubric(n, m).text for n in RUBRIC_NAMES for m in REFERENCE_MODES}
    schemas = [verdict_schema(r) for r in VERDICT_RUBRICS] + [coverage_schema(r) for r in VERDICT_RUBRICS]
    for schema in [*schemas, ReferenceAssertions, CoverageMarks]:
        texts[f"schema {schema.__name__}"] = " | ".join(_descriptions(json_response_format(schema, "x")))
    texts["data note"], texts["follow-up"] = prompt._DATA_NOTE, prompt._FOLLOWUP
    return texts


def test_rubrics_are_in_our_own_words():
    paper = paper_run_hashes()
    # the stored hashes are of the same word runs this test makes: the paper sentences above are in them
    for sentence in PAPER_SENTENCES:
        if len(words(sentence)) >= RUN:
            assert set(run_hashes(sentence)) <= paper, sentence
    copied = {
        name: run for name, text in everything_the_judge_reads().items()
        for digest, run in run_hashes(text).items() if digest in paper
    }  # fmt: skip
    assert not copied, f"runs of {RUN} words shared with the paper's prompts: {copied}"
    squashed = " ".join(" ".join(everything_the_judge_reads().values()).lower().split())
    for sentence in PAPER_SENTENCES:
        assert sentence.lower() not in squashed


def test_the_own_words_check_can_fail():
    paper = paper_run_hashes()
    borrowed = "Rule: could a person physically point to this thing in the image at all?"
    assert set(run_hashes(borrowed)) & paper  # a pasted run is caught, whatever surrounds it
