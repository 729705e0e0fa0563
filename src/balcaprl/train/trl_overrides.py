"""``train.trl_overrides``: TRL settings the recipe does not name, passed through to ``GRPOConfig``
(the TRL backend's counterpart of ``balcaprl verl launch --verl-override``).

Checked before anything is loaded: a name that is not a ``GRPOConfig`` field of the installed TRL is
refused with the closest field names (a typo would otherwise surface as TRL's TypeError, or not at
all); a field the recipe sets itself is refused too, naming the recipe's own setting route, so one
value never has two places and ``recipe.yaml`` stays the whole truth of a run.
"""

from __future__ import annotations

import dataclasses
import difflib
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
