"""`balcaprl evaluate`: all four protocols in one run over the loopback server (the scripted verdict
judge for b-CapScore, the scripted handler for the rest), eval.json, resume, config and errors."""

from __future__ import annotations

import json

import pytest
import yaml
from evaluate_testkit import (
    CAPARENA_BASELINES,
    ProtocolJudge,
    write_caparena,
    write_captionqa,
    write_decapbench,
    write_judge_yaml,
)
from typer.testing import CliRunner

from balcaprl.cli import app
from balcaprl.errors import ConfigError
from balcaprl.evaluate.config import load_evaluation_config
from balcaprl.evaluate.suite import read_eval

# b-CapScore with the scripted verdict judge (see tests/judge/judge_testkit.py for its rules):
# iiw_001: clauses "a red door on the left" (visible, pointable), "a purple elephant" (not visible),
#   "the scene has a cozy atmosphere" (commentary) -> P 1/3; reference clauses: door covered, cat not
#   -> R 1/2; linguistic 21/27.  iiw_002: the caption is the reference -> P 1, R 1, L 21/27.
DECAP_CAPTIONS = {
    "iiw_001.jpg": "A red door on the left, a purple elephant, the scene has a cozy atmosphere.",
    "iiw_002.jpg": "A blue car is parked by a tree.",
}
B1 = 3 / (3 + 2 + 27 / 21)
B2 = 3 / (1 + 1 + 27 / 21)
# DCScore: iiw_001 -> one fact, matched and verified: P 1, R 1/3, F1 1/2 (all and relevant);
# iiw_002 -> no fact extracted in 5 samples: invalid, left out as the official scorer leaves it out.
# DCScore = 100 x 0.5 / 1 (before the official rule: 100 x (0.5 + 0) / 2, the invalid caption as 0).
FACTS = {DECAP_CAPTIONS["iiw_001.jpg"]: [("There is a red door", "door_0", True)]}
MATCHES = {"There is a red door": ["There is a red door."]}
VERIFIED = {"There is a red door": [True]}
# CaptionQA: see test_evaluate_captionqa.py -> 100 x (1 + 0 + 0.55 + 0) / 4
ANSWERS = {
    ("CAP1", "What colour is the door?"): "Red",
    ("CAP1", "Is there a cat?"): "No",
    ("CAP2", "Where is the car parked?"): "Cannot answer from the caption",
    ("CAP2", "What brand is the car?"): "raw:none",
}


@pytest.fixture
def world(tmp_path, eval_server):
    decap, decap_images = write_decapbench(tmp_path)
    questions = write_captionqa(tmp_path)
    arena, arena_images, _ = write_caparena(tmp_path)
    ours_arena = {f"test_{i:05d}.jpg": " ".join(["w"] * (i + 2)) for i in range(6)}  # 2..7 words
    handler = ProtocolJudge(facts=FACTS, matches=MATCHES, verified=VERIFIED, answers=ANSWERS,
                            preferred=set(ours_arena.values()))  # fmt: skip
    server = eval_server(handler)
    rows = [
        {"key": k, "image": k, "caption": c, "benchmark": "decapbench", "model": "m"}
        for k, c in DECAP_CAPTIONS.items()
    ]
    rows += [{"key": k, "image": "<embedded>", "caption": c, "benchmark": "captionqa", "model": "m"}
             for k, c in {"nat_001": "CAP1", "nat_002": "CAP2"}.items()]  # fmt: skip
    rows += [
        {"key": k, "image": k, "caption": c, "benchmark": "caparena", "model": "m"}
        for k, c in ours_arena.items()
    ]
    captions = tmp_path / "captions.jsonl"
    captions.write_text("".join(json.dumps(r) + "\n" for r in rows))
    judge = write_judge_yaml(tmp_path / "judge.yaml", server.base_url)
    config = tmp_path / "eval.yaml"
    config.write_text(yaml.safe_dump({
        "judge": "judge.yaml",
        "bcapscore": {"annotations": decap.name, "images": decap_images.name},
        "dcscore": {"annotations": decap.name, "images": decap_images.name, "n_match": 2, "n_verify": 2},
        "captionqa": {"questions": questions.name},
        "caparena": {"annotations": arena.name, "images": arena_images.name},
    }))  # fmt: skip
    return server, handler, captions, config, judge


def results_of(record):
    return record["results"]


def cli(*args):
    return CliRunner(env={"COLUMNS": "120"}).invoke(app, [str(a) for a in args])


def test_the_whole_suite_then_a_free_rerun(tmp_path, world):
    server, handler, captions, config, _ = world
    out = tmp_path / "eval"
    result = cli("evaluate", "--captions", captions, "--config", config, "--out", out, "--label", "tiny",
                 "--no-progress")  # fmt: skip
    assert result.exit_code == 0, result.output
    record = read_eval(out)
    headline = record["headline"]
    assert headline["bcapscore"] == pytest.approx(100 * (B1 + B2) / 2)
    assert headline["dcscore"] == pytest.approx(100 * 0.5, rel=1e-6)
    assert results_of(record)["dcscore"]["metrics"]["invalid"] == {"iiw_002.jpg": "no fact"}
    assert headline["captionqa"] == pytest.approx(38.75)
    assert headline["caparena"] == pytest.approx(1.0)  # every battle won: (2 - 0) / 2 per baseline
    assert headline["arena_length"] == pytest.approx(sum(range(2, 8)) / 6)
    assert record["label"] == "tiny"
    results = record["results"]
    assert results["captionqa"]["missing"] == ["doc_001"] and not results["captionqa"]["complete"]
    assert results["bcapscore"]["complete"] and results["bcapscore"]["judge"] == "scripted"
    assert results["dcscore"]["settings"]["n_match"] == 2
    assert set(results["caparena"]["metrics"]["per_baseline"]) == set(CAPARENA_BASELINES)
    assert (out / "bcapscore" / "scores.jsonl").is_file() and (out / "bcapscore" / "summary.json").is_file()
    for protocol in ("dcscore", "captionqa", "caparena"):
        assert (out / protocol / "items.jsonl").is_file()
    assert "bcapscore:" in result.output and "without a caption" in result.output
    calls = server.counters.total
    # verdicts 2; dcscore: 1 + 5 extractions (the caption without facts is sampled 5 times) + 2 match
    # and 2 verify trials of the one caption with facts; captionqa 4 questions; caparena 6 battles
    assert calls == 2 + (6 + 2 + 2) + 4 + 6

    # The same command again is refused: the folder holds these protocols' results.
    result = cli("evaluate", "--captions", captions, "--config", config, "--out", out, "--label", "tiny",
                 "--no-progress")  # fmt: skip
    assert (
        result.exit_code == 2
        and "already holds results (bcapscore, dcscore, captionqa, caparena); pass --resume"
        in (" ".join(result.output.split()))
    )
    # With --resume it costs nothing: every answer is in OUT/judge_cache.sqlite.
    result = cli("evaluate", "--captions", captions, "--config", config, "--out", out, "--label", "tiny",
                 "--no-progress", "--resume")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert server.counters.total == calls
    assert read_eval(out)["headline"] == headline
    # --overwrite replaces the results, and the folder's judge cache goes with it into the new folder
    (out / "dcscore" / "stale.txt").write_text("left by hand")
    result = cli("evaluate", "--captions", captions, "--config", config, "--out", out, "--suite", "dcscore",
                 "--no-progress", "--overwrite")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert server.counters.total == calls and not (out / "dcscore" / "stale.txt").exists()
    assert read_eval(out)["headline"] == headline and read_eval(out)["label"] == "tiny"
    assert (
        sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".eval")) == []
    )  # nothing left aside


def test_results_accumulate_and_flags_override(tmp_path, world):
    server, _, captions, config, judge = world
    out = tmp_path / "eval"
    assert cli("evaluate", "--captions", captions, "--config", config, "--out", out, "--suite", "caparena",
               "--no-progress").exit_code == 0  # fmt: skip
    assert set(read_eval(out)["results"]) == {"caparena"}
    other = tmp_path / "other_judge.yaml"
    other.write_text(judge.read_text().replace("model: scripted", "model: another-judge"))
    result = cli("evaluate", "--captions", captions, "--config", config, "--out", out, "--suite", "captionqa",
                 "--judge-for", f"captionqa={other}", "--no-progress")  # fmt: skip
    assert result.exit_code == 0, result.output
    record = read_eval(out)
    assert (
        set(record["results"]) == {"caparena", "captionqa"}
        and record["results"]["captionqa"]["judge"] == "another-judge"
    )
    assert record["headline"]["caparena"] == pytest.approx(1.0)


def test_set_up_errors_are_found_before_any_call(tmp_path, world):
    server, _, captions, config, judge = world
    only_arena = tmp_path / "arena_only.json"
    only_arena.write_text(json.dumps({"test_00000.jpg": "x"}))
    result = cli("evaluate", "--captions", f"caparena={only_arena}", "--config", config, "--out", tmp_path / "e",
                 "--suite", "caparena,dcscore", "--no-progress")  # fmt: skip
    assert result.exit_code == 2 and "dcscore needs decapbench captions" in result.output
    result = cli("evaluate", "--captions", captions, "--judge", judge, "--out", tmp_path / "e", "--suite", "captionqa",
                 "--no-progress")  # fmt: skip
    assert result.exit_code == 2 and "--captionqa" in result.output
    result = cli(
        "evaluate", "--captions", captions, "--config", config, "--out", tmp_path / "e", "--suite", "bleu"
    )
    assert result.exit_code == 2 and "unknown protocol" in result.output
    assert server.counters.total == 0
    with pytest.raises(ConfigError, match=r"dcscore\.n_match"):
        load_evaluation_config(None, {"dcscore": {"n_match": 0}})
    with pytest.raises(ConfigError, match=r"dcscore\.n_match"):
        load_evaluation_config(None, ["dcscore.n_match=0"])  # the common override syntax
    bad = tmp_path / "bad.yaml"
    bad.write_text("dcscore: {annotaions: x}\n")
    with pytest.raises(
        ConfigError,
        match=r"dcscore\.annotaions: unknown key; allowed here: annotations, degenerate_captions, empty_captions, extract_temperature",
    ):
        load_evaluation_config(bad)


def test_the_evaluation_config_resolves_paths_and_validates_judges_when_it_loads(tmp_path):
    (tmp_path / "judges").mkdir()
    (tmp_path / "judges" / "a.yaml").write_text("model: judge-a\ncache_path: null\n")
    (tmp_path / "judges" / "typo.yaml").write_text("modle: x\n")
    (tmp_path / "eval").mkdir()
    (tmp_path / "base.yaml").write_text("judge: judges/a.yaml\ndcscore: {annotations: data/iiw.jsonl}\n")
    config_file = tmp_path / "eval" / "config.yaml"
    config_file.write_text(
        "base: ../base.yaml\ncaptionqa: {questions: qa.parquet, judge: ../judges/a.yaml}\n"
    )
    config = load_evaluation_config(config_file, {"caparena": {"images": None}, "dcscore": {"n_match": 2}})
    assert config.judge is not None and config.judge.model == "judge-a"  # relative to base.yaml
    assert config.dcscore.annotations == tmp_path / "data" / "iiw.jsonl" and config.dcscore.n_match == 2
    assert config.captionqa.questions == tmp_path / "eval" / "qa.parquet"  # relative to its own file
    assert config.judge_for("captionqa") == config.judge_for("bcapscore") == config.judge
    assert config.caparena.images is None  # a flag that was not given changes nothing
    config_file.write_text("base: ../base.yaml\nbcapscore: {judge: ../judges/typo.yaml}\n")
    with pytest.raises(ConfigError, match=r"bcapscore\.judge\.modle: unknown key; allowed here: api_key_env"):
        load_evaluation_config(config_file)


def test_the_protocol_table_is_what_the_config_and_the_command_line_read():
    import inspect

    import typer

    from balcaprl.evaluate.config import PROTOCOLS, EvaluationConfig

    assert list(PROTOCOLS) == ["bcapscore", "dcscore", "captionqa", "caparena"]
    POSITIONAL, KEYWORD = inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY
    command = typer.main.get_command(app).commands["evaluate"]  # type: ignore[attr-defined]
    flags = {option for param in command.params for option in param.opts}
    for name, protocol in PROTOCOLS.items():
        assert protocol.name == name
        assert EvaluationConfig.model_fields[name].annotation is protocol.section  # its config section
        section = protocol.section()
        for key, (_, flag) in protocol.section.INPUTS.items():
            assert flag in flags  # every input file has its flag
            assert key not in section.options()  # the recorded settings are the options only
        assert set(protocol.official_options) - {"images_sent", "samples_sent"} <= set(
            section.options()
        )  # + what was sent
        parameters = inspect.signature(protocol.run).parameters.values()  # the one signature
        assert [p.kind for p in parameters] == [POSITIONAL] * 5 + [KEYWORD] * 3
        assert [p.name for p in parameters][4:] == ["settings", "on_progress", "prompts", "label"]
    assert set(EvaluationConfig.model_fields) == {"judge", "official", *PROTOCOLS}


def test_official_prompts_are_recorded_and_reports_mark_the_rest(tmp_path, eval_server):
    from official_fakes import fake_caparena

    arena, arena_images, _ = write_caparena(tmp_path, n_per_baseline=1)
    calls = []

    def handler(call):  # a judge for both prompt sets: ties everywhere
        calls.append(call)
        if call.schema_name is None:  # the official prompts ask for free text
            return "Reason: both fine.\nJudgment: Tie."
        return {"reason": "both fine", "judgment": "Tie"}

    server = eval_server(handler)
    judge = write_judge_yaml(tmp_path / "judge.yaml", server.base_url, model="gpt-4o-2024-08-06")
    captions = tmp_path / "c.json"
    captions.write_text(json.dumps({f"test_{i:05d}.jpg": "a caption" for i in range(3)}))
    checkout = fake_caparena(tmp_path / "CapArena")
    common = ["--captions", f"caparena={captions}", "--suite", "caparena", "--caparena", arena, "--caparena-images",
              arena_images, "--judge", judge, "--no-progress"]  # fmt: skip

    result = cli(
        "evaluate", *common, "--official-caparena", checkout, "--out", tmp_path / "official", "--label", "off"
    )
    assert result.exit_code == 0, result.output
    assert "official prompts" in result.output
    entry = read_eval(tmp_path / "official")["results"]["caparena"]
    assert entry["comparable_with_paper"] and entry["not_comparable"] == []
    assert entry["settings"]["prompts"]["file"] == str(checkout / "vlm_as_a_judge.py")
    assert entry["settings"]["prompts"]["sha256"] and entry["settings"]["images_sent"] == "official"
    assert entry["rules"]["rules"] == "official" and entry["rules"]["deviations"] == []  # the rules named

    result = cli("evaluate", *common, "--out", tmp_path / "ours", "--label", "ours")
    assert result.exit_code == 0, result.output
    entry = read_eval(tmp_path / "ours")["results"]["caparena"]
    assert not entry["comparable_with_paper"]
    assert entry["not_comparable"] == [
        "prompts: paraphrase (not the benchmark's official prompts)",
        "option images_sent='judge' (official: 'official')",
    ]

    result = cli("report", tmp_path / "official", tmp_path / "ours", "--out", tmp_path / "report")
    assert result.exit_code == 0, result.output
    table = (tmp_path / "report" / "report.md").read_text()
    off = next(
        line for line in table.splitlines() if line.startswith("| **off** |")
    )  # the first run: baseline
    ours = next(line for line in table.splitlines() if line.startswith("| ours |"))
    assert "‡" not in off and ours.count("‡") == 2  # CapArena and its Arena Length
    assert "‡1 not comparable with the paper's Table 1: prompts: paraphrase" in table
    assert "Scoring rules, off: caparena: official\n" in table
    assert (
        "Scoring rules, ours: caparena: official, with deviations; deviations: prompts: paraphrase" in table
    )

    # a checkout without the official file: refused before any call, naming what is missing
    n_calls = len(calls)
    result = cli("evaluate", *common, "--official-caparena", tmp_path, "--out", tmp_path / "bad")
    assert (
        result.exit_code == 2
        and "official.caparena" in result.output
        and "vlm_as_a_judge.py" in result.output
    )
    assert len(calls) == n_calls


def test_a_judge_that_fails_gives_exit_status_1_and_no_shared_cache_still_resumes(tmp_path, world):
    import socket

    server, _, captions, config, _ = world
    with socket.socket() as sock:  # a port nothing listens on: every call fails
        sock.bind(("127.0.0.1", 0))
        dead = write_judge_yaml(tmp_path / "dead.yaml", f"http://127.0.0.1:{sock.getsockname()[1]}/v1")
    out = tmp_path / "eval"
    result = cli("evaluate", "--captions", captions, "--config", config, "--judge-for", f"caparena={dead}",
                 "--out", out, "--suite", "captionqa,caparena", "--no-cache", "--no-progress")  # fmt: skip
    assert result.exit_code == 1, result.output
    text = " ".join(result.output.split())
    assert "incomplete: caparena: none of the 6 items with a caption scored" in text
    assert "captionqa" not in text.split("incomplete:")[1]  # captionqa scored all it had captions for
    paid = server.counters.total
    # --no-cache: no shared cache, yet the folder's own record means --resume pays nothing twice
    result = cli("evaluate", "--captions", captions, "--config", config, "--out", out, "--suite",
                 "captionqa,caparena", "--no-cache", "--no-progress", "--resume")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert server.counters.total == paid + 6  # only the 6 battles that failed before


def test_an_evaluation_that_scored_nothing_does_not_block_the_next_run(tmp_path, world):
    server, _, captions, config, _ = world
    out = tmp_path / "eval"
    wrong = tmp_path / "wrong-keys.json"  # keys that name no image of the benchmark: nothing scored
    wrong.write_text(json.dumps({"iiw_901.jpg": "A red door.", "iiw_902.jpg": "A car."}))
    args = ["evaluate", "--config", config, "--out", out, "--suite", "bcapscore", "--no-progress"]
    first = cli(*args, "--captions", wrong)
    assert first.exit_code == 1 and read_eval(out)["results"]["bcapscore"]["n_scored"] == 0
    assert "2 without a caption (first: 'iiw_001.jpg')" in first.output  # the key the captions lacked
    again = cli(*args, "--captions", captions)  # the fixed captions, no flag: continued, not refused
    assert again.exit_code == 0, again.output
    assert f"continuing the evaluation in {out}, which scored nothing" in " ".join(again.output.split())
    assert read_eval(out)["headline"]["bcapscore"] == pytest.approx(100 * (B1 + B2) / 2)
    refused = cli(*args, "--captions", captions)  # now it holds scores: protected as before
    assert refused.exit_code == 2 and "pass --resume" in " ".join(refused.output.split())


def test_the_evaluate_package_names_each_public_object_from_its_module_on_first_use():
    import importlib

    import balcaprl.evaluate as package

    assert sorted(package.__all__) == sorted(package._HOMES) and set(package.__all__) <= set(dir(package))
    for name, home in package._HOMES.items():
        assert getattr(package, name) is getattr(importlib.import_module(f"balcaprl.evaluate.{home}"), name)
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        package.nothing  # noqa: B018
