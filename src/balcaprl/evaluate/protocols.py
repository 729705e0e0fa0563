"""The one interface every evaluation protocol has: a :class:`Protocol` record and its config section.

A protocol (b-CapScore, DCScore, CaptionQA, CapArena-Auto) is one object in its own module:

    PROTOCOL = Protocol(name="dcscore", benchmark="decapbench", title="DCScore (DeCapBench).",
                        section=DCScoreSection, read=lambda s: read_decapbench(s.annotations), run=run_dcscore)

and ``run_dcscore(judge, rows, captions, out_dir, section, *, on_progress, prompts, label)`` has the
one signature every protocol's ``run`` has: the judge is what ``client`` makes of the protocol's
judge config (a :class:`~balcaprl.judge.JudgeCaller`, or b-CapScore's verdict judge), the section
carries the input files and options, ``prompts`` the official prompts when configured.
The table of protocols is :data:`balcaprl.evaluate.config.PROTOCOLS`; the evaluation config, the
suite and ``balcaprl evaluate`` read it, so a new protocol is its own module plus its line in that
table (as verl's ``register_adv_est`` keeps its estimators behind one signature).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field

from balcaprl.config import Section
from balcaprl.errors import InputError
from balcaprl.evaluate.official import OfficialSources
from balcaprl.evaluate.results import ProtocolResult
from balcaprl.judge.calls import JudgeCaller
from balcaprl.judge.config import JudgeSection


class ProtocolSection(Section):
    """A protocol's section of the evaluation config: its judge, its input files and its options
    (which the run records as its ``settings``)."""

    # input key -> (what the file is, the `balcaprl evaluate` flag that sets it); each is required, and
    # a relative path in a config file is relative to that file
    INPUTS: ClassVar[Mapping[str, tuple[str, str]]] = {}

    judge: JudgeSection | None = Field(
        None, description="Judge config for this protocol (inline or a YAML path); null: the default judge."
    )

    def options(self) -> dict[str, Any]:
        """The protocol's options (everything but the judge and the input files)."""
        return self.model_dump(exclude={"judge", *self.INPUTS})


class OfficialPromptSection(ProtocolSection):
    """The section of a protocol that can run with its benchmark's official prompts."""

    guard: bool = Field(
        False,
        description="With the official prompts: fill each slot with an escaped data block and clean and strip "
        "each text (not comparable: the official code sends the texts as they are). Our prompts always do.",
    )


@dataclass(frozen=True)
class Protocol:
    name: str
    benchmark: str  # whose captions it scores (``--captions BENCHMARK=FILE``)
    title: str  # the config section's description
    section: type[ProtocolSection]
    read: Callable[[Any], Any]  # section -> benchmark rows; an InputError names the bad row
    # run(judge, rows, captions, out_dir, section, *, on_progress, prompts, label) -> ProtocolResult
    run: Callable[..., ProtocolResult]
    # (judge config, image_root=, http_client=) -> the judge that `run` is given
    client: Callable[..., Any] = JudgeCaller
    official_prompts: Callable[[OfficialSources], Any] = lambda official: None  # None: our paraphrase
    official_options: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)

    def load(self, section: ProtocolSection) -> Any:
        """The benchmark rows, after checking that every input is given and exists (one-line errors)."""
        for key, (what, flag) in self.section.INPUTS.items():
            value = getattr(section, key)
            if value is None:
                raise InputError(
                    f"{self.name} needs {what}: pass {flag}, set `{self.name}: ...` in --config, or leave "
                    f"{self.name} out of --suite"
                )
            if not Path(value).exists():
                raise InputError(f"{self.name}: {what} {value} does not exist")
        return self.read(section)
