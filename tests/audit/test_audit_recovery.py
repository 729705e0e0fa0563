"""The audit on the synthetic world: the oracle behind a known rate of flipped flags.

In process (fast): on 1,000 captions the audit recovers a flip rate of 0.1 within +-0.02 for every
flag, kappa between the exact and the flipped judge falls as the rate rises and matches what
independent flips predict, and the flipping judge's test-retest noise is not zero. Over HTTP once:
`balcaprl judge serve --oracle DIR --flip-rate 0.1` in a subprocess and `balcaprl judge audit`
against it, with the table on stdout and the JSON file.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from balcaprl.cli import app
from balcaprl.judge import Judgement, JudgeRequest
from balcaprl.judge.audit import FLAGS, judge_names, read_audit_items, run_audit
from balcaprl.synthetic.oracle import OracleJudge
from balcaprl.testing.caption_fixture import CAPTION_KINDS, synthetic_captions, write_caption_jsonl
from balcaprl.testing.flipping_judge import FlippingJudge


class Memo:
    """The oracle's verdicts, each computed once (it is deterministic): keeps the test fast."""

    def __init__(self, judge):
        self.judge, self.memo = judge, {}

    async def judge_batch(self, requests):
        missing = [r for r in dict.fromkeys(requests) if r not in self.memo]
        for request, outcome in zip(missing, await self.judge.judge_batch(missing), strict=True):
            self.memo[request] = outcome
        return [self.memo[r] for r in requests]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from balcaprl.synthetic.build import build_dataset

    tmp = tmp_path_factory.mktemp("audit")
    dataset = build_dataset(tmp / "ds", n_train=100, n_eval=1, seed=2, image_size=64)
    kinds = (*CAPTION_KINDS, "good", "hallucination", "meta")  # 10 captions per image
    captions = write_caption_jsonl(synthetic_captions(dataset, kinds), tmp / "captions.jsonl")
    return dataset, captions, Memo(OracleJudge.from_dataset(dataset))


def by(report, kind, y):
    return next(c for c in report["comparisons"] if c["kind"] == kind and c["y"] == y)


def test_flipping_judge_flips_at_its_rate_and_anew_on_each_call(world):
    dataset, captions, oracle = world
    item = read_audit_items(dataset, captions, sample=1)[0]
    request = JudgeRequest(item.image, item.caption, item.reference)
    import asyncio

    (exact,) = asyncio.run(oracle.judge_batch([request]))
    (same,) = asyncio.run(FlippingJudge(oracle, 0.0).judge_batch([request]))
    assert same.verdict == exact.verdict
    (inverted,) = asyncio.run(FlippingJudge(oracle, 1.0).judge_batch([request]))
    for a, b in zip(exact.verdict.caption_assertions, inverted.verdict.caption_assertions, strict=True):
        assert (b.text, b.pointable, b.visible) == (a.text, not a.pointable, not a.visible)
    assert [not r.covered for r in exact.verdict.reference_assertions] == [
        r.covered for r in inverted.verdict.reference_assertions
    ]
    assert inverted.verdict.fluency == exact.verdict.fluency
    one, other = FlippingJudge(oracle, 0.5, seed=3), FlippingJudge(oracle, 0.5, seed=3)
    first = [asyncio.run(one.judge_batch([request]))[0].verdict for _ in range(3)]
    assert [asyncio.run(other.judge_batch([request]))[0].verdict for _ in range(3)] == first  # seeded
    assert len({v.model_dump_json() for v in first}) > 1  # but a new draw on every call
    with pytest.raises(ValueError, match="flip rate"):
        FlippingJudge(oracle, 1.5)


def test_the_audit_recovers_the_flip_rate_and_kappa_falls_with_it(world):
    dataset, captions, oracle = world
    items = read_audit_items(dataset, captions, sample=1000, seed=0)
    assert len(items) == 1000
    kappas = []
    for rate in (0.0, 0.05, 0.1, 0.2, 0.3):
        report = run_audit(
            items,
            [("exact", lambda: oracle), ("flipped", lambda r=rate: FlippingJudge(oracle, r, seed=1))],
            reference=("oracle", lambda: oracle),
        )
        errors = by(report, "reference", "flipped")["errors"]
        exact_errors = by(report, "reference", "exact")["errors"]
        pair = by(report, "judges", "flipped")
        for flag in FLAGS:
            assert exact_errors[flag]["error_rate"] == 0.0
            assert errors[flag]["pairs"] > 3000
            assert errors[flag]["error_rate"] == pytest.approx(rate, abs=0.02), (rate, flag)
            # independent flips at rate p: p_o = 1 - p, and p_e from the two raters' positive rates
            f = pair["flags"][flag]
            truth = f["x_true_rate"]
            flipped = truth * (1 - rate) + (1 - truth) * rate
            chance = truth * flipped + (1 - truth) * (1 - flipped)
            assert f["kappa"] == pytest.approx((1 - rate - chance) / (1 - chance), abs=0.05)
        assert pair["unpaired"] == {"caption": {"x": 0, "y": 0}, "reference": {"x": 0, "y": 0}}
        kappas.append([pair["flags"][flag]["kappa"] for flag in FLAGS])
        if rate == 0.0:
            assert pair["scores"]["b_capscore"]["mean_abs_diff"] == 0 and pair["rank"]["kendall_tau_b"] == 1
    for flag_index in range(len(FLAGS)):
        column = [k[flag_index] for k in kappas]
        assert column[0] == 1.0 and all(a > b for a, b in zip(column, column[1:], strict=False)), column


def test_one_judge_twice_measures_its_noise(world):
    dataset, captions, oracle = world
    items = read_audit_items(dataset, captions, sample=300, seed=1)
    exact = run_audit(items, [("oracle", lambda: oracle)])  # one judge: retest by default
    noisy = run_audit(items, [("flipped", lambda j=FlippingJudge(oracle, 0.1, seed=5): j)])
    assert exact["retest"] and [r["repeat"] for r in exact["runs"]] == [1, 2]
    for name in ("precision", "recall", "b_capscore"):
        assert by(exact, "retest", "oracle")["scores"][name]["noise_sd"] == 0.0
        assert by(noisy, "retest", "flipped")["scores"][name]["noise_sd"] > 0.01
    assert by(exact, "retest", "oracle")["scores"]["linguistic"]["changed_share"] == 0.0
    assert len(exact["per_item"]) == 300 and set(exact["per_item"][0]["runs"]) == {"oracle#1", "oracle#2"}


def test_failures_are_counted_by_reason_and_left_out(world):
    dataset, captions, oracle = world
    items = read_audit_items(dataset, captions, sample=50, seed=2)

    class Failing:
        async def judge_batch(self, requests):
            from balcaprl.judge import JudgeFailure

            outcomes = await oracle.judge_batch(requests)
            return [JudgeFailure("timeout", "slow") if i % 5 == 0 else o for i, o in enumerate(outcomes)]

    report = run_audit(items, [("oracle", lambda: oracle), ("failing", Failing)], retest=False)
    failing = next(r for r in report["runs"] if r["judge"] == "failing")
    assert failing["failures"] == {"timeout": 10} and failing["judged"] == 40 and failing["per_1000"] is None
    assert by(report, "judges", "failing")["both_judged"] == 40
    assert all(isinstance(o, Judgement) for o in [oracle.memo[k] for k in list(oracle.memo)[:3]])


def test_a_caption_that_is_no_valid_unicode_is_a_bad_input_in_every_run_never_sent(tmp_path):
    # A JSON escape can put a lone surrogate into a caption file: that item fails as bad_input in every
    # run (its row says what and where), no judge sees it, and the files are written.
    from balcaprl.judge.audit import AuditItem, write_audit
    from balcaprl.testing.scripted_judge import ScriptedJudge

    class Recording(ScriptedJudge):
        seen: list[str] = []

        async def judge_batch(self, requests):
            self.seen.extend(r.caption for r in requests)
            return await super().judge_batch(requests)

    items = [AuditItem(f"r{i}", f"images/{i}.png", caption, "A red door. A cat.")
             for i, caption in enumerate(["A red door.", "A red \ud800door.", "A cat."])]  # fmt: skip
    progress: list[tuple[str, int, int]] = []
    report = run_audit(items, [("scripted", Recording)], on_progress=lambda *a: progress.append(a))
    assert [r["failures"] for r in report["runs"]] == [{"bad_input": 1}] * 2  # both runs of the retest
    assert all(r["judged"] == 2 for r in report["runs"]) and len(progress) == 6
    assert Recording.seen == ["A red door.", "A cat."] * 2
    refused = report["per_item"][1]["runs"]
    assert (
        refused["scripted#1"]
        == refused["scripted#2"]
        == {
            "failure": "bad_input",
            "detail": "the caption of row 'r1' is not valid Unicode: a lone surrogate U+D800 at character 7",
        }
    )
    _, items_path = write_audit(report, tmp_path / "audit")
    assert json.loads(items_path.read_text().splitlines()[1])["caption"] == "A red \ud800door."


def test_audit_items_match_captions_to_dataset_rows_and_name_the_unknown(world, tmp_path):
    dataset, captions, _ = world
    rows = [json.loads(line) for line in captions.read_text().splitlines()]
    by_id = tmp_path / "by_id.json"
    by_id.write_text(json.dumps({"shapes-000001": rows[10]["caption"]}))
    (item,) = read_audit_items(dataset, by_id)
    assert item.key == "shapes-000001" and item.caption == rows[10]["caption"]
    absolute = tmp_path / "absolute.jsonl"
    absolute.write_text(json.dumps({"image": str(dataset / rows[0]["image"]), "caption": "x"}) + "\n")
    assert read_audit_items(dataset, absolute)[0].key == "shapes-000000"
    unknown = tmp_path / "unknown.jsonl"
    unknown.write_text(json.dumps({"image": "images/nope.png", "caption": "x"}) + "\n")
    from balcaprl.errors import InputError

    with pytest.raises(InputError, match=r"1 caption\(s\) name no row .*'images/nope.png'"):
        read_audit_items(dataset, unknown)
    a = read_audit_items(dataset, captions, sample=20, seed=7)
    assert (
        a
        == read_audit_items(dataset, captions, sample=20, seed=7)
        != read_audit_items(dataset, captions, sample=20, seed=8)
    )


@pytest.fixture(scope="module")
def flipping_server(world):
    dataset = world[0]
    process = subprocess.Popen(
        [sys.executable, "-m", "balcaprl.cli", "judge", "serve", "--port", "0", "--oracle", str(dataset),
         "--flip-rate", "0.1", "--flip-seed", "4"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    line = process.stdout.readline()
    assert line.startswith("balcaprl judge server: http://127.0.0.1:"), line
    yield line.split()[-1]
    process.terminate()
    process.wait(timeout=10)
    process.stdout.close()


def test_the_command_audits_a_judge_over_http(world, flipping_server, tmp_path, monkeypatch):
    dataset, captions, _ = world
    monkeypatch.chdir(dataset.parent)  # relative paths, as a user types them
    dataset = type(dataset)(dataset.name)
    config = tmp_path / "flipped.yaml"
    config.write_text(
        f"base_url: {flipping_server}\nmodel: oracle-flipped\napi_key_env: null\nmax_retries: 0\n"
        "price_per_million_tokens: {prompt: 0.15, completion: 0.6}\n"
    )
    args = ["judge", "audit", "--data", str(dataset), "--captions", str(captions), "--judge", str(config),
            "--sample", "300", "--out", str(tmp_path / "audit")]  # fmt: skip
    result = CliRunner().invoke(app, args, env={"COLUMNS": "100"})
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    for words in (
        "flag errors against the reference judge (oracle)",
        "flipped twice",
        "Kendall tau-b",
        "kappa",
    ):
        assert words in text
    report = json.loads((tmp_path / "audit" / "audit.json").read_text())
    assert report["settings"]["cache"] == "off" and report["reference"] == "oracle" and report["retest"]
    errors = by(report, "reference", "flipped")["errors"]
    for flag in FLAGS:
        assert errors[flag]["error_rate"] == pytest.approx(0.1, abs=0.04)  # ~1,500 flags each
    assert by(report, "retest", "flipped")["scores"]["precision"]["noise_sd"] > 0
    runs = {(r["judge"], r["repeat"]): r for r in report["runs"]}
    assert set(runs) == {("oracle", 1), ("flipped", 1), ("flipped", 2)}
    per = runs[("flipped", 1)]["per_1000"]
    assert per["calls"] == pytest.approx(1000) and per["prompt_tokens"] > 0 and per["cost_usd"] > 0
    assert runs[("flipped", 1)]["failures"] == {} and runs[("oracle", 1)]["per_1000"] is None
    assert len((tmp_path / "audit" / "items.jsonl").read_text().splitlines()) == 300
    # one b-CapScore scale everywhere: the table prints means x100 with one decimal (audit.json keeps [0, 1])
    mean = by(report, "reference", "flipped")["scores"]["b_capscore"]["mean_x"]
    assert 0 < mean < 1 and "means, diffs and noise x100" in text and f" {100 * mean:.1f} " in text


def test_an_earlier_audit_is_refused_before_any_call_then_replaced_with_overwrite(
    world, flipping_server, tmp_path
):
    dataset, captions, _ = world
    config = tmp_path / "flipped.yaml"
    config.write_text(
        f"base_url: {flipping_server}\nmodel: oracle-flipped\napi_key_env: null\nmax_retries: 0\n"
    )
    out = tmp_path / "audit"
    args = ["judge", "audit", "--data", str(dataset), "--captions", str(captions), "--judge", str(config),
            "--out", str(out), "--no-retest"]  # fmt: skip
    assert CliRunner().invoke(app, [*args, "--sample", "20"]).exit_code == 0
    (out / "notes.txt").write_text("stale")
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    dead = tmp_path / "dead.yaml"  # a refusal must come before any call: this judge cannot answer
    dead.write_text("base_url: http://127.0.0.1:9/v1\napi_key_env: null\nmax_retries: 0\n")
    refused = CliRunner().invoke(app, [*args[:7], str(dead), *args[8:], "--sample", "10"])
    assert refused.exit_code == 2
    assert " ".join(refused.output.split()) == (
        f"error: --out {out} already holds results (audit.json, items.jsonl); pass --overwrite to replace "
        "them, or choose another place"
    )
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before

    replaced = CliRunner().invoke(app, [*args, "--sample", "10", "--overwrite"])
    assert replaced.exit_code == 0, replaced.output
    assert f"wrote {out / 'audit.json'}" in replaced.output
    assert json.loads((out / "audit.json").read_text())["settings"]["sample"] == 10
    assert len((out / "items.jsonl").read_text().splitlines()) == 10
    assert sorted(p.name for p in out.iterdir()) == ["audit.json", "items.jsonl"]  # no stale file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["audit", "dead.yaml", "flipped.yaml"]


def test_a_judge_config_named_like_the_reference_judge_is_audited_under_its_file_name(
    world, flipping_server, tmp_path
):
    dataset, captions, _ = world
    config = tmp_path / "oracle.yaml"  # the obvious name for the oracle server's config
    config.write_text(f"base_url: {flipping_server}\nmodel: oracle\napi_key_env: null\nmax_retries: 0\n")
    args = ["judge", "audit", "--data", str(dataset), "--captions", str(captions), "--judge", str(config),
            "--sample", "20", "--out", str(tmp_path / "audit")]  # fmt: skip
    result = CliRunner().invoke(app, args, env={"COLUMNS": "100"})
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "audit" / "audit.json").read_text())
    assert report["reference"] == "oracle" and report["judges"] == ["oracle.yaml"]
    assert [(r["judge"], r["repeat"], r["judged"]) for r in report["runs"]] == [
        ("oracle", 1, 20),
        ("oracle.yaml", 1, 20),
        ("oracle.yaml", 2, 20),
    ]
    assert "flag errors against the reference judge (oracle)" in " ".join(result.output.split())


@pytest.mark.parametrize(
    ("configs", "taken", "names"),
    [
        (["configs/gpt.yaml", "local.yaml"], ["oracle"], ["gpt", "local"]),
        (["configs/oracle.yaml"], ["oracle"], ["oracle.yaml"]),
        (["a/judge.yaml", "b/judge.yaml"], [], ["a/judge.yaml", "b/judge.yaml"]),
        (["x/a/judge.yaml", "y/a/judge.yaml"], ["oracle"], ["x/a/judge.yaml", "y/a/judge.yaml"]),
        (["judge.yaml", "judge.yml"], [], ["judge.yaml", "judge.yml"]),
        (["j.yaml", "j.yaml"], [], ["j-1", "j-2"]),  # the same file twice
        (["oracle"], ["oracle"], ["oracle-2"]),  # no suffix, no folder: nothing longer to take
        (["/etc/oracle.yaml", "oracle.yaml"], ["oracle"], ["etc/oracle.yaml", "oracle.yaml"]),
    ],
)
def test_judge_names_are_the_stems_kept_apart(configs, taken, names):
    assert judge_names(configs, taken=taken) == names


@pytest.mark.parametrize(
    ("extra", "message"),
    [(["--rubric", "fancy"], "--rubric fancy: choose training or evaluation"),
     (["--reference", "gpt"], "--reference gpt: choose auto or none")],
)  # fmt: skip
def test_the_command_rejects_bad_options_in_one_line(world, tmp_path, extra, message):
    dataset, captions, _ = world
    config = tmp_path / "j.yaml"
    config.write_text("base_url: http://127.0.0.1:9/v1\napi_key_env: null\n")
    args = ["judge", "audit", "--data", str(dataset), "--captions", str(captions), "--judge", str(config),
            "--out", str(tmp_path / "out"), *extra]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and message in " ".join(result.output.split())


def test_flip_rate_needs_the_oracle():
    result = CliRunner().invoke(app, ["judge", "serve", "--flip-rate", "0.2"])
    assert result.exit_code == 2 and "--flip-rate needs --oracle" in " ".join(result.output.split())


@pytest.mark.parametrize(
    ("yaml", "message"),
    [
        ("modle: x\n", "modle"),
        ("api_key_env: BALCAPRL_TEST_UNSET_KEY\n", "BALCAPRL_TEST_UNSET_KEY is not set"),
    ],
)
def test_a_bad_judge_config_fails_before_any_call(world, tmp_path, monkeypatch, yaml, message):
    dataset, captions, _ = world
    monkeypatch.delenv("BALCAPRL_TEST_UNSET_KEY", raising=False)
    config = tmp_path / "bad.yaml"
    config.write_text(yaml)
    args = ["judge", "audit", "--data", str(dataset), "--captions", str(captions), "--judge", str(config),
            "--out", str(tmp_path / "out")]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and message in " ".join(result.output.split())
    assert not (tmp_path / "out").exists()
