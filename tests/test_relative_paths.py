"""One rule for relative paths: a path in a config file is relative to that file (a recipe's
judge:, data.path and a local model.path; an evaluation config's files and judges); a command-line
argument, an override included, is relative to the current folder."""

from __future__ import annotations

from pathlib import Path

from balcaprl.evaluate.config import load_evaluation_config
from balcaprl.recipe import load_recipe

JUDGE = "base_url: http://127.0.0.1:9/v1\nmodel: m\napi_key_env: null\n"


def test_a_recipes_inputs_are_relative_to_the_recipe_file(tmp_path, monkeypatch):
    project = tmp_path / "project"
    (project / "policy").mkdir(parents=True)
    (project / "judge.yaml").write_text(JUDGE)
    (project / "recipe.yaml").write_text(
        "model: {path: policy}\ndata: {path: data}\njudge: judge.yaml\nrun: {output_dir: runs/x}\n"
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    recipe = load_recipe(Path("../project/recipe.yaml"))
    assert Path(recipe.model.path) == project.resolve() / "policy"
    assert Path(recipe.data.path) == project.resolve() / "data"
    assert recipe.run.output_dir == "runs/x" or Path(recipe.run.output_dir) == Path(
        "runs/x"
    )  # where it is run
    overridden = load_recipe(
        Path("../project/recipe.yaml"), ["data.path=mine", "model.path=Qwen/Qwen2.5-VL-3B-Instruct"]
    )
    assert overridden.data.path == "mine"  # an argument: the current folder's
    assert overridden.model.path == "Qwen/Qwen2.5-VL-3B-Instruct"


def test_a_hub_id_in_a_recipe_stays_a_hub_id(tmp_path):
    (tmp_path / "judge.yaml").write_text(JUDGE)
    (tmp_path / "recipe.yaml").write_text(
        "model: {path: Qwen/Qwen2.5-VL-3B-Instruct}\ndata: {path: /abs/data}\njudge: judge.yaml\nrun: {output_dir: r}\n"
    )
    recipe = load_recipe(tmp_path / "recipe.yaml")
    assert recipe.model.path == "Qwen/Qwen2.5-VL-3B-Instruct" and recipe.data.path == "/abs/data"


def test_an_evaluation_configs_paths_are_relative_to_the_config_file(tmp_path, monkeypatch):
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "judge.yaml").write_text(JUDGE)
    (tmp_path / "cfg" / "eval.yaml").write_text(
        "judge: judge.yaml\nbcapscore: {annotations: bench/IIW.jsonl, images: bench/images}\n"
    )
    monkeypatch.chdir(tmp_path)
    settings = load_evaluation_config(Path("cfg/eval.yaml"), {})
    assert Path(settings.bcapscore.annotations) == (tmp_path / "cfg" / "bench" / "IIW.jsonl").resolve()
