"""Which packaged rubric a system message is, told from the text alone (for the loopback server).

Production prompts carry nothing that names their rubric; a test double recognises one by comparing
the system message exactly with every rubric the package can compose (each name, each reference
mode). A system message that is not exactly one of them is foreign: None. A rubric without text
(the paper's re-captioning sends no system message) cannot be recognised this way and is left out.
"""

from __future__ import annotations

from functools import cache

from balcaprl.judge.rubrics import REFERENCE_MODES, RUBRIC_NAMES, load_rubric


@cache
def _names_by_text() -> dict[str, str]:
    names: dict[str, str] = {}
    for name in RUBRIC_NAMES:
        for mode in REFERENCE_MODES:
            text = load_rubric(name, mode).text
            if not text:
                continue
            if names.setdefault(text, name) != name:  # two rubrics with one text could not be told apart
                raise RuntimeError(f"rubrics '{names[text]}' and '{name}' compose to the same text")
    return names


def packaged_rubric_name(system_text: str) -> str | None:
    """The name of the packaged rubric whose text ``system_text`` is, or None."""
    return _names_by_text().get(system_text)
