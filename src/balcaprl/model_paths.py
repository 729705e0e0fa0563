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

Offline, a hub id must not wait on the hub either: the hub's client retries an unreachable host for
minutes (five retries, three minutes for one tokenizer). :func:`hub_unreachable` says at once why the
hub cannot be used (offline mode set, or its host refuses or ignores a connection for 3 s), and
:func:`check_model_path` then accepts a hub id only when the local cache holds it (exit status 2 and a
local-cache message otherwise, before any output is written) and switches the process to the
cache alone, so no later load waits on the hub either.
"""

from __future__ import annotations

import functools
import os
import socket
from pathlib import Path
from urllib.parse import urlsplit

from balcaprl.errors import MissingInputError

HUB_PROBE_TIMEOUT_S = 3.0
_PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")

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
    when the hub can be used; when it cannot (:func:`hub_unreachable`, a few seconds at most), it
    passes only if the local cache holds it, and later loads then read that cache alone."""
    text = str(value)
    if names_local_path(text):
        if not Path(text).expanduser().exists():
            raise MissingInputError(f"{what} {text}: no such folder; give a checkpoint folder or a hub id")
        return text
    offline = hub_unreachable()
    if offline is not None:  # the hub would be retried for minutes: the local cache or nothing
        if not in_local_cache(text):
            raise MissingInputError(
                f"{what} {text}: not in the local Hugging Face cache, and the hub cannot be used "
                f"({offline}); give a local folder holding the model, or download it where the hub is "
                "reachable"
            )
        use_local_cache_only()
    return text


def in_local_cache(repo_id: str) -> bool:
    """Whether the local Hugging Face cache holds a snapshot of ``repo_id`` (a model's config or a
    tokenizer's), read from the disk alone."""
    from huggingface_hub import try_to_load_from_cache

    for filename in ("config.json", "tokenizer_config.json", "preprocessor_config.json"):
        try:
            found = try_to_load_from_cache(repo_id, filename)
        except ValueError:  # not a valid repo id: nothing of it can be cached
            return False
        if isinstance(found, str):
            return True
    return False


def use_local_cache_only() -> None:
    """Every later load in this process reads the local cache only (the hub's offline mode), so a
    cached model loads at once instead of after the client's retries on an unreachable host."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        from huggingface_hub import constants
    except ImportError:  # pragma: no cover - huggingface_hub comes with transformers
        return
    constants.HF_HUB_OFFLINE = True  # read at import; the client asks this attribute at every call


def hub_unreachable() -> str | None:
    """Why the Hugging Face hub cannot be used now, or None when it may be: offline mode is set
    (``HF_HUB_OFFLINE``/``TRANSFORMERS_OFFLINE``), or a TCP connection to its host (``HF_ENDPOINT``)
    fails within 3 s. Behind a proxy (``HTTPS_PROXY`` ...) the hub is assumed reachable."""
    for variable in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(variable, "").strip().upper() in ("1", "ON", "YES", "TRUE"):
            return f"{variable} is set"
    if any(os.environ.get(variable) for variable in _PROXY_VARIABLES):
        return None
    return _probe(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")


@functools.lru_cache(maxsize=8)  # once per endpoint and process: every loader asks
def _probe(endpoint: str) -> str | None:
    url = urlsplit(endpoint)
    host, port = url.hostname or "", url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=HUB_PROBE_TIMEOUT_S).close()
    except OSError as error:
        reason = error.strerror or type(error).__name__
        return f"{host}:{port} cannot be reached: {reason}"
    return None
