"""A model, processor or tokenizer named by a local folder or a Hugging Face hub id.

``from_pretrained`` takes either, and treats anything that is not an existing folder as a hub id: a
mistyped local path (``runs/ckpt-final`` for ``runs/ckpt_final``) goes to the hub, which retries it
for minutes when offline before failing. :func:`check_model_path` decides first, without the
network, whether the value can only mean a local path, and refuses one that does not exist.

A value means a local path when it starts with ``.``, ``/`` or ``~``; when it has more than one
``/`` (a hub id is ``name`` or ``org/name``); or when its first path component exists here
(``runs/nope`` where ``runs/`` is a folder of the working directory). Anything else (``gpt2``,
``Qwen/Qwen2.5-VL-3B-Instruct``) is left to the hub.

Every command that loads a model or tokenizer by such a name calls it: ``caption --model``, the
``--tokenizer`` of ``verl export``, ``data prepare``, ``data info`` and ``data recaption``,
``synthetic build --policy``, ``evaluate-general --model`` (when lmms-eval runs here) and ``train``'s
``model.path``. (``verl launch`` does not: its ``model.path`` is read on the cluster's nodes.)
"""

from __future__ import annotations

from pathlib import Path

from balcaprl.errors import MissingInputError

LOCAL_PREFIXES = (".", "/", "~")


def names_local_path(value: str | Path) -> bool:
    """Whether ``value`` can only be a local path, never a hub id (module docstring)."""
    text = str(value)
    if text.startswith(LOCAL_PREFIXES) or text.count("/") > 1:
        return True
    first = text.split("/", 1)[0]
    return bool(first) and Path(first).exists()


def check_model_path(value: str | Path, what: str) -> str:
    """``value`` as a string, after refusing a local path that does not exist: a
    :class:`~balcaprl.errors.MissingInputError` naming ``what`` (the flag or key), e.g.
    ``--model runs/nope: no such folder; give a checkpoint folder or a hub id``. A hub id passes
    unchecked (no network here)."""
    text = str(value)
    if names_local_path(text) and not Path(text).expanduser().exists():
        raise MissingInputError(f"{what} {text}: no such folder; give a checkpoint folder or a hub id")
    return text
