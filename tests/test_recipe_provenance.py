"""Where every recipe default comes from: declared once (balcaprl.recipe.PROVENANCE) for every setting
that has a default, docs/recipes.md generated from it and current, and the clip constants credited to
verl, not to the paper."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import yaml

from balcaprl.recipe import PROVENANCE, Recipe, load_recipe, provenance_table, recipe_defaults

ROOT = Path(__file__).resolve().parents[1]


def load_script():
    spec = importlib.util.spec_from_file_location(
        "render_recipe_docs", ROOT / "scripts" / "render_recipe_docs.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_default_has_exactly_one_provenance():
    defaults = recipe_defaults()
    assert set(defaults) == set(PROVENANCE), (
        f"without provenance: {sorted(set(defaults) - set(PROVENANCE))}; "
        f"stale entries: {sorted(set(PROVENANCE) - set(defaults))}"
    )
    # The walk reaches the nested sections: a few keys from each.
    for key in (
        "rewards.weights.precision",
        "rewards.length.tau_high",
        "rollout.vllm.mode",
        "model.lora.r",
        "run.save_steps",
    ):
        assert key in defaults
    assert "model.path" not in defaults and "run.output_dir" not in defaults  # required: no default


def test_each_source_says_where():
    for key, entry in PROVENANCE.items():
        assert entry.source in ("paper", "inference", "library", "choice") and entry.why.strip(), key
        if entry.source == "paper":
            assert re.search(r"(Sec\. 2\.\d|Appendix A\.1)", entry.why), (
                f"{key}: a paper value names its section"
            )
        if entry.source == "library":
            assert re.search(r"verl|TRL|transformers|vLLM|peft|processor", entry.why), f"{key}: which library"


def test_the_paper_values_are_the_papers():
    """Appendix A.1's numbers are what the paper recipe holds, under 'paper'."""
    recipe = load_recipe(ROOT / "configs" / "qwen2_5_vl_3b.yaml")
    stated = {
        "rollout.rollouts_per_prompt": 8,
        "train.learning_rate": 5e-6,
        "train.prompts_per_batch": 256,
        "train.lr_scheduler": "cosine",
        "train.epochs": 1,
        "rewards.weights.precision": 0.1,
        "rewards.weights.recall": 0.3,
        "rewards.weights.linguistic": 0.3,
        "rewards.length.tau_low": 0.5,
        "rewards.length.tau_high": 2.0,
        "train.kl_beta": 0.0,
        "train.loss_aggregation": "token_sum_sequence_mean",
    }
    values = recipe.model_dump(mode="json")
    for key, value in stated.items():
        section, *rest = key.split(".")
        got = values[section]
        for part in rest:
            got = got[part]
        assert got == value and PROVENANCE[key].source == "paper", key


def test_eps_and_c_are_verls_defaults_not_the_papers():
    for key in ("train.clip_epsilon", "train.dual_clip_c"):
        assert PROVENANCE[key].source == "library" and "verl" in PROVENANCE[key].why
    assert PROVENANCE["train.updates_per_batch"].source == "inference"
    for path in [
        ROOT / "src/balcaprl/recipe.py",
        ROOT / "src/balcaprl/train/loss.py",
        *ROOT.glob("configs/*.yaml"),
    ]:
        text = " ".join(path.read_text().split())
        assert not re.search(r"paper'?s?:? (clip|eps|ε|c) ?=? ?(0\.2|3)\b|\(paper: 3\)", text), path
    loss_doc = " ".join((ROOT / "src/balcaprl/train/loss.py").read_text().split())
    assert "c = 3 are verl's defaults" in loss_doc and "gives neither eps nor c" in loss_doc


def test_docs_recipes_md_is_current():
    script = load_script()
    path = ROOT / "docs" / "recipes.md"
    assert path.read_text() == script.recipe_docs(ROOT), (
        "docs/recipes.md is stale: python scripts/render_recipe_docs.py"
    )


def test_the_table_shows_the_paper_recipe_and_the_schema_default_where_they_differ():
    table = provenance_table(load_recipe(ROOT / "configs" / "qwen2_5_vl_3b.yaml"), "paper")
    rows = {
        line.split("|")[1].strip(" `"): [c.strip() for c in line.split("|")[2:5]]
        for line in table.splitlines()[2:]
    }
    assert rows["train.updates_per_batch"] == ["4", "1", "inference"]
    assert rows["rollout.vllm.mode"] == ["colocate", "off", "inference"]
    assert rows["train.learning_rate"] == ["5e-06", "", "paper"]
    assert rows["judge"][0] == "gpt-4o-mini (judge config)"
    assert len(rows) == len(recipe_defaults())
    yaml.safe_dump(Recipe.model_json_schema())  # the schema still serialises (no Python objects in it)
