"""`balcaprl synthetic ...` end to end through the real CLI app (thin wrappers, real work)."""

from __future__ import annotations

from typer.testing import CliRunner

from balcaprl.cli import app
from balcaprl.data.format import read_card, read_split_rows

runner = CliRunner(env={"COLUMNS": "100"})


def test_build_then_show(tmp_path):
    out = tmp_path / "ds"
    result = runner.invoke(
        app,
        [
            "synthetic",
            "build",
            "--out",
            str(out),
            "--n-train",
            "3",
            "--n-eval",
            "2",
            "--seed",
            "5",
            "--max-objects",
            "3",
        ],
    )
    assert result.exit_code == 0, result.output
    assert read_card(out)["counts"] == {"train": 3, "eval": 2}
    assert all(len(r["reference"]) > 0 for r in read_split_rows(out, "train"))

    shown = runner.invoke(app, ["synthetic", "show", "--data", str(out), "--index", "1"])
    assert shown.exit_code == 0, shown.output
    assert "b-CapScore 100.0  (x100)" in shown.output and '"pointable": true' in shown.output

    judged = runner.invoke(
        app, ["synthetic", "show", "--data", str(out), "--caption", "The composition feels balanced."]
    )
    assert judged.exit_code == 0, judged.output
    assert "precision 0.0  recall 0.0" in judged.output


def test_bad_arguments_are_reported(tmp_path):
    result = runner.invoke(
        app, ["synthetic", "build", "--out", str(tmp_path / "x"), "--min-objects", "5", "--max-objects", "3"]
    )
    assert result.exit_code != 0
    assert "max_objects" in result.output


def test_sft_command_defaults_match_the_config():
    import inspect

    from balcaprl.cli.synthetic import sft
    from balcaprl.synthetic.sft import SFTConfig

    params = inspect.signature(sft).parameters
    for name in ("steps", "batch_size", "lr", "flawed_fraction", "seed", "eval_limit"):
        assert params[name].default.default == getattr(SFTConfig(), name), name


def test_build_world_demo_writes_the_demos_dataset(tmp_path):
    # The guide builds with --world demo so that its SFT learns where the demo's does: the whole world
    # (2-7 shapes, every kind and colour) left the same 1,500 SFT steps at b-CapScore 10.5, rambling to
    # the cap; the demo's corner starts at 21.4.
    from balcaprl.demo.config import load_demo_config
    from balcaprl.demo.pipeline import ensure_dataset

    counts = ["dataset.n_train=3", "dataset.n_eval=2", "evaluation.scenes=2"]
    demo = ensure_dataset(load_demo_config(None, counts), tmp_path / "demo", log=lambda line: None)
    built = tmp_path / "cli"
    result = runner.invoke(app, ["synthetic", "build", "--world", "demo", "--out", str(built), "--n-train", "3",
                                 "--n-eval", "2", "--no-progress"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert (built / "scenes.jsonl").read_bytes() == (demo / "scenes.jsonl").read_bytes()
    full = runner.invoke(app, ["synthetic", "build", "--out", str(tmp_path / "full"), "--n-train", "3",
                               "--n-eval", "2", "--no-progress"])  # fmt: skip
    assert full.exit_code == 0, full.output
    assert (tmp_path / "full" / "scenes.jsonl").read_bytes() != (demo / "scenes.jsonl").read_bytes()
    wrong = runner.invoke(app, ["synthetic", "build", "--world", "tiny", "--out", str(tmp_path / "x")])
    assert wrong.exit_code == 2 and "--world tiny: choose full or demo" in wrong.output


def test_the_guides_sft_command_trains_the_demos_warm_start(tiny_dataset, tmp_path, monkeypatch):
    # The synthetic-world guide's `balcaprl synthetic sft --data D --out P` and the demo's SFT stage
    # must train the same policy: once the command had its own defaults (800 steps, the vision tower at
    # the language model's rate, 30% flawed targets) and a reader following the guide got a policy
    # scoring 10 where the demo's starts at 21.4.
    import contextlib
    import dataclasses

    import balcaprl.synthetic.sft as sft_module
    from balcaprl.demo.config import load_demo_config
    from balcaprl.demo.pipeline import ensure_sft

    built = []

    def fake_run_sft(data, out, *args, config, **kwargs):
        built.append(config)
        raise SystemExit(0)  # the settings are what is compared: no training

    monkeypatch.setattr(sft_module, "run_sft", fake_run_sft)
    runner.invoke(
        app,
        ["synthetic", "sft", "--data", str(tiny_dataset), "--out", str(tmp_path / "cli"), "--no-progress"],
    )
    with contextlib.suppress(SystemExit):
        ensure_sft(load_demo_config(), tiny_dataset, tmp_path / "demo", log=lambda line: None)
    assert len(built) == 2, built
    command, demo = (dataclasses.replace(c, eval_limit=0) for c in built)  # the demo evaluates apart
    assert command == demo
    assert (demo.steps, demo.vision_lr_scale, demo.flawed_fraction) == (1500, 5.0, 0.5)


class FakeClock:
    """Ten seconds pass between two readings: progress lines without any real waiting."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 10.0
        return self.now


def test_build_reports_progress_in_a_log(tmp_path, monkeypatch):
    import functools

    import balcaprl.synthetic.build as build

    clocked = functools.partial(build.Progress, clock=FakeClock(), heartbeat=False, terminal=False)
    monkeypatch.setattr(build, "Progress", clocked)
    result = runner.invoke(
        app, ["synthetic", "build", "--out", str(tmp_path / "ds"), "--n-train", "5", "--n-eval", "1"]
    )
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("rendering scenes:")]
    # The clock is read at the start (10 s) and twice per scene (20/30, 40/50, ...); a line is due
    # when 30 s have passed since the last one: after scenes 2 (t=50), 4 (t=90) and 6 (t=130), each
    # with the rate of its interval (2 scenes / 40 s) and the ETA at that rate; the last line at 140.
    assert lines == [
        "rendering scenes: started, 6 scenes",
        "rendering scenes: 2/6 scenes (33%), 0.1 scenes/s, elapsed 0:00:40, ETA 0:01:20",
        "rendering scenes: 4/6 scenes (67%), 0.1 scenes/s, elapsed 0:01:20, ETA 0:00:40",
        "rendering scenes: 6/6 scenes (100%), 0.1 scenes/s, elapsed 0:02:00, ETA 0:00:00",
        "rendering scenes: done, 6/6 scenes in 0:02:10 (0.0 scenes/s)",
    ]


def test_build_refuses_a_dataset_then_resumes_or_replaces_it(tmp_path):
    out = tmp_path / "ds"
    build = [
        "synthetic",
        "build",
        "--out",
        str(out),
        "--n-train",
        "3",
        "--n-eval",
        "2",
        "--seed",
        "5",
        "--no-progress",
    ]
    assert runner.invoke(app, build).exit_code == 0
    refused = runner.invoke(app, build)
    assert refused.exit_code == 2 and "already holds results" in refused.output
    resumed = runner.invoke(app, [*build, "--resume"])
    assert resumed.exit_code == 0 and "already holds this dataset" in " ".join(resumed.output.split())
    smaller = ["synthetic", "build", "--out", str(out), "--n-train", "1", "--n-eval", "1", "--no-progress"]
    replaced = runner.invoke(app, [*smaller, "--overwrite"])
    assert replaced.exit_code == 0, replaced.output
    assert read_card(out)["counts"] == {"train": 1, "eval": 1}
    assert len(list((out / "images").iterdir())) == 2  # no stale image of the 5-scene dataset
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]


def test_sft_refuses_a_policy_then_replaces_it_with_overwrite(tiny_dataset, tmp_path):
    import json

    out = tmp_path / "sft"
    sft = ["synthetic", "sft", "--data", str(tiny_dataset), "--out", str(out), "--steps", "1",
           "--batch-size", "2", "--eval-limit", "0", "--no-progress"]  # fmt: skip
    first = runner.invoke(app, sft)
    assert first.exit_code == 0, first.output
    (out / "notes.txt").write_text("stale")
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    refused = runner.invoke(app, [*sft, "--seed", "1"])
    assert refused.exit_code == 2
    assert " ".join(refused.output.split()) == (
        f"error: --out {out} already holds results (config.json, model.safetensors, balcaprl_policy.json, "
        "sft_result.json); pass --overwrite to replace them, or choose another place"
    )
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # not a byte changed

    replaced = runner.invoke(app, [*sft, "--seed", "1", "--overwrite"])
    assert replaced.exit_code == 0, replaced.output
    assert f"saved policy to {out} " in replaced.output
    record = json.loads((out / "sft_result.json").read_text())
    assert record["config"]["seed"] == 1 and record["policy_dir"] == str(out)
    assert "notes.txt" not in {p.name for p in out.iterdir()}  # no stale file of the old folder
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sft"]  # nothing left aside

    # Continuing from the policy being replaced: it is read before the new one is swapped in.
    again = runner.invoke(app, [*sft, "--policy", str(out), "--overwrite"])
    assert again.exit_code == 0, again.output
    assert json.loads((out / "sft_result.json").read_text())["config"]["seed"] == 0


def test_sft_evaluate_before_scores_the_starting_policy(tiny_dataset, tmp_path):
    import json

    out = tmp_path / "sft"
    sft = ["synthetic", "sft", "--data", str(tiny_dataset), "--out", str(out), "--steps", "1",
           "--batch-size", "2", "--eval-limit", "2", "--no-progress"]  # fmt: skip
    result = runner.invoke(app, [*sft, "--evaluate-before"])
    assert result.exit_code == 0, result.output
    lines = [
        " ".join(line.split(":")[0].split())
        for line in result.output.splitlines()
        if line.startswith("held-out")
    ]
    assert lines == ["held-out before", "held-out after SFT", "held-out references"]
    held_out = json.loads((out / "sft_result.json").read_text())["held_out"]
    assert held_out["before"] is not None and held_out["before"]["n"] == 2

    no_scenes = runner.invoke(app, [*sft, "--eval-limit", "0", "--evaluate-before", "--overwrite"])
    assert no_scenes.exit_code == 2
    assert " ".join(no_scenes.output.split()) == (
        "error: --evaluate-before scores held-out scenes: give --eval-limit above 0"
    )


def test_show_refuses_an_unknown_rubric_in_one_line(tiny_dataset):
    show = ["synthetic", "show", "--data", str(tiny_dataset)]
    result = runner.invoke(app, [*show, "--rubric", "foo"])
    assert result.exit_code == 2
    assert " ".join(result.output.split()) == (
        "error: --rubric foo: choose training, evaluation, training_without_pointability"
    )
    for rubric in ("training", "evaluation", "training_without_pointability"):
        shown = runner.invoke(app, [*show, "--rubric", rubric])
        assert shown.exit_code == 0 and "b-CapScore 100.0  (x100)" in shown.output, (rubric, shown.output)


def test_init_policy_does_not_write_over_a_policy(tmp_path):
    out = tmp_path / "policy"
    assert runner.invoke(app, ["synthetic", "init-policy", "--out", str(out)]).exit_code == 0
    weights = (out / "model.safetensors").read_bytes()
    refused = runner.invoke(app, ["synthetic", "init-policy", "--out", str(out), "--seed", "1"])
    assert refused.exit_code == 2 and "pass --overwrite to replace them" in " ".join(refused.output.split())
    assert (out / "model.safetensors").read_bytes() == weights
    replaced = runner.invoke(
        app, ["synthetic", "init-policy", "--out", str(out), "--seed", "1", "--overwrite"]
    )
    assert replaced.exit_code == 0 and (out / "model.safetensors").read_bytes() != weights
    assert sorted(p.name for p in tmp_path.iterdir()) == ["policy"]
