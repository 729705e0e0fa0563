"""The errors a user can cause, as opposed to bugs.

A :class:`UserError` is an anticipated mistake in what the user gave: a flag, a file, a config key,
a folder that already holds results. Its message names the input and says what to do; the command
line prints it on one line and exits with status 2, without a traceback. Anything else that escapes
is a bug and keeps its traceback.
"""

from __future__ import annotations

__all__ = ["ConfigError", "InputError", "UserError"]


class UserError(Exception):
    """A mistake in the user's input; the message names the input and what to do about it."""


class ConfigError(UserError, ValueError):
    """A config file, section or override that cannot be used; the message names the key."""


class InputError(UserError, ValueError):
    """An input file or folder that cannot be used; the message names it (and the line, where known)."""
