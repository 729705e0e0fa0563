"""The config machinery every balcaprl config is built on (the schemas live with their owners).

One way to write a config, whichever it is (training recipe, judge, demo, evaluation):

- a :class:`Section` per mapping: a pydantic model whose unknown keys are errors and whose fields are
  documented where they are declared;
- YAML files; a file may name one parent with ``base: parent.yaml`` (relative to the file) and then
  holds only what it changes; mappings merge key by key (:func:`deep_merge`), anything else is
  replaced whole;
- command-line overrides ``key.sub=value`` with YAML-parsed values (``rewards.weights.precision=0``,
  ``run.report_to=[tensorboard]``, ``model.lora=null``), applied after the files;
- one loader, :func:`load_config`, and one error, :class:`balcaprl.errors.ConfigError`, whose message
  names every bad key by its full dotted path and, for an unknown key, lists the keys allowed there.

YAML is read with bounds (:func:`parse_yaml`): a file of at most 4 MiB, at most 100,000 values once
its aliases are expanded (an "alias bomb", nine lines that expand to a billion values, is refused
before anything expands it), and no key twice in one mapping (YAML would silently keep the last one;
the error names the key and both lines).
"""

from __future__ import annotations

import copy
import difflib
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar, get_args

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from balcaprl.errors import ConfigError, UserError
from balcaprl.files import decode_utf8

M = TypeVar("M", bound=BaseModel)

# A command-line ``"key.sub=value"`` (value parsed as YAML), or a ``(key.sub, value)`` pair whose value
# is already typed (a program's values, e.g. a CLI flag that holds a path).
Override = str | tuple[str, Any]

# Rewrites the relative paths of one file's mapping against that file's folder (before merging).
PathResolver = Callable[[dict[str, Any], Path], dict[str, Any]]


class Section(BaseModel):
    """A config mapping: unknown keys are errors (a typo must never fall back to a default silently)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def section_without(model: type[BaseModel], *names: str, name: str | None = None) -> type[Section]:
    """``model``'s fields less ``names``, as a new section (its own validators are not carried over).

    For a config that embeds another minus what it fills in itself (the demo's RL recipe has no paths).
    """
    unknown = sorted(set(names) - set(model.model_fields))
    if unknown:
        raise ValueError(f"{model.__name__} has no fields {unknown}")
    fields: dict[str, Any] = {
        key: (field.annotation, field) for key, field in model.model_fields.items() if key not in names
    }
    return create_model(name or f"{model.__name__}Part", __base__=Section, __doc__=model.__doc__, **fields)


# ------------------------------------------------------------------------------------------- files


MAX_CONFIG_BYTES = 4 * 1024 * 1024  # a config is a few kilobytes; /dev/zero is not one
MAX_CONFIG_VALUES = 100_000  # scalars, lists and mappings, with every alias expanded


class _Refused(Exception):
    """A YAML document the bounded loader will not build (the message says why and where)."""


class _BoundedLoader(yaml.SafeLoader):
    """``SafeLoader`` that refuses duplicate keys and documents whose aliases expand too far."""

    def get_single_node(self):
        node = super().get_single_node()
        if node is not None:
            _expanded_size(node)  # on the composed graph, where an alias is one shared node
        return node

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            first: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                try:
                    earlier = first.setdefault(key, line)
                except TypeError:
                    continue  # an unhashable key: the base class says so
                if earlier != line:
                    raise _Refused(
                        f"duplicate key {key!r} at line {line} (first at line {earlier}); give each key once"
                    )
        return super().construct_mapping(node, deep=deep)


def _expanded_size(root: yaml.Node) -> int:
    """How many values ``root`` holds with its aliases expanded; :class:`_Refused` above the bound."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(node: yaml.Node) -> int:
        known = sizes.get(id(node))
        if known is not None:
            return known
        if id(node) in open_nodes:
            raise _Refused(f"an alias at line {node.start_mark.line + 1} contains itself")
        open_nodes.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            total = 1 + sum(size(child) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            total = 1 + sum(size(key) + size(value) for key, value in node.value)
        else:
            total = 1
        open_nodes.discard(id(node))
        if total > MAX_CONFIG_VALUES:
            raise _Refused(
                f"its aliases expand to more than {MAX_CONFIG_VALUES:,} values (line {node.start_mark.line + 1}); "
                "a config never needs that many"
            )
        sizes[id(node)] = total
        return total

    return size(root)


def parse_yaml(text: str) -> Any:
    """``text`` as YAML, within the bounds of the module docstring. Raises ``ValueError`` with a
    one-line reason (a bound, a duplicate key, or the parser's message with its line)."""
    try:
        return yaml.load(text, Loader=_BoundedLoader)  # a SafeLoader
    except _Refused as error:
        raise ValueError(str(error)) from None
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ValueError(f"{error.problem or error.context or 'not valid YAML'}{where}") from None
    except yaml.YAMLError as error:
        raise ValueError(" ".join(str(error).split())) from None
    except RecursionError:
        raise ValueError("nested too deeply") from None


def _read_yaml(path: Path, what: str) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_CONFIG_BYTES + 1)  # bounded: a device or a huge file is not read whole
    except FileNotFoundError:
        raise ConfigError(f"{what} not found: {path}") from None
    except OSError as error:
        raise ConfigError(f"{what} {path}: cannot read it ({error.strerror})") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{what} {path}: larger than {MAX_CONFIG_BYTES // 2**20} MiB; not a config file")
    try:
        text = decode_utf8(raw, f"{what} {path}")
    except UserError as error:  # names the file, the byte and the line
        raise ConfigError(str(error)) from None
    try:
        data = parse_yaml(text)
    except ValueError as error:
        raise ConfigError(f"{what} {path} is not valid YAML: {error}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{what} {path}: expected a mapping of keys to values at the top level, got {type(data).__name__}"
        )
    return data


def read_config_file(
    path: str | Path, what: str = "config", resolve_paths: PathResolver | None = None
) -> dict[str, Any]:
    """A config file as a plain dict with its ``base:`` chain merged in (not validated yet).

    ``resolve_paths(data, folder)`` rewrites each file's relative paths against its own folder, so a
    path means the same thing whichever file of the chain holds it.
    """
    return _read_chain(Path(path).expanduser().resolve(), what, resolve_paths, ())


def _read_chain(
    path: Path, what: str, resolve_paths: PathResolver | None, seen: tuple[Path, ...]
) -> dict[str, Any]:
    if path in seen:
        chain = " -> ".join(str(p) for p in (*seen, path))
        raise ConfigError(f"{what} base chain loops: {chain}")
    data = _read_yaml(path, what)
    base = data.pop("base", None)
    if resolve_paths is not None:
        data = resolve_paths(data, path.parent)
    if base is None:
        return data
    if not isinstance(base, str):
        raise ConfigError(f"{path}: base must be a path (relative to this file), got {base!r}")
    return deep_merge(_read_chain((path.parent / base).resolve(), what, resolve_paths, (*seen, path)), data)


def deep_merge(parent: Mapping[str, Any], child: Mapping[str, Any]) -> dict[str, Any]:
    """Child wins; mappings merge key by key; anything else (lists included) is replaced whole."""
    merged = copy.deepcopy(dict(parent))
    for key, value in child.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


# --------------------------------------------------------------------------------------- overrides


def _parse_override(item: Override) -> tuple[str, list[str], Any]:
    if isinstance(item, tuple):
        key, value = item
        text = f"{key}=<{type(value).__name__}>"
    else:
        key, sep, raw = item.partition("=")
        text = item
        if not sep:
            key = ""
        else:
            try:
                value = parse_yaml(raw) if raw.strip() else None
            except ValueError as error:
                raise ConfigError(f"override {item!r}: the value is not valid YAML ({error})") from None
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(
            f"override {text!r} must look like key.sub=value (e.g. rewards.weights.precision=0)"
        )
    return text, key.split("."), value


def apply_overrides(data: Mapping[str, Any], overrides: Iterable[Override]) -> dict[str, Any]:
    """Set each ``key.sub=value`` in a copy of ``data``, creating sections on the way.

    Unknown keys are left for validation to report (with the keys allowed there).
    """
    result = copy.deepcopy(dict(data))
    for item in overrides:
        text, parts, value = _parse_override(item)
        node = result
        for depth, part in enumerate(parts[:-1]):
            child = node.get(part)
            if not isinstance(child, dict):
                if child is not None:
                    where = ".".join(parts[: depth + 1])
                    raise ConfigError(f"override {text!r}: {where} is a value ({child!r}), not a section")
                child = {}
                node[part] = child
            node = child
        node[parts[-1]] = copy.deepcopy(value)
    return result


# ------------------------------------------------------------------------------------------ errors


def _section_of(annotation: Any) -> type[BaseModel] | None:
    """The section a field holds, through ``X | None`` and ``Annotated[X, ...]``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next((s for s in map(_section_of, get_args(annotation)) if s is not None), None)


def _allowed_keys(model: type[BaseModel], loc: Sequence[Any]) -> list[str]:
    """The keys of the section at ``loc`` (empty when ``loc`` is not a section)."""
    current: type[BaseModel] | None = model
    for part in loc:
        field = current.model_fields.get(part) if isinstance(part, str) and current is not None else None
        if field is None:
            return []
        current = _section_of(field.annotation)
        if current is None:
            return []
    return sorted(current.model_fields) if current is not None else []


_BUILTIN_TAGS = {"str", "int", "float", "bool", "bytes", "none"}


def _is_tag(part: Any) -> bool:
    # pydantic puts validator and union-member names into a location (``function-after[...]``,
    # ``list[str]``, ``LoraSettings``); config keys are snake_case, so these never clash with one.
    if not isinstance(part, str) or not part:
        return False
    return part.startswith("function-") or "[" in part or part[0].isupper() or part in _BUILTIN_TAGS


_URL_PASSWORD = re.compile(r"(//[^/@\s:'\"]*):[^/@\s'\"]*@")


def redact_credentials(text: str) -> str:
    """``text`` with the password of every URL in it masked (``https://user:***@host``): a config's
    error message shows the value it refuses, never a secret in it."""
    return _URL_PASSWORD.sub(r"\1:***@", text)


def _unknown_key_hint(given: str, allowed: list[str]) -> str:
    """The keys allowed there, and for a likely typo ``; did you mean 'X'?`` (difflib's closest keys:
    in a list of 26 keys the one meant is easy to miss)."""
    if not allowed:
        return ""
    close = difflib.get_close_matches(given, allowed, n=2, cutoff=0.6)
    meant = "; did you mean " + " or ".join(repr(key) for key in close) + "?" if close else ""
    return f"; allowed here: {', '.join(allowed)}{meant}"


def format_validation_error(
    error: ValidationError, model: type[BaseModel], source: str, what: str = "config", prefix: str = ""
) -> str:
    """``invalid WHAT (SOURCE):`` then one line per problem, each naming its key's full dotted path.

    ``prefix`` is put before every key (``recipe.`` when the config is a section of a larger one).
    """
    lines = [f"invalid {what} ({source}):"]
    for problem in error.errors():
        loc = [p for p in problem["loc"] if not _is_tag(p)]
        key = prefix + ".".join(str(p) for p in loc) if loc else (prefix.rstrip(".") or "(top level)")
        if problem["type"] == "extra_forbidden":
            lines.append(
                f"  {key}: unknown key{_unknown_key_hint(str(loc[-1]), _allowed_keys(model, loc[:-1]))}"
            )
        elif problem["type"] == "missing":
            lines.append(f"  {key}: required, but missing")
        else:
            message = problem["msg"].removeprefix("Value error, ")
            given = problem.get("input")
            got = "" if isinstance(given, Mapping) else f" (got {redact_credentials(repr(given))})"
            lines.append(f"  {key}: {message}{got}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ loading


def validate_config(
    model: type[M], data: Mapping[str, Any], source: str, what: str = "config", prefix: str = ""
) -> M:
    """``model`` validated from ``data``; a :class:`ConfigError` naming every bad key otherwise."""
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"{what} ({source}): expected a mapping of keys to values, got {type(data).__name__}"
        )
    try:
        return model.model_validate(dict(data))
    except ValidationError as error:
        raise ConfigError(format_validation_error(error, model, source, what, prefix)) from None


def load_config(
    model: type[M],
    path: str | Path | None = None,
    overrides: Iterable[Override] = (),
    *,
    data: Mapping[str, Any] | None = None,
    defaults: Mapping[str, Any] | None = None,
    source: str | None = None,
    what: str = "config",
    resolve_paths: PathResolver | None = None,
) -> M:
    """The one loader: ``defaults``, then ``data`` (a mapping) or the file at ``path`` (with its
    ``base:`` chain), then ``overrides``, validated as ``model``.

    Raises :class:`ConfigError` for a missing or unreadable file, bad YAML, a bad override, and every
    key the schema refuses (all of them at once, by their dotted paths).
    """
    if path is not None and data is not None:
        raise TypeError("give a path or a mapping, not both")
    merged: dict[str, Any] = copy.deepcopy(dict(defaults or {}))
    if path is not None:
        merged = deep_merge(merged, read_config_file(path, what, resolve_paths))
        source = source or str(path)
    elif data is not None:
        if not isinstance(data, Mapping):
            raise ConfigError(
                f"{what} ({source or 'mapping'}): expected a mapping of keys to values, got {type(data).__name__}"
            )
        if "base" in data:
            raise ConfigError(f"{what}: 'base' is only understood in files (give the path instead)")
        merged = deep_merge(merged, data)
    merged = apply_overrides(merged, overrides)
    return validate_config(model, merged, source or "built-in defaults", what)
