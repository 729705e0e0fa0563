"""docs/prompts/ shows every prompt the judge is sent, whole, and is current with the rubric parts."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from balcaprl.judge import rubrics
from balcaprl.judge.rubrics import REFERENCE_MODES, RUBRIC_NAMES, load_rubric

ROOT = Path(__file__).resolve().parents[2]
PAGES = ROOT / "docs" / "prompts"


def load_script():
    spec = importlib.util.spec_from_file_location(
        "render_prompt_docs", ROOT / "scripts" / "render_prompt_docs.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_prompts_are_current():
    expected = load_script().pages()
    on_disk = {path.name: path.read_text() for path in PAGES.glob("*.md")}
    stale = sorted(name for name in expected if on_disk.get(name) != expected[name])
    extra = sorted(set(on_disk) - set(expected))
    assert not stale and not extra, (
        f"docs/prompts is stale (pages {stale}, no longer generated {extra}): python scripts/render_prompt_docs.py"
    )


def test_every_composed_prompt_has_its_page_with_its_whole_text():
    on_disk = {path.name: path.read_text() for path in PAGES.glob("*.md")}
    variants = {(name, load_rubric(name, mode).version, load_rubric(name, mode).text)
                for name in RUBRIC_NAMES for mode in REFERENCE_MODES}  # fmt: skip
    # 6 verdict-rubric variants (3 rubrics x 2 modes) and 9 rubrics that read alike in both modes
    assert len(variants) == 15 and len(on_disk) == 16  # and the index
    for name, version, text in variants:
        (page,) = [page for page in on_disk.values() if f"Version: `{version}`." in page]
        assert page.startswith(f"# `{name}`") and text.rstrip() in page
        assert f"`{version}`" in on_disk["README.md"]


def test_an_edited_part_makes_the_pages_stale(monkeypatch):
    original = rubrics._part
    monkeypatch.setattr(
        rubrics, "_part", lambda part: original(part) + (" Be brief." if part == "linguistic" else "")
    )
    load_rubric.cache_clear()
    try:
        edited = load_script().pages()
    finally:
        monkeypatch.undo()
        load_rubric.cache_clear()
    changed = sorted(name for name, text in edited.items() if (PAGES / name).read_text() != text)
    # every verdict rubric reads the linguistic part (and the index lists their new versions)
    assert changed == sorted(
        ["README.md", *(f"{r}.{m}.md" for r in rubrics.VERDICT_RUBRICS for m in REFERENCE_MODES)]
    )
