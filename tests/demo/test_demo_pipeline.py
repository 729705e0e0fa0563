"""`balcaprl demo` end to end at toy size: dataset, SFT, RL through the HTTP judge client against the
oracle server, held-out evaluation, report; then a reuse run and a two-variant sweep on the same folder."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from balcaprl.cli import app
from balcaprl.demo.config import DemoConfig, demo_recipe, load_demo_config
from balcaprl.demo.variants import VARIANTS, parse_variants
from balcaprl.errors import ConfigError, UserError
from balcaprl.synthetic.oracle import OracleJudge
from balcaprl.testing.toy_demo import write_toy_demo_config
from balcaprl.train.metrics import read_jsonl

REPO = Path(__file__).resolve().parents[2]


def run_cli(*args: str):
    result = CliRunner().invoke(app, ["demo", *args], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result.output


@pytest.fixture(scope="module")
def toy_config(tmp_path_factory) -> Path:
    return write_toy_demo_config(tmp_path_factory.mktemp("demo-config") / "toy.yaml")


@pytest.fixture(scope="module")
def demo_run(toy_config, tmp_path_factory):
    out = tmp_path_factory.mktemp("demo-run")
    output = run_cli("--config", str(toy_config), "--out", str(out))
    return out, output


def test_demo_writes_its_run_folder(demo_run):
    out, output = demo_run
    metrics = [m for m in read_jsonl(out / "rl" / "full" / "metrics.jsonl") if m["kind"] == "step"]
    assert [m["step"] for m in metrics] == [1, 2, 3]
    for key in (
        "rewards/precision/mean",
        "rewards/recall/mean",
        "rewards/linguistic/mean",
        "length/caption_tokens_mean",
    ):
        # 2 updates per batch of rollouts: steps 1-2 share one batch, step 3 starts the next; each batch's
        # rewards are logged with its steps
        assert sum(m.get(key) is not None for m in metrics) >= 2, key
    judged = [m["judge/failures"] for m in metrics if "judge/failures" in m]
    assert judged and all(f == 0 for f in judged)  # the oracle knows every training image
    assert (out / "rl" / "full" / "rollouts.jsonl").stat().st_size > 0
    png = out / "training_curves.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert (out / "sft" / "model.safetensors").is_file() and (
        out / "rl" / "full" / "final" / "config.json"
    ).is_file()

    summary = json.loads((out / "summary.json").read_text())
    assert summary["judge_transport"] == "http" and summary["held_out_scenes"] == 6
    for key in ("b_capscore", "precision", "recall", "linguistic", "mean_tokens"):
        assert 0 <= summary["before"][key] <= (100 if key == "b_capscore" else 1000)
    full = summary["variants"]["full"]
    assert full["steps"] == 3 and set(full["reward_changes"]) == {"precision", "recall", "linguistic"}
    change = full["b_capscore_change"]
    assert change["low"] <= change["delta"] <= change["high"]
    assert change["delta"] == pytest.approx(
        full["after"]["b_capscore"] - summary["before"]["b_capscore"], abs=1e-6
    )
    assert set(summary["timings_s"]) >= {"dataset", "sft", "eval_before", "rl/full", "eval/full"}
    assert set(summary["cpu_timings_s"]) == set(summary["timings_s"])

    samples = (out / "samples.md").read_text()
    assert samples.count("**SFT (before RL)**") == 2 and samples.count("**full (after RL)**") == 2

    # the printed table
    for label in ("precision", "recall", "linguistic", "b-CapScore (x100)", "mean length (tok.)"):
        assert label in output
    assert "before (SFT)" in output and "after RL (full)" in output and "paired bootstrap 95% CI" in output
    assert "judge server at http://127.0.0.1:" in output
    # Off a terminal (as here) the long stages report in plain lines: started, (every 30 s), done.
    lines = output.splitlines()
    assert "sft: started, 6 steps" in lines
    assert any(line.startswith("sft: done, 6/6 steps in ") and "; loss " in line for line in lines)
    for label in ("SFT", "full"):
        assert f"eval ({label}): started, 6 captions" in lines
        assert any(line.startswith(f"eval ({label}): done, 6/6 captions in ") for line in lines)


def test_a_second_run_reuses_every_stage(demo_run, toy_config):
    out, _ = demo_run
    before = json.loads((out / "summary.json").read_text())
    output = run_cli("--config", str(toy_config), "--out", str(out))
    for stage in ("dataset: reusing", "sft: reusing", "rl: reusing", "eval: reusing"):
        assert stage in output
    after = json.loads((out / "summary.json").read_text())
    assert after["variants"]["full"]["after"] == before["variants"]["full"]["after"]


def test_changed_settings_are_refused_not_reused(demo_run, toy_config):
    out, _ = demo_run
    result = CliRunner().invoke(
        app,
        ["demo", "--config", str(toy_config), "--out", str(out), "--set", "sft.steps=7"],
        env={"COLUMNS": "160"},
    )
    assert result.exit_code == 2
    message = " ".join(result.output.split())  # the same words whatever the console width
    assert "made with other settings" in message and "steps: 6 -> 7" in message


def test_variant_sweep_shares_the_start_and_writes_a_comparison(demo_run, toy_config):
    """A shorter run (--steps) reports in steps-N/: the finished run's results at the top stay as they
    were, and only what this run wrote is announced."""
    out, _ = demo_run
    finished = {
        name: (out / name).read_bytes() for name in ("summary.json", "samples.md", "training_curves.png")
    }
    output = run_cli(
        "--config", str(toy_config), "--out", str(out), "--variants", "no-length,grpo", "--steps", "1",
        "--judge", "in-process",
    )  # fmt: skip
    assert "sft: reusing" in output and "judge: the oracle, in process" in output
    for name in ("no-length-1steps", "grpo-1steps"):
        assert len([m for m in read_jsonl(out / "rl" / name / "metrics.jsonl") if m["kind"] == "step"]) == 1
    recipe = yaml.safe_load((out / "rl" / "grpo-1steps" / "recipe.yaml").read_text())
    assert recipe["advantage"]["estimator"] == "grpo" and recipe["train"]["max_steps"] == 1
    report = out / "steps-1"
    rows = list(csv.DictReader((report / "comparison.csv").open()))
    assert [r["variant"] for r in rows] == ["SFT start", "no-length", "grpo"]
    assert rows[0]["b_capscore"] == rows[0]["b_capscore"]  # the shared starting point, written once
    md = (report / "comparison.md").read_text()
    assert "| no-length |" in md and "| grpo |" in md
    assert "balcaprl demo — variants" in output
    assert {name: (out / name).read_bytes() for name in finished} == finished
    assert sorted(p.name for p in report.iterdir()) == [
        "comparison.csv",
        "comparison.md",
        "samples.md",
        "summary.json",
    ]
    assert "](../data/images/" in (report / "samples.md").read_text()  # links still reach the images
    text = " ".join(output.split())
    assert f"report: {report} (summary.json, samples.md, comparison.md, comparison.csv)" in text
    assert f"{out / 'training_curves.png'}" not in text  # several variants: no top-level curves announced


def test_the_shipped_config_adds_nothing_and_its_examples_are_valid_settings():
    """configs/demo.yaml is no second copy of the defaults: it loads to exactly the built-in settings,
    and each example its comments show (one YAML mapping per line) is a setting the demo accepts."""
    path = REPO / "configs" / "demo.yaml"
    assert load_demo_config(path) == DemoConfig()
    examples = [
        line.lstrip("#").split("  #")[0].strip()
        for line in path.read_text().splitlines()
        if line.startswith("#   ") and ": {" in line
    ]
    assert len(examples) == 3
    for example in examples:
        changed = load_demo_config(None, [f"{key}={value}" for key, value in _flat(yaml.safe_load(example))])
        assert changed != DemoConfig()
    # the RL defaults are the demo recipe's, declared once (demo_recipe), over the paper's recipe
    assert DemoConfig().recipe == demo_recipe()
    recipe = DemoConfig().training_recipe("p", "d", "o")
    assert recipe.rewards.weights.as_list() == [0.3, 0.3, 0.3] and recipe.train.max_steps == 200
    assert (recipe.rewards.length.mode, recipe.rewards.length.tau_low, recipe.rewards.length.tau_high) == (
        "mask",
        0.5,
        2.0,
    )
    assert (recipe.model.path, recipe.data.path, recipe.run.output_dir, recipe.judge) == ("p", "d", "o", None)


def _flat(data, prefix=""):
    for key, value in data.items():
        if isinstance(value, dict):
            yield from _flat(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def test_the_ablation_runner_trains_each_variant_per_seed_and_checks_the_papers_directions(
    demo_run, toy_config
):
    out, _ = demo_run
    output = run_cli(
        "--config", str(toy_config), "--out", str(out), "--variants", "full,no-length", "--seeds", "2",
        "--steps", "1", "--judge", "in-process",
    )  # fmt: skip
    assert "sft: reusing" in output and "4 runs (2 variants x 2 seeds)" in output
    assert "(1/4, trained in" in output and "min left)" in output  # the time left after the first run
    for name in (
        "full-1steps-seed0",
        "full-1steps-seed1",
        "no-length-1steps-seed0",
        "no-length-1steps-seed1",
    ):
        assert (out / "rl" / name / "final" / "config.json").is_file(), name
        assert (out / "eval" / f"{name}.json").is_file(), name
        assert yaml.safe_load((out / "rl" / name / "recipe.yaml").read_text())["train"]["seed"] == int(
            name[-1]
        )
    rows = list(csv.DictReader((out / "comparison.csv").open()))
    assert [(r["variant"], r["seeds"]) for r in rows] == [("full", "2"), ("no-length", "2")]
    for row in rows:
        assert (
            float(row["b_capscore_low"]) <= float(row["b_capscore_change"]) <= float(row["b_capscore_high"])
        )
    # each claim of each row, with one of the three verdicts
    assert rows[1]["claims"].startswith("b_capscore < start: ")
    verdicts = [c.split(": ")[1] for r in rows for c in r["claims"].split("; ")]
    assert len(verdicts) == 4 + 4 and set(verdicts) <= {"reproduced", "not reproduced", "opposite"}
    md = (out / "comparison.md").read_text()
    assert "| no-length | Table 4 'w/o length penalty' |" in md and "paper's direction" in md
    # run again: every run is reused, and the log says so instead of estimating time for them
    again = run_cli(
        "--config", str(toy_config), "--out", str(out), "--variants", "full,no-length", "--seeds", "2",
        "--steps", "1", "--judge", "in-process", "--jobs", "1",
    )  # fmt: skip
    assert "4 runs (2 variants x 2 seeds), 1 at a time; 4 finished before, reused" in again
    assert "min left" not in again
    tables = lambda text: text.split("Changes are")[0]  # noqa: E731  (the last line gives the wall time)
    assert tables((out / "comparison.md").read_text()) == tables(md)
    # a run stopped early is summarised over the seeds every variant finished
    from balcaprl.demo.ablation import comparison_so_far

    (out / "eval" / "no-length-1steps-seed1.json").unlink()
    variants = parse_variants("full,no-length")
    result = comparison_so_far(load_demo_config(toy_config, [f"output_dir={out}"]), variants, steps=1)
    assert [s.seeds for s in result.variants] == [1, 1]
    assert "averaged over 1 seed(s)" in (out / "comparison.md").read_text()
    (out / "eval" / "full-1steps-seed0.json").unlink()
    with pytest.raises(UserError, match="no seed has finished for every one of full, no-length"):
        comparison_so_far(load_demo_config(toy_config, [f"output_dir={out}"]), variants, steps=1)


def test_config_errors_name_the_key(tmp_path):
    with pytest.raises(ConfigError, match="sft.stepz: unknown key"):
        load_demo_config(None, ["sft.stepz=3"])
    with pytest.raises(ConfigError, match="recipe.train.learning_rat"):
        load_demo_config(None, ["recipe.train.learning_rat=1"])
    with pytest.raises(ConfigError, match="set by the demo"):
        load_demo_config(None, ["recipe.model.path=x"])
    with pytest.raises(ConfigError, match=r"recipe: run\.output_dir is set by the demo"):
        load_demo_config(None, ["recipe.run.output_dir=x"])
    with pytest.raises(ConfigError, match=r"recipe: run\.save_steps \(3\) must be a multiple"):
        load_demo_config(None, ["recipe.run.save_steps=3", "recipe.train.updates_per_batch=2"])
    with pytest.raises(ConfigError, match=r"recipe\.rewards\.length\.tau_hihg: unknown key"):
        DemoConfig().training_recipe("p", "d", "o", ["rewards.length.tau_hihg=3"])  # a variant's override
    bad = tmp_path / "bad.yaml"
    bad.write_text("recipe: {rollout: {temprature: 1}}\n")
    with pytest.raises(ConfigError, match=rf"invalid demo config \({bad}\):\s+recipe\.rollout\.temprature"):
        load_demo_config(bad)
    with pytest.raises(ConfigError, match="evaluation.scenes"):
        load_demo_config(None, ["evaluation.scenes=5000"])
    with pytest.raises(ConfigError, match=r"dataset: .*kinds must be distinct.*'blob'"):
        load_demo_config(None, ["dataset.kinds=[circle, blob]"])


def test_variants_are_one_override_each():
    assert list(VARIANTS) == [
        "full", "grpo", "no-precision", "no-recall", "no-linguistic", "no-pointability", "no-length", "linear-length",
        "no-recap", "prec-0.1", "prec-0.2", "prec-0.4", "tau-0-3", "tau-0.5-1", "tau-0.5-3", "tau-0.5-4",
        "tau-0.5-5", "tau-0.5-6",
    ]  # fmt: skip
    config = DemoConfig()
    for variant in VARIANTS.values():  # one change each; Table 4's tau_l = 0 row moves both bounds
        assert len(variant.overrides) == {"full": 0, "tau-0-3": 2}.get(variant.name, 1)
        config.training_recipe("p", "d", "o", variant.overrides)  # every variant is a valid recipe
    assert [v.name for v in parse_variants("all")] == list(VARIANTS)
    assert [v.name for v in parse_variants("ablation")] == list(VARIANTS)
    # the weight table's rows are Table 3's where they coincide: w_prec 0 is no-precision, 0.3 is full
    weights = [config.training_recipe("p", "d", "o", v.overrides).rewards.weights.precision for v in
               parse_variants("weights")]  # fmt: skip
    assert weights == [0.0, 0.1, 0.2, 0.3, 0.4]
    assert config.training_recipe("p", "d", "o", VARIANTS["no-recap"].overrides).data.reference == (
        "reference_original"
    )
    # Table 4's grid: the band each tau variant trains with (0.5 / 2 is full's)
    bands = {
        v.name: (lambda r: (r.rewards.length.tau_low, r.rewards.length.tau_high))(
            config.training_recipe("p", "d", "o", v.overrides)
        )
        for v in parse_variants("tau")
    }
    assert bands == {
        "full": (0.5, 2.0), "tau-0-3": (0.0, 3.0), "tau-0.5-1": (0.5, 1.0), "tau-0.5-3": (0.5, 3.0),
        "tau-0.5-4": (0.5, 4.0), "tau-0.5-5": (0.5, 5.0), "tau-0.5-6": (0.5, 6.0),
    }  # fmt: skip
    for variant in VARIANTS.values():  # every claim names a figure the evaluation records per scene
        for claim in variant.claims:
            assert claim.metric in {
                "b_capscore",
                "precision",
                "recall",
                "linguistic",
                "tokens",
                "non_pointable_share",
            }
            assert claim.baseline == "start" or claim.baseline in VARIANTS, claim
            assert claim.basis, claim
    with pytest.raises(ValueError, match="unknown variant"):
        parse_variants("full,nope")


class CountingOracle(OracleJudge):
    """The oracle, counting the captions it judges."""

    judged = 0

    def judge(self, request):
        type(self).judged += 1
        return super().judge(request)


def test_each_held_out_caption_is_judged_once(demo_run, toy_config):
    from balcaprl.demo.pipeline import evaluate_heldout
    from balcaprl.rewards import b_capscore

    out, _ = demo_run
    config = load_demo_config(toy_config, [f"output_dir={out}"])
    CountingOracle.judged = 0
    oracle = CountingOracle.from_dataset(out / "data")
    evaluation = evaluate_heldout(out / "sft", out / "data", config, "SFT", oracle)
    assert CountingOracle.judged == config.evaluation.scenes == len(evaluation.records) == 6
    # every figure comes from that one judgement: per scene and in the headline
    for record in evaluation.records:
        assert record["b_capscore"] == pytest.approx(
            float(b_capscore(record["precision"], record["recall"], record["linguistic"]))
        )
    per_scene = [r["b_capscore"] for r in evaluation.records]
    assert evaluation.held_out.b_capscore == pytest.approx(100 * sum(per_scene) / len(per_scene))
    assert evaluation.held_out.precision == pytest.approx(sum(r["precision"] for r in evaluation.records) / 6)
