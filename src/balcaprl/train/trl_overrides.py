"""``train.trl_overrides``: TRL settings the recipe does not name, passed through to ``GRPOConfig``
(the TRL backend's counterpart of ``balcaprl verl launch --verl-override``).

Checked before anything is loaded: a name that is not a ``GRPOConfig`` field of the installed TRL is
refused with the closest field names (a typo would otherwise surface as TRL's TypeError, or not at
all); a field the recipe sets itself is refused too, naming the recipe's own setting route, so one
value never has two places and ``recipe.yaml`` stays the whole truth of a run. Then the config is
built (:func:`build_config`): a value TRL or transformers refuses (``eval_strategy: sometimes``) is a
:class:`~balcaprl.errors.ConfigError` naming the key that set it, a pass-through one or the recipe's
own, raised where the command line checks the recipe: before a run folder is touched.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import types
import typing
from collections.abc import Mapping
from typing import Any

from balcaprl.errors import ConfigError

KEY = "train.trl_overrides"


def apply_trl_overrides(
    kwargs: Mapping[str, Any], overrides: Mapping[str, Any], config_class: type
) -> dict[str, Any]:
    """``kwargs`` (what the recipe gives ``config_class``) with ``overrides`` added; raises
    :class:`~balcaprl.errors.ConfigError` for an unknown field or one the recipe already sets."""
    fields = {field.name for field in dataclasses.fields(config_class)}
    for name in overrides:
        if name not in fields:
            close = difflib.get_close_matches(name, sorted(fields), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise ConfigError(f"{KEY}.{name}: not a field of TRL's {config_class.__name__}{hint}")
        if name in kwargs:
            raise ConfigError(
                f"{KEY}.{name}: the recipe sets it already ({name}={kwargs[name]!r}); change the recipe's own "
                "setting instead (docs/recipes.md lists them)"
            )
    return {**kwargs, **overrides}


def _fits(value: Any, annotation: Any) -> bool:
    """Whether ``value`` (parsed YAML) can be of type ``annotation``; a type this cannot tell (a class
    YAML never makes) is left to the config's own checks."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, arm) for arm in typing.get_args(annotation))
    if origin is typing.Literal:
        return value in typing.get_args(annotation)
    if annotation is type(None) or annotation is None:
        return value is None
    plain = {bool: (bool,), int: (int,), float: (int, float), str: (str,), list: (list,), dict: (dict,)}
    kind = plain.get(origin or annotation)
    if kind is None:
        return not (isinstance(annotation, type) and issubclass(annotation, enum.Enum)) or value in {
            m.value for m in annotation
        }
    return isinstance(value, kind) and not (isinstance(value, bool) and bool not in kind)


def build_config(config_class: type, kwargs: Mapping[str, Any], overrides: Mapping[str, Any]) -> Any:
    """``config_class(**kwargs, **overrides)`` (checked as :func:`apply_trl_overrides` does); a
    pass-through value of the wrong type for its field, or a value the config refuses, is a
    :class:`~balcaprl.errors.ConfigError` naming the field that set it: the one whose absence lets the
    config build (the pass-through fields are tried first)."""
    merged = apply_trl_overrides(kwargs, overrides, config_class)
    hints = typing.get_type_hints(config_class)
    for name, value in overrides.items():
        if not _fits(value, hints[name]):
            wanted = hints[name].__name__ if isinstance(hints[name], type) else str(hints[name])
            raise ConfigError(f"{KEY}.{name}: {value!r} is not a {wanted} (TRL's {config_class.__name__})")
    try:
        return config_class(**merged)
    except (ValueError, TypeError) as error:
        reason = " ".join(str(error).split())
    for name in [*overrides, *kwargs]:
        try:
            config_class(**{k: v for k, v in merged.items() if k != name})
        except (ValueError, TypeError):
            continue
        if name in overrides:
            message = f"{KEY}.{name}: {config_class.__name__} refuses {merged[name]!r} ({reason})"
        else:
            message = (
                f"TRL's {config_class.__name__} refuses {name}={merged[name]!r}, which the recipe sets "
                f"({reason}); docs/recipes.md lists the recipe's settings"
            )
        raise ConfigError(message)
    where = f"{KEY} ({', '.join(overrides)}) with the recipe" if overrides else "the recipe"
    raise ConfigError(f"{where}: TRL's {config_class.__name__} refuses these settings ({reason})")
