"""The errors a user can cause, as opposed to bugs.

A :class:`UserError` is an anticipated mistake in what the user gave: a flag, a file, a config key,
a folder that already holds results. Its message names the input and says what to do; the command
line prints it on one line and exits with status 2, without a traceback. Anything else that escapes
is a bug and keeps its traceback.

Two of them also carry the built-in type a library caller may already catch:
:class:`MissingInputError` is a ``FileNotFoundError`` and :class:`OutputError` an ``OSError``.
"""

from __future__ import annotations


class UserError(Exception):
    """A mistake in the user's input; the message names the input and what to do about it."""


class ConfigError(UserError, ValueError):
    """A config file, section or override that cannot be used; the message names the key."""


class InputError(UserError, ValueError):
    """An input file or folder that cannot be used; the message names it (and the line, where known)."""


class MissingInputError(InputError, FileNotFoundError):
    """An input file or folder that does not exist (or is not a finished one of its kind)."""


class OutputError(UserError, OSError):
    """An output place that cannot be written: read-only, a file where a folder should be, in use."""
