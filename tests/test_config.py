"""The config machinery every config is built on: one loader, one override syntax, one error whose
message names every bad key by its dotted path (and, for an unknown key, the keys allowed there)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import Field

from balcaprl.config import (
    Section,
    apply_overrides,
    deep_merge,
    format_validation_error,
    load_config,
    read_config_file,
    section_without,
)
from balcaprl.errors import ConfigError, UserError


class Inner(Section):
    alpha: int = Field(1, ge=0, description="A count.")
    beta: str | list[str] = Field("x", description="A name or names.")


class Outer(Section):
    inner: Inner = Field(default_factory=Inner, description="A nested section.")
    maybe: Inner | None = Field(None, description="An optional section.")
    path: str = Field("here", description="A plain value.")
    items: list[int] = Field(default_factory=lambda: [1, 2], description="A list.")


class Top(Section):
    outer: Outer = Field(default_factory=Outer, description="The section under test.")
    name: str = Field(description="Required.")


def problems(error: ConfigError) -> list[str]:
    """The message's problem lines, whitespace-normalised (independent of any console width)."""
    return [" ".join(line.split()) for line in str(error).splitlines()[1:]]


def test_unknown_keys_name_their_full_path_and_the_likely_key_or_the_allowed_ones():
    with pytest.raises(ConfigError) as info:  # a typo: difflib's closest key too
        load_config(Top, data={"name": "n"}, overrides=["outer.inner.alpah=3"], what="toy config")
    assert str(info.value).splitlines()[0] == "invalid toy config (built-in defaults):"
    assert problems(info.value) == [
        "outer.inner.alpah: unknown key; allowed here: alpha, beta; did you mean 'alpha'?"
    ]
    with pytest.raises(ConfigError) as info:
        load_config(Top, data={"name": "n", "outr": {}})
    assert problems(info.value) == ["outr: unknown key; allowed here: name, outer; did you mean 'outer'?"]
    with pytest.raises(ConfigError) as info:  # nothing close: the keys allowed there alone
        load_config(Top, data={"name": "n", "zzz": {}})
    assert problems(info.value) == ["zzz: unknown key; allowed here: name, outer"]
    with pytest.raises(ConfigError) as info:  # through an optional section
        load_config(Top, data={"name": "n", "outer": {"maybe": {"gamma": 1}}})
    assert problems(info.value) == ["outer.maybe.gamma: unknown key; allowed here: alpha, beta"]


def test_every_bad_key_is_reported_at_once_with_its_path():
    with pytest.raises(ConfigError) as info:
        load_config(Top, data={"outer": {"inner": {"alpha": -1, "beta": [1.5]}, "path": 3}}, source="a.yaml")
    assert str(info.value).startswith("invalid config (a.yaml):")
    lines = problems(info.value)
    assert "name: required, but missing" in lines
    assert "outer.inner.alpha: Input should be greater than or equal to 0 (got -1)" in lines
    assert "outer.path: Input should be a valid string (got 3)" in lines
    # a union's member names are pydantic's, not keys: the path stays the config's own
    assert any(line.startswith("outer.inner.beta.0: ") for line in lines)
    assert not any("list[str]" in line.split(":")[0] for line in lines)


def test_overrides_parse_yaml_values_and_create_sections():
    data = apply_overrides(
        {"name": "n"}, ["outer.inner.alpha=7", "outer.items=[3, 4]", "outer.maybe.beta=null"]
    )
    assert data == {"name": "n", "outer": {"inner": {"alpha": 7}, "items": [3, 4], "maybe": {"beta": None}}}
    # typed pairs (a program's values) are taken as they are, never re-parsed as YAML
    assert apply_overrides({}, [("outer.path", "null")]) == {"outer": {"path": "null"}}
    top = load_config(Top, data={"name": "n"}, overrides=["outer.maybe.alpha=2", "outer.maybe=null"])
    assert top.outer.maybe is None  # later overrides win


def test_an_override_below_a_value_and_a_malformed_override_are_refused():
    with pytest.raises(
        ConfigError, match=r"override 'outer\.path\.x=1': outer\.path is a value \('here'\), not a section"
    ):
        apply_overrides({"outer": {"path": "here"}}, ["outer.path.x=1"])
    for bad in ("outer.path", "=3", "outer..path=3"):
        with pytest.raises(ConfigError, match="must look like key.sub=value"):
            apply_overrides({}, [bad])
    with pytest.raises(ConfigError, match="not valid YAML"):
        apply_overrides({}, ["outer.items=[1, 2"])


def test_base_chains_merge_mappings_replace_lists_and_resolve_paths_per_file(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "parent.yaml").write_text(
        "name: parent\nouter: {path: data/x, items: [1, 2, 3], inner: {alpha: 5, beta: b}}\n"
    )
    (tmp_path / "child.yaml").write_text("base: a/parent.yaml\nouter: {items: [9], inner: {alpha: 6}}\n")

    def resolve(data, folder: Path):
        outer = data.get("outer", {})
        if "path" in outer:
            data = {**data, "outer": {**outer, "path": str(folder / outer["path"])}}
        return data

    merged = read_config_file(tmp_path / "child.yaml", resolve_paths=resolve)
    assert merged == {
        "name": "parent",
        "outer": {
            "path": str(tmp_path / "a" / "data" / "x"),
            "items": [9],
            "inner": {"alpha": 6, "beta": "b"},
        },
    }
    top = load_config(Top, tmp_path / "child.yaml", ["outer.inner.beta=[c, d]"], resolve_paths=resolve)
    assert top.outer.inner.beta == ["c", "d"] and top.outer.path.endswith("a/data/x")


def test_file_problems_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="toy not found"):
        load_config(Top, tmp_path / "nope.yaml", what="toy")
    (tmp_path / "bad.yaml").write_text("name: [unclosed\n")
    with pytest.raises(ConfigError, match="is not valid YAML"):
        load_config(Top, tmp_path / "bad.yaml")
    (tmp_path / "list.yaml").write_text("- a\n")
    with pytest.raises(ConfigError, match="expected a mapping of keys to values at the top level, got list"):
        load_config(Top, tmp_path / "list.yaml")
    (tmp_path / "x.yaml").write_text("base: y.yaml\n")
    (tmp_path / "y.yaml").write_text("base: x.yaml\n")
    with pytest.raises(ConfigError, match="base chain loops"):
        load_config(Top, tmp_path / "x.yaml")
    with pytest.raises(ConfigError, match="only understood in files"):
        load_config(Top, data={"base": "x.yaml", "name": "n"})
    assert issubclass(ConfigError, UserError)  # the command line shows it as one line, exit 2


def test_deep_merge_leaves_its_inputs_alone():
    parent = {"a": {"b": 1, "c": [1]}, "d": 2}
    child = {"a": {"c": [2]}, "e": {"f": 3}}
    assert deep_merge(parent, child) == {"a": {"b": 1, "c": [2]}, "d": 2, "e": {"f": 3}}
    assert parent == {"a": {"b": 1, "c": [1]}, "d": 2} and child == {"a": {"c": [2]}, "e": {"f": 3}}


def test_defaults_sit_under_the_file_and_the_overrides(tmp_path):
    (tmp_path / "c.yaml").write_text("outer: {inner: {alpha: 2}}\n")
    top = load_config(
        Top,
        tmp_path / "c.yaml",
        ["outer.path=there"],
        defaults={"name": "d", "outer": {"inner": {"beta": "z"}}},
    )
    assert (top.name, top.outer.inner.alpha, top.outer.inner.beta, top.outer.path) == ("d", 2, "z", "there")


def test_section_without_drops_fields_and_keeps_the_rest():
    Partial = section_without(Outer, "path", "items", name="Partial")
    assert set(Partial.model_fields) == {"inner", "maybe"}
    with pytest.raises(ConfigError) as info:
        load_config(Partial, data={"path": "x"})
    assert problems(info.value) == ["path: unknown key; allowed here: inner, maybe"]
    assert Partial.model_fields["inner"].description == "A nested section."


def test_the_formatter_takes_a_prefix_for_a_section_of_a_larger_config():
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as info:
        Top.model_validate({"name": "n", "outer": {"inner": {"alhpa": 1}}})
    text = format_validation_error(info.value, Top, "demo.yaml", "recipe", prefix="recipe.")
    assert text.splitlines() == [
        "invalid recipe (demo.yaml):",
        "  recipe.outer.inner.alhpa: unknown key; allowed here: alpha, beta; did you mean 'alpha'?",
    ]
