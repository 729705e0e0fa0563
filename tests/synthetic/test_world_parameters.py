"""Every parameter of the synthetic world and of the demo's defaults is classified once
(balcaprl.demo.parameters), docs/synthetic-world.md holds that table as the code renders it, and each
free parameter with a pre-flight table is one scripts/world_preflight_table.py sweeps."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from balcaprl.demo.config import DemoConfig, DemoRecipe, SFTSettings, demo_recipe
from balcaprl.demo.parameters import SOURCES, WORLD_PARAMETERS, parameter_value, with_parameter_table
from balcaprl.synthetic.policy import PolicySpec
from balcaprl.train.checkpointing import _flatten as leaves  # dotted keys of nested settings

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "synthetic-world.md"
LISTED = [key for entry in WORLD_PARAMETERS for key in entry.keys]


def preflight_script():
    spec = importlib.util.spec_from_file_location(
        "world_preflight_table", REPO / "scripts" / "world_preflight_table.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["world_preflight_table"] = module  # (its dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


def test_the_guide_holds_the_table_the_code_renders():
    text = GUIDE.read_text(encoding="utf-8")
    assert with_parameter_table(text) == text, (
        "run `PYTHONPATH=src python scripts/render_world_parameters.py`"
    )


def test_a_guide_without_the_block_is_refused():
    with pytest.raises(ValueError, match="parameters:world"):
        with_parameter_table("# a guide\n")


def test_every_demo_default_is_listed_once():
    assert len(LISTED) == len(set(LISTED)), "a key in two entries"
    config = {k: v for k, v in DemoConfig().model_dump(mode="json").items() if k not in ("recipe", "policy")}
    missing = sorted(set(leaves(config)) - set(LISTED))
    missing += sorted(f"policy.{f.name}" for f in fields(PolicySpec) if f"policy.{f.name}" not in LISTED)
    # the recipe: every value the demo sets apart from the schema's default (the rest: docs/recipes.md)
    ours, schema = leaves(demo_recipe().model_dump(mode="json")), leaves(DemoRecipe().model_dump(mode="json"))
    missing += sorted(f"recipe.{k}" for k in ours if ours[k] != schema.get(k) and f"recipe.{k}" not in LISTED)
    assert not missing, f"not classified: {missing}"


def test_each_entry_reads_its_value_from_the_code_and_says_why():
    for entry in WORLD_PARAMETERS:
        assert entry.source in SOURCES and entry.why.strip(), entry
        for key in entry.keys:
            parameter_value(key)  # a KeyError for a key the code does not have
    with pytest.raises(KeyError, match="no NO_SUCH"):
        parameter_value("captioners.NO_SUCH")
    assert parameter_value("captioners.GUESSES_PER_SHAPE") == 4  # the module's constant, read live
    assert parameter_value("dataset.max_objects") == DemoConfig().dataset.max_objects


def test_the_config_and_the_table_agree_on_what_is_tuned_and_what_is_free():
    # the demo config's own notes say "Tuned: ..." or "Free ..."; the table must not say otherwise
    sections = {
        "sft": DemoConfig.model_fields["sft"].annotation,
        "dataset": DemoConfig.model_fields["dataset"].annotation,
    }
    source_of = {key: entry.source for entry in WORLD_PARAMETERS for key in entry.keys}
    noted = 0
    for section, model in sections.items():
        for name, field in model.model_fields.items():
            note = (field.description or "").lower()
            for word in ("tuned", "free"):
                if note.startswith(word):
                    assert source_of[f"{section}.{name}"] == word, f"{section}.{name}: the config says {word}"
                    noted += 1
    assert noted >= 3  # sft.steps, sft.vision_lr_scale, sft.flawed_fraction


def test_each_pre_flight_table_sweeps_a_listed_parameter_through_its_default():
    script = preflight_script()
    tables = {entry.table: entry for entry in WORLD_PARAMETERS if entry.table}
    assert {sweep.name for sweep in script.SWEEPS} == set(tables)
    for sweep in script.SWEEPS:
        assert tables[sweep.name].source in ("free", "tuned"), sweep.name
        assert sum(script.is_default(world) for _, world in sweep.values) == 1, f"{sweep.name}: one default"
        for _, world in sweep.values:
            changed = {f"dataset.{k}" for k in world.dataset} | set(world.constants)
            changed |= (
                {"sft.flawed_fraction"} if world.flawed_fraction != SFTSettings().flawed_fraction else set()
            )
            assert changed <= set(tables[sweep.name].keys), f"{sweep.name} changes {changed}"


def test_the_world_constants_are_put_back_after_a_setting():
    script = preflight_script()
    keys = ("captioners.GUESSES_PER_SHAPE", "linguistic.OVERLOAD_WORDS")
    before = [parameter_value(k) for k in keys]
    with script.world_constants(dict(zip(keys, (before[0] + 1, before[1] + 7), strict=True))):
        assert [parameter_value(k) for k in keys] == [before[0] + 1, before[1] + 7]
    assert [parameter_value(k) for k in keys] == before
    with pytest.raises(AttributeError), script.world_constants({"captioners.NO_SUCH": 1}):
        pass


def test_the_preflight_record_renders_its_tables_with_cost_load_and_commit():
    spec = importlib.util.spec_from_file_location("docs_figures", REPO / "scripts" / "docs_figures.py")
    docs_figures = importlib.util.module_from_spec(spec)
    sys.modules["docs_figures"] = docs_figures
    spec.loader.exec_module(docs_figures)
    record = {"commit": "0123456789abcdef", "dirty": False, "cores": 2, "load_before": 2.5, "load_after": 3.5, "wall_s": 120.0,
              "cpu_s": 60.0, "results": {"markdown": "| start |\n| --- |\n"}}  # fmt: skip
    assert docs_figures.render_world_preflight(record) == (
        "| start |\n| --- |\n\nMeasured by `scripts/world_preflight_table.py` in 1.0 CPU-minutes (2.0 min wall "
        "on 2 cores, 1-minute load 2.5 at the start and 3.5 at the end; commit 0123456789, `make docs-figures`).\n"
    )
