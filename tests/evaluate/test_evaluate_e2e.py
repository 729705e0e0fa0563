"""caption -> evaluate -> report, end to end and for real, on the synthetic world: the tiny policy
captions the held-out images, the oracle judge (b-CapScore) and the oracle-backed protocol judge
(DCScore, CaptionQA, CapArena) score them over the loopback server, and the report compares the
policy with a "model" whose captions are the references themselves."""

from __future__ import annotations

import json

from evaluate_testkit import write_judge_yaml
from typer.testing import CliRunner

from balcaprl.cli import app
from balcaprl.data.format import read_split_rows
from balcaprl.evaluate.suite import read_eval
from balcaprl.testing.oracle_protocols import OracleProtocols, write_synthetic_benchmarks


def test_caption_evaluate_report(tmp_path, eval_server):
    from balcaprl.synthetic.build import build_dataset
    from balcaprl.synthetic.oracle import OracleJudge
    from balcaprl.synthetic.policy import create_policy

    dataset = build_dataset(tmp_path / "ds", n_train=1, n_eval=4, seed=7)
    policy = create_policy(tmp_path / "policy", seed=0)
    bench = write_synthetic_benchmarks(dataset, tmp_path)
    oracle = OracleJudge.from_dataset(dataset)
    handler = OracleProtocols.from_dataset(oracle, dataset)
    server = eval_server(handler, judge=oracle)
    judge = write_judge_yaml(tmp_path / "judge.yaml", server.base_url)

    def run(*args):
        result = CliRunner(env={"COLUMNS": "120"}).invoke(app, [str(a) for a in args])
        assert result.exit_code == 0, result.output
        return result.output

    # 1. caption: the tiny policy on the dataset's held-out split (keys: the images' paths in the dataset)
    run("caption", "--model", policy, "--images", dataset, "--out", tmp_path / "tiny" / "captions.jsonl",
        "--max-new-tokens", 24, "--batch-size", 5, "--no-progress")  # fmt: skip
    captions = json.loads((tmp_path / "tiny" / "captions.json").read_text())
    references = {r["image"]: r["reference"] for r in read_split_rows(dataset, "eval")}
    assert set(captions) == set(references)  # the 4 held-out images, keyed as the benchmark files key them
    (tmp_path / "refs").mkdir()
    (tmp_path / "refs" / "captions.json").write_text(json.dumps(references))

    # 2. evaluate both "models" with the whole suite
    common = ["--judge", judge, "--decapbench", bench["decapbench"], "--decapbench-images", dataset,
              "--captionqa", bench["captionqa"], "--caparena", bench["caparena"], "--caparena-images",
              dataset, "--no-progress"]  # fmt: skip
    run("evaluate", "--captions", tmp_path / "tiny" / "captions.jsonl", "--out", tmp_path / "tiny" / "eval",
        "--label", "tiny-policy", *common)  # fmt: skip
    run("evaluate", "--captions", tmp_path / "refs" / "captions.json", "--out", tmp_path / "refs" / "eval",
        "--label", "references", *common)  # fmt: skip
    tiny, refs = read_eval(tmp_path / "tiny" / "eval"), read_eval(tmp_path / "refs" / "eval")
    for record in (tiny, refs):
        assert all(
            record["results"][p]["complete"] for p in ("bcapscore", "dcscore", "captionqa", "caparena")
        )
    t, r = tiny["headline"], refs["headline"]
    assert r["captionqa"] == 100.0  # the reference names every shape that is there, and none that is not
    assert r["dcscore"] > 90 and r["bcapscore"] > 50 and r["caparena"] > 0
    for key in ("dcscore", "bcapscore", "captionqa", "caparena"):
        assert r[key] > t[key], key
    assert r["arena_length"] == sum(len(c.split(" ")) for c in references.values()) / 4
    assert handler.calls["dcscore_verify"] > 0 and server.counters.by_kind["verdict"] == 8

    # 3. report: Table 1's form against the tiny policy, with the paper's 3B rows for reference
    output = run("report", tmp_path / "tiny", tmp_path / "refs", "--baseline", "tiny-policy", "--published",
                 "qwen2.5-vl-3b", "--out", tmp_path / "report")  # fmt: skip
    assert "| **tiny-policy** |" in output and "| references |" in output
    line = next(x for x in output.splitlines() if x.startswith("| references |"))
    assert f"+{r['dcscore'] - t['dcscore']:.1f}" in line and f"+{r['bcapscore'] - t['bcapscore']:.1f}" in line
    assert (tmp_path / "report" / "report.png").stat().st_size > 10_000
