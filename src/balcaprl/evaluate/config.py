"""The evaluation config of ``balcaprl evaluate --config``: benchmark files, judges, protocol settings.

    judge: judges/gpt-4o.yaml            # default judge config for every protocol
    bcapscore: {annotations: decapbench/IIW_400_data.jsonl, images: decapbench/images,
                judge: judges/gpt-5.4.yaml}
    dcscore:   {annotations: decapbench/IIW_400_data.jsonl, images: decapbench/images}
    captionqa: {questions: captionqa/all.parquet, judge: judges/qwen2.5-72b.yaml}
    caparena:  {annotations: caparena/caparena_auto_600.json, images: caparena/images}
    official:                            # the benchmarks' own prompts (else our paraphrase)
      decapbench: ~/src/DeCapBench       # a checkout of MAGAer13/DeCapBench
      caparena: ~/src/CapArena           # a checkout of njucckevin/CapArena
      captionqa: lmms-eval               # lmms-eval's captionqa task (extra [captionqa])

Relative paths in a file are relative to that file (also through ``base:`` chains). A judge is a
judge config, inline or the path of a judge YAML, validated when the evaluation config loads. Loaded
with the common machinery (:func:`balcaprl.config.load_config`): unknown keys are errors naming their
dotted path, overrides are ``key.sub=value`` (or typed ``(key.sub, value)`` pairs from flags).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import Field, create_model

from balcaprl.config import Override, Section, load_config
from balcaprl.evaluate import bcapscore, caparena, captionqa, dcscore
from balcaprl.evaluate.official import OfficialSources
from balcaprl.evaluate.protocols import Protocol
from balcaprl.judge.config import JudgeConfig, JudgeSection

# The table of protocols, in the suite's default order: each is one object with one signature
# (balcaprl.evaluate.protocols); the config's sections, the suite and the command line are read from it.
PROTOCOLS: dict[str, Protocol] = {
    p.name: p for p in (bcapscore.PROTOCOL, dcscore.PROTOCOL, captionqa.PROTOCOL, caparena.PROTOCOL)
}


class _Evaluation(Section):
    judge: JudgeSection | None = Field(None, description="Default judge config (inline or a YAML path).")
    official: OfficialSources = Field(
        default_factory=OfficialSources,
        description="Where the benchmarks' official prompts are read from at run time (unset: our paraphrase).",
    )

    def judge_for(self, protocol: str) -> JudgeConfig | None:
        """The protocol's own judge, else the default one (None when neither is set)."""
        return getattr(self, protocol).judge or self.judge


# one section per protocol of the table, named after it
EvaluationConfig = create_model(
    "EvaluationConfig",
    __base__=_Evaluation,
    __doc__="Benchmark files, judges and protocol settings for `balcaprl evaluate` (unknown keys are errors).",
    **{
        name: (p.section, Field(default_factory=p.section, description=p.title))
        for name, p in PROTOCOLS.items()
    },
)


def _resolve_paths(data: dict[str, Any], folder: Path) -> dict[str, Any]:
    """Paths written in an evaluation config file are relative to that file."""
    out = dict(data)
    if isinstance(out.get("judge"), str):
        out["judge"] = str(folder / Path(out["judge"]).expanduser())
    for name, protocol in PROTOCOLS.items():
        section = out.get(name)
        if isinstance(section, dict):
            out[name] = {
                key: str(folder / Path(value).expanduser())
                if (key == "judge" or key in protocol.section.INPUTS) and isinstance(value, str)
                else value
                for key, value in section.items()
            }
    official = out.get("official")
    if isinstance(official, dict):
        out["official"] = {
            key: value
            if not isinstance(value, str) or value == "lmms-eval"
            else str(folder / Path(value).expanduser())
            for key, value in official.items()
        }
    return out


def flag_overrides(values: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """Typed overrides from nested command-line flag values (``{"dcscore": {"annotations": path}}``);
    ``None`` means the flag was not given and is left out."""
    items: list[tuple[str, Any]] = []
    for key, value in values.items():
        if isinstance(value, Mapping):
            items += flag_overrides(value, f"{prefix}{key}.")
        elif value is not None:
            items.append((f"{prefix}{key}", str(value) if isinstance(value, Path) else value))
    return items


def load_evaluation_config(
    path: Path | str | None = None, overrides: Iterable[Override] | Mapping[str, Any] = ()
) -> EvaluationConfig:
    """The config from ``path`` (relative paths resolved against its folder), then ``overrides``:
    ``key.sub=value`` strings or typed pairs, or a mapping of flag values (see :func:`flag_overrides`).

    Raises :class:`balcaprl.errors.ConfigError` naming every bad key.
    """
    items = flag_overrides(overrides) if isinstance(overrides, Mapping) else overrides
    return load_config(EvaluationConfig, path, items, what="evaluation config", resolve_paths=_resolve_paths)
