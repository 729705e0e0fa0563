"""Official prompts read at run time from a checkout of each benchmark's code (here: tiny fake checkouts
with placeholder texts in the official names): what is read, the errors that name the file and what
is missing, the recorded provenance, and the config and command-line ways to ask for them."""

from __future__ import annotations

import hashlib
import sys

import pytest
from official_fakes import (
    FAKE_CAPARENA,
    FAKE_DECAPBENCH,
    FAKE_LMMS_UTILS,
    FAKE_SYSTEM,
    fake_caparena,
    fake_decapbench,
    fake_lmms_eval,
    git_commit_all,
)

from balcaprl.errors import ConfigError
from balcaprl.evaluate.config import load_evaluation_config
from balcaprl.evaluate.official import (
    OFFICIAL_TEXT_CHANGE,
    load_caparena_prompts,
    load_captionqa_task,
    load_decapbench_prompts,
    paper_comparability,
)


def test_decapbench_prompts_are_read_without_running_the_file(tmp_path):
    root = fake_decapbench(tmp_path / "DeCapBench")
    commit = git_commit_all(root)
    prompts = load_decapbench_prompts(root)  # the file ends in `raise SystemExit`: it never ran
    assert prompts.system == FAKE_SYSTEM
    assert prompts.extract.slots == ("caption",)
    assert prompts.match.slots == ("predicted_atomic_facts", "oracle_atomic_facts")
    assert prompts.verify.slots == ("reference_caption", "atomic_facts")
    # the template keeps the official text and takes the value as it is, as the script's .format does
    head = 'PLACEHOLDER-EXTRACT: list the facts as {"fact": ..., "relevance": 1}.\n%% PLACEHOLDER caption:\n'
    assert prompts.extract.fill(caption=" A dog <b>& a cat</b>.\n") == (
        head + " A dog <b>& a cat</b>.\n\n%% PLACEHOLDER list:\n"
    )
    # with the guard, the value becomes an escaped data block
    assert prompts.extract.fill(caption="A dog <b>& a cat</b>.", guard=True) == (
        head + "<caption>\nA dog &lt;b&gt;&amp; a cat&lt;/b&gt;.\n</caption>\n%% PLACEHOLDER list:\n"
    )
    with pytest.raises(ValueError, match="needs exactly"):
        prompts.match.fill(predicted_atomic_facts="x")
    file = root / "eval" / "evaluation_decapbench.py"
    source = prompts.source.as_dict()
    assert source["kind"] == "official" and source["file"] == str(file)
    assert source["sha256"] == hashlib.sha256(FAKE_DECAPBENCH.encode()).hexdigest()
    assert "published" not in source  # not a published version we know
    assert "change" not in source  # the official text as it is
    assert prompts.source.ran(guard=True).as_dict()["change"] == OFFICIAL_TEXT_CHANGE
    assert set(source["names"]) >= {"extract_prompt", "match_prompt", "verify_prompt"}
    if commit is not None:
        assert source["commit"] == commit and source["modified"] is False
        file.write_text(FAKE_DECAPBENCH.replace("PLACEHOLDER-EXTRACT", "EDITED"))
        edited = load_decapbench_prompts(root / "eval")  # the eval/ folder works too
        assert edited.source.commit == commit and edited.source.modified is True
        assert (
            "the official file differs from its git commit"
            in paper_comparability("dcscore", edited.source.as_dict(), [], "gpt-4o-2024-05-13")[0]
        )
    # the file path itself is accepted
    assert load_decapbench_prompts(file).extract.slots == ("caption",)


def test_a_checkout_that_is_no_git_work_tree_records_no_commit(tmp_path):
    prompts = load_decapbench_prompts(fake_decapbench(tmp_path / "copy"))
    assert prompts.source.commit is None and prompts.source.modified is None
    assert prompts.source.sha256 == hashlib.sha256(FAKE_DECAPBENCH.encode()).hexdigest()


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t.replace("verify_prompt =", "verification_prompt ="), r"no module-level `verify_prompt`"),
        (lambda t: t.replace("{caption}", "{text}"), r"`extract_prompt` has no slot \{caption\} and has unexpected slots \{text\}"),
        (lambda t: t.replace("{oracle_atomic_facts}", ""), r"`match_prompt` has no slot \{oracle_atomic_facts\}"),
        (lambda t: t.replace('verify_prompt = """', 'verify_prompt = "x" + """'), r"`verify_prompt` is not a plain string literal"),
        (lambda t: t.replace("def run_gpt_text(", "def run_text("), r"no function `run_gpt_text`"),
        (lambda t: t.replace('sys_prompt="PLACEHOLDER system message", n=1)', "sys_prompt=None, n=1)"), r"no string default for `sys_prompt`"),
        (lambda t: t + "\nextract_prompt = 'other {caption}'\n" + "this is not python (", r"cannot be read as Python"),
    ],
)  # fmt: skip
def test_decapbench_verification_errors_name_the_file_and_what_is_missing(tmp_path, edit, message):
    root = fake_decapbench(tmp_path / "DeCapBench", edit(FAKE_DECAPBENCH))
    with pytest.raises(ConfigError, match=message) as raised:
        load_decapbench_prompts(root)
    assert "evaluation_decapbench.py" in str(raised.value)


def test_a_missing_checkout_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"official\.decapbench: neither .*eval/evaluation_decapbench\.py"):
        load_decapbench_prompts(tmp_path / "nowhere")
    with pytest.raises(ConfigError, match=r"official\.caparena: neither .*vlm_as_a_judge\.py"):
        load_caparena_prompts(tmp_path)
    with pytest.raises(
        ConfigError, match=r"official\.captionqa: .*lmms_eval/tasks/captionqa/utils\.py does not exist"
    ):
        load_captionqa_task(tmp_path / "nowhere")


def test_caparena_prompts_from_the_f_string(tmp_path):
    root = fake_caparena(tmp_path / "CapArena")
    prompts = load_caparena_prompts(root)
    assert prompts.system.startswith("PLACEHOLDER-ARENA: answer with two lines")
    assert prompts.compare.slots == ("caption_1", "caption_2", "caption_ref")
    assert prompts.compare.fill(caption_1="one", caption_2="two", caption_ref="ref") == (
        "PLACEHOLDER first:\none\nsecond:\ntwo\nreference:\nref\nPLACEHOLDER {braces} stay."
    )
    assert prompts.compare.fill(caption_1="one", caption_2="two", caption_ref="ref", guard=True) == (
        "PLACEHOLDER first:\n<caption_1>\none\n</caption_1>\nsecond:\n<caption_2>\ntwo\n</caption_2>\n"
        "reference:\n<caption_ref>\nref\n</caption_ref>\nPLACEHOLDER {braces} stay."
    )
    assert prompts.source.sha256 == hashlib.sha256(FAKE_CAPARENA.encode()).hexdigest()
    for edit, message in [
        (lambda t: t.replace("system_prompt_with_ref =", "system_prompt_ref ="), "no module-level `system_prompt_with_ref`"),
        (lambda t: t.replace("if with_ref:", "if cal_agree:"), r"no f-string `compare_prompt` under `if with_ref:`"),
        (lambda t: t.replace("{caption_ref}\\n", "{caption_ref!r}\\n"), "has a field that is not a plain name"),
        (lambda t: t.replace("\\nreference:\\n{caption_ref}", ""), r"has no slot \{caption_ref\}"),
    ]:  # fmt: skip
        fake_caparena(tmp_path / "broken", edit(FAKE_CAPARENA))
        with pytest.raises(ConfigError, match=message):
            load_caparena_prompts(tmp_path / "broken")


def test_captionqa_task_from_an_lmms_eval_checkout(tmp_path):
    root = fake_lmms_eval(tmp_path / "lmms-eval")
    task = load_captionqa_task(str(root))
    assert (
        task.system == "PLACEHOLDER-QA system message" and task.cannot_answer == "PLACEHOLDER none of these"
    )
    assert task.build_prompt("cap", "Why?", ["x", "y"]) == (
        "PLACEHOLDER-QA caption:\ncap\nPLACEHOLDER question: Why?\n(A) x\n(B) y\nPLACEHOLDER answer:"
    )
    assert task.extract_letter("it is (B)", 2) == "B" and task.extract_letter("B", 2) is None
    assert task.add_cannot_answer("Is it?", ["Yes", "No"]) == ["Yes", "No"]
    source = task.source.as_dict()
    assert source["file"].endswith("lmms_eval/tasks/captionqa/utils.py")
    assert source["sha256"] == hashlib.sha256(FAKE_LMMS_UTILS.encode()).hexdigest()
    assert not any(name.startswith("balcaprl_official_captionqa") for name in sys.modules)  # not left behind
    # the task folder or the file itself work too
    assert load_captionqa_task(root / "lmms_eval" / "tasks" / "captionqa").system == task.system


def test_captionqa_task_errors(tmp_path):
    fake_lmms_eval(tmp_path / "a", FAKE_LMMS_UTILS.replace("QA_SYSTEM_PROMPT =", "SYSTEM ="))
    with pytest.raises(ConfigError, match=r"utils\.py: missing or wrong type: QA_SYSTEM_PROMPT"):
        load_captionqa_task(str(tmp_path / "a"))
    fake_lmms_eval(tmp_path / "b", "import balcaprl_no_such_module_for_tests\n" + FAKE_LMMS_UTILS)
    with pytest.raises(
        ConfigError,
        match=r"needs the module balcaprl_no_such_module_for_tests; pip install 'balcaprl\[captionqa\]'",
    ):
        load_captionqa_task(str(tmp_path / "b"))
    fake_lmms_eval(tmp_path / "c", FAKE_LMMS_UTILS + "\nraise RuntimeError('boom')\n")
    with pytest.raises(ConfigError, match=r"failed to load \(RuntimeError: boom\)"):
        load_captionqa_task(str(tmp_path / "c"))


def test_installed_lmms_eval_is_found_or_named(tmp_path):
    from importlib import metadata

    try:
        metadata.distribution("lmms_eval")
    except metadata.PackageNotFoundError:
        with pytest.raises(
            ConfigError, match=r"lmms-eval is not installed; pip install 'balcaprl\[captionqa\]'"
        ):
            load_captionqa_task("lmms-eval")
    else:  # installed: its task loads (or names the light dependency it lacks)
        try:
            task = load_captionqa_task("lmms-eval")
        except ConfigError as error:
            assert "needs the module" in str(error)
        else:
            assert task.source.version and task.source.sha256


def test_the_config_names_the_sources_and_paths_are_relative_to_it(tmp_path):
    fake_decapbench(tmp_path / "checkouts" / "DeCapBench")
    config_file = tmp_path / "eval.yaml"
    config_file.write_text(
        "official: {decapbench: checkouts/DeCapBench, caparena: ~/CapArena, captionqa: lmms-eval}\n"
    )
    config = load_evaluation_config(config_file)
    assert config.official.decapbench == tmp_path / "checkouts" / "DeCapBench"
    assert config.official.captionqa == "lmms-eval"
    assert str(config.official.caparena).endswith("/CapArena") and "~" not in str(config.official.caparena)
    config_file.write_text("official: {decapbnch: x}\n")
    with pytest.raises(
        ConfigError, match=r"official\.decapbnch: unknown key; allowed here: caparena, captionqa, decapbench"
    ):
        load_evaluation_config(config_file)
