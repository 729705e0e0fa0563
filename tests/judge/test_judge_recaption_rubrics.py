"""Re-captioning follows the paper by default (the sample's original prompt, nothing added); the
stricter pointable-only variant is the named option ``--rubric strict``."""

from __future__ import annotations

import asyncio

import pytest
from judge_testkit import IMAGE, config
from typer.testing import CliRunner

from balcaprl.cli import app
from balcaprl.data.recaption import RECAPTION_RUBRICS, Recaptioner
from balcaprl.judge.rubrics import load_rubric

PROMPT = "Describe this image in detail. <b>Be thorough</b>"


def recaption_once(server, tmp_path, **kwargs):
    (tmp_path / "a.png").write_bytes(IMAGE)

    async def go():
        async with Recaptioner(config(server.base_url), image_root=tmp_path, **kwargs) as recaptioner:
            return await recaptioner.recaption(tmp_path / "a.png", PROMPT)

    return asyncio.run(go())


@pytest.fixture
def captioner(judge_server):
    calls = []

    def handler(call):
        calls.append(call)
        return "A new reference caption."

    return judge_server(handler=handler), calls


def test_by_default_the_original_prompt_is_the_whole_instruction(captioner, tmp_path):
    server, calls = captioner
    key, outcome = recaption_once(server, tmp_path)
    assert outcome.caption == "A new reference caption."
    (call,) = calls
    assert call.system == "" and len(call.messages) == 1  # no system message, no added rules
    assert call.text == PROMPT and len(call.images) == 1 and call.schema_name is None


def test_strict_is_the_pointable_only_variant_with_the_prompt_as_data(captioner, tmp_path):
    server, calls = captioner
    _, outcome = recaption_once(server, tmp_path, rubric="strict")
    (call,) = calls
    assert call.system == load_rubric("recaption_strict").text and call.kind == "recaption_strict"
    assert "Do not invent details, guess at feelings" in call.system
    assert (
        call.text
        == "<instruction>\nDescribe this image in detail. &lt;b&gt;Be thorough&lt;/b&gt;\n</instruction>"
    )


def test_the_two_variants_never_share_a_cached_caption(captioner, tmp_path):
    server, _ = captioner
    digest = "0" * 64
    paper = Recaptioner(config(server.base_url), image_root=tmp_path)
    strict = Recaptioner(config(server.base_url), image_root=tmp_path, rubric="strict")
    assert paper.key(digest, PROMPT) != strict.key(digest, PROMPT)
    assert paper.rubric.name == RECAPTION_RUBRICS["paper"] == "recaption"
    for recaptioner in (paper, strict):
        asyncio.run(recaptioner.caller.aclose())
    with pytest.raises(ValueError, match="choose one of paper, strict"):
        Recaptioner(config(server.base_url), image_root=tmp_path, rubric="loose")


def test_the_cli_names_the_choices_for_an_unknown_rubric(tmp_path):
    result = CliRunner().invoke(
        app,
        ["data", "recaption", "--data", str(tmp_path), "--model", "m", "--judge-config", str(tmp_path / "j.yaml"),
         "--rubric", "loose"],
    )  # fmt: skip
    assert result.exit_code == 2
    assert "--rubric 'loose': choose paper or strict" in " ".join(result.output.split())
