"""Synthetic-world commands (`balcaprl synthetic ...`), registered on the main app."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add this area's commands to ``app`` (filled in by the synthetic-world work, issue 4)."""
