"""Judge rubrics as package data: composed from the small Markdown parts under ``parts/``.

Why parts: the training and evaluation rubrics differ only in how `pointable`/`visible` are decided
(the paper's Appendix "Training Prompt" vs "Evaluation Prompt (b-CapScore)"), the "w/o pointability"
ablation only in leaving the pointability test out, and the two reference modes only in the recall
step and the answer format. How a text is split into atomic assertions is one part, read by the
caption step, the joint-mode reference step and the cached-reference decomposition alike. Keeping each
fact in one file means the variants cannot drift apart. ``docs/rubrics.md`` compares every rule with
the paper's prompts.

Every composed rubric carries a version, ``<name>-v<declared>-<reference mode>+<hash>``: the declared
version from ``manifest.toml`` plus the first 10 hex digits of the composed text's sha256. The judge
cache puts it into its keys, so an edited rubric never reuses verdicts judged under the old text.
The text is exactly what the judge reads: nothing in it exists for tools or tests.
"""

from __future__ import annotations

import hashlib
import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Literal, get_args

__all__ = [
    "REFERENCE_MODES",
    "RUBRIC_NAMES",
    "VERDICT_RUBRICS",
    "ReferenceMode",
    "Rubric",
    "VerdictRubric",
    "load_rubric",
    "training_rubric_name",
]

ReferenceMode = Literal["joint", "cached-reference"]
REFERENCE_MODES: tuple[str, ...] = get_args(ReferenceMode)
# The verdict judge's rubrics (a JudgeRequest names one). Under "training_without_pointability" the
# judge is not asked about pointability at all, and every verdict carries `pointable: true` for each
# caption assertion: nothing was judged, so nothing is excluded (the ablation scores `visible` alone).
VerdictRubric = Literal["training", "evaluation", "training_without_pointability"]
VERDICT_RUBRICS: tuple[str, ...] = get_args(VerdictRubric)
RUBRIC_NAMES: tuple[str, ...] = (
    *VERDICT_RUBRICS,
    "reference_decomposition",
    "reference_decomposition_with_image",
    "recaption",
    "recaption_strict",
    # the evaluation protocols' judge steps (balcaprl.evaluate)
    "dcscore_extract",
    "dcscore_match",
    "dcscore_verify",
    "captionqa_answer",
    "caparena_compare",
)


@dataclass(frozen=True)
class Rubric:
    """One composed rubric: its text (the judge's system message) and the version for cache keys."""

    name: str
    reference_mode: str
    version: str
    text: str


def _files():
    return resources.files(__name__)


@cache
def _manifest() -> dict:
    return tomllib.loads(_files().joinpath("manifest.toml").read_text(encoding="utf-8"))


@cache
def _part(name: str) -> str:
    path = _files().joinpath("parts", f"{name}.md")
    if not path.is_file():
        raise FileNotFoundError(
            f"rubric part '{name}' is listed in rubrics/manifest.toml but parts/{name}.md does not exist"
        )
    return path.read_text(encoding="utf-8").strip()


@cache
def load_rubric(name: str, reference_mode: str = "joint") -> Rubric:
    """Compose rubric ``name`` for ``reference_mode`` (ignored by rubrics without mode slots).

    Raises ``ValueError`` naming the valid choices for an unknown name or mode.
    """
    manifest = _manifest()
    if name not in RUBRIC_NAMES or name not in manifest:
        raise ValueError(f"unknown rubric '{name}'; choose one of {', '.join(RUBRIC_NAMES)}")
    if reference_mode not in REFERENCE_MODES:
        raise ValueError(
            f"unknown reference mode '{reference_mode}'; choose one of {', '.join(REFERENCE_MODES)}"
        )
    entry = manifest[name]
    slots = manifest["slots"][reference_mode]
    texts: list[str] = []
    uses_slots = False
    for part in entry["parts"]:
        if part.startswith("{") and part.endswith("}"):
            uses_slots = True
            texts.extend(_part(p) for p in slots[part[1:-1]])
        else:
            texts.append(_part(part))
    mode = reference_mode if uses_slots else "any"
    text = "\n\n".join(texts) + "\n" if texts else ""  # no parts: no system message (recaption)
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:10]
    return Rubric(
        name=name, reference_mode=mode, version=f"{name}-v{entry['version']}-{mode}+{digest}", text=text
    )


def training_rubric_name(pointability: bool) -> VerdictRubric:
    """The rubric a training run's judge reads: the paper's training rubric, or, for the "w/o
    pointability" ablation (``RewardConfig.pointability = False``), the same rubric with the
    pointability test removed from the prompt, as the paper's ablation removes it."""
    return "training" if pointability else "training_without_pointability"
