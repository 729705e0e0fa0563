#!/usr/bin/env python3
"""Write the world-parameter table of docs/synthetic-world.md from the code
(balcaprl.demo.parameters.WORLD_PARAMETERS, each value read from where it is set); run it after changing
a world constant, a demo default or an entry. tests/synthetic/test_world_parameters.py checks it is current.

    PYTHONPATH=src python scripts/render_world_parameters.py
"""

from __future__ import annotations

from pathlib import Path

from balcaprl.demo.parameters import with_parameter_table

TARGET = Path(__file__).resolve().parents[1] / "docs" / "synthetic-world.md"

if __name__ == "__main__":
    TARGET.write_text(with_parameter_table(TARGET.read_text(encoding="utf-8")), encoding="utf-8")
    print(f"wrote the parameter table of {TARGET.name}")
