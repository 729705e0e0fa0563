"""Rewrite configs/verl/*.overrides from the recipes (run after changing a recipe or the renderer).

python scripts/verl/render_reference_configs.py
"""

from __future__ import annotations

from pathlib import Path

from balcaprl.train.verl_backend.render import REFERENCE_RENDERINGS, reference_rendering

ROOT = Path(__file__).resolve().parents[2]

if __name__ == "__main__":
    for name in REFERENCE_RENDERINGS:
        target = ROOT / "configs" / "verl" / name
        target.write_text(reference_rendering(ROOT, name))
        print(f"wrote {target.relative_to(ROOT)}")
