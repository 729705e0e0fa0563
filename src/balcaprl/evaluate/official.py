"""The benchmarks' official prompts, read at run time from the user's own copy of each benchmark's code,
and what every summary records about the prompts that ran.

balcaprl does not ship the benchmarks' prompt texts. By default each protocol runs with our own
wording (rubric parts under ``judge/rubrics``, labelled ``paraphrase``); numbers from it are not
comparable with published tables. For comparable numbers, name the official sources in the evaluation
config::

    official:
      decapbench: /path/to/DeCapBench   # a checkout of MAGAer13/DeCapBench
      caparena: /path/to/CapArena       # a checkout of njucckevin/CapArena
      captionqa: lmms-eval              # the installed lmms-eval (extra [captionqa]), or a checkout path

- **DeCapBench** (DCScore): ``eval/evaluation_decapbench.py``, read with :mod:`ast` (never imported:
  no code of theirs runs, and their imports, torch and an API client, are not needed): the module-level
  strings ``extract_prompt`` (slot ``{caption}``), ``match_prompt`` (``{predicted_atomic_facts}``,
  ``{oracle_atomic_facts}``) and ``verify_prompt`` (``{reference_caption}``, ``{atomic_facts}``), and
  the system message, the default of ``run_gpt_text``'s ``sys_prompt`` parameter.
- **CapArena**: ``vlm_as_a_judge.py``, read with :mod:`ast`: the module-level string
  ``system_prompt_with_ref`` (the system message) and the f-string assigned to ``compare_prompt`` in
  the ``if with_ref:`` branch of ``mllm_judge_pairs`` (slots ``{caption_1}``, ``{caption_2}``,
  ``{caption_ref}``), rebuilt as a template.
- **CaptionQA**: lmms-eval's ``captionqa`` task (``lmms_eval/tasks/captionqa/utils.py``), loaded by
  its file path (importing it through the package would pull torch and a dozen more packages; the
  file itself needs only ``requests``, ``datasets`` and ``loguru``): ``QA_SYSTEM_PROMPT``,
  ``CANNOT_ANSWER_TEXT``, ``build_caption_qa_prompt``, ``extract_letter``, ``add_cannot_answer_option``.

Every name and slot is checked when the run starts, before any paid call: a missing file, name or
slot is a :class:`~balcaprl.errors.ConfigError` naming the file and what is missing. What ran is
recorded (:class:`PromptSource`): the file, the git commit when the checkout is a git work tree (and
whether the file differs from it), the sha256 of the file and, when it is a published version we know,
which one.

The requests go as the official code sends them: the official texts with each slot filled with
the value as it is (captions, references, facts neither cleaned nor stripped), the message shapes
and the token field (``max_tokens``) of the official request, in the official key order and
serialised as the official client serialises them (:class:`OfficialBody`), so the bytes are the
official ones for a given client version. :func:`scoring_rules` records the rules each number was
scored under and every deviation from the official ones. The one option, ``guard`` (off by
default, recorded in the summary's settings when on, and then not comparable), fills every slot with
an escaped data block (:func:`balcaprl.judge.prompt.data_block`: the value between ``<slot>`` and
``</slot>`` lines, with ``&``, ``<`` and ``>`` HTML-escaped) and cleans each text first
(:func:`official_text`), so no caption can end its slot and speak to the judge.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
import json
import os
import string
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from balcaprl.config import Section
from balcaprl.errors import ConfigError
from balcaprl.files import unicode_refusal
from balcaprl.judge.prompt import clean_text, data_block
from balcaprl.judge.protocol import JudgeFailure

OFFICIAL_TEXT_CHANGE = (
    "guard: each slot of the official template is filled with an escaped data block (the value between "
    "<slot> and </slot> lines, with &, < and > HTML-escaped) and each text is cleaned (control characters "
    "removed) and stripped; nothing else in the official text is changed"
)

# sha256 of the published files (so a summary can say which published version ran).
_PUBLISHED = {
    "decapbench": {
        "33c62e1a6a3966e8777cc160fe63ed4ce705616758f0e62540466983153411b1": (
            "MAGAer13/DeCapBench@9f3fb10896608e5134b3f7966d8b1b7f93f47835"
        ),
    },
    "caparena": {
        "66539ce910b9f7b7ca0e06eaf3c27c983b5b3fb7e1b7441cf73f1de461a68411": (
            "njucckevin/CapArena@c251cdd14a3a4a33c6934e53feebb8d4862d655d (unchanged since 26d75da1)"
        ),
    },
    "captionqa": {
        "46a1fb64622c4da453365338ac60a79343c298cc441142f2966f3b9c1fe0eab0": "lmms-eval v0.6 to v0.7.2 (git)",
        "bcaae2872bfad42a7965f7c9e6df4c063f52e52d73133fd565093932b22b7760": "lmms-eval 0.7.3 (PyPI wheel)",
    },
}

# The official scripts send images at their own size (then the API fits them for ``detail: high``).
OFFICIAL_IMAGE_SIDE = 1 << 16
# DeCapBench's verification re-encodes every image as JPEG at PIL's default quality.
DECAPBENCH_JPEG_QUALITY = 75

# The judge each benchmark's own scorer uses (b-CapScore: the judge of the paper's Table 1).
OFFICIAL_JUDGES = {
    "dcscore": "gpt-4o-2024-05-13",
    "caparena": "gpt-4o-2024-08-06",
    "captionqa": "Qwen/Qwen2.5-72B-Instruct",
    "bcapscore": "gpt-5.4",
}

_LIGHT_INSTALL = "pip install 'balcaprl[captionqa]' (or, without lmms-eval's heavy dependencies: pip install --no-deps 'lmms-eval>=0.6,<0.8' requests loguru datasets)"


class OfficialSources(Section):
    """Where the official prompts come from; a benchmark left out runs with our paraphrased prompts."""

    decapbench: Path | None = Field(
        None,
        description="A local checkout of MAGAer13/DeCapBench: DCScore's prompts are read from its "
        "eval/evaluation_decapbench.py when the run starts (null: our paraphrase).",
    )
    caparena: Path | None = Field(
        None,
        description="A local checkout of njucckevin/CapArena: the pairwise prompt is read from its "
        "vlm_as_a_judge.py when the run starts (null: our paraphrase).",
    )
    captionqa: str | None = Field(
        None,
        description="'lmms-eval': the installed lmms-eval's captionqa task (extra [captionqa]); or the path "
        "of an lmms-eval checkout or of its lmms_eval/tasks/captionqa/utils.py (null: our paraphrase).",
    )

    @field_validator("captionqa")
    @classmethod
    def _expand(cls, value: str | None) -> str | None:
        return value if value in (None, "lmms-eval") else str(Path(value).expanduser())


# ----------------------------------------------------------------------------------------- provenance


@dataclass(frozen=True)
class PromptSource:
    """Which prompts ran: ``official`` (read from ``file``) or our ``paraphrase`` (rubric versions)."""

    kind: str  # "official" | "paraphrase"
    benchmark: str
    file: str | None = None
    commit: str | None = None  # the checkout's HEAD, when it is a git work tree tracking the file
    modified: bool | None = None  # the file differs from that commit
    sha256: str | None = None
    published: str | None = None  # the published version with this sha256, when we know it
    version: str | None = None  # the installed package's version (lmms-eval)
    names: tuple[str, ...] = ()  # what was read from the file
    change: str | None = None  # the change to the official text (only with the guard on)
    rubrics: dict[str, str] = field(default_factory=dict)  # paraphrase: rubric -> version

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["names"] = list(self.names)
        return {k: v for k, v in data.items() if v not in (None, {}, [])}

    def ran(self, guard: bool) -> PromptSource:
        """This source as it ran: with the guard on, the change it made to the official text."""
        return replace(self, change=OFFICIAL_TEXT_CHANGE) if guard and self.kind == "official" else self


def official_text(text: str, guard: bool) -> str:
    """A text (caption, reference) for an official request: as it is, as the official code sends it;
    with the guard on, cleaned and stripped."""
    return clean_text(text).strip() if guard else text


def unicode_failure(
    texts: Iterable[tuple[str, str]], where: str, *, official: bool, guard: bool
) -> JudgeFailure | None:
    """A ``bad_input`` failure naming what and where (:func:`~balcaprl.files.unicode_refusal`) for a
    row with a text, among its ``(what, text)`` pairs, that is not valid Unicode (a lone surrogate);
    such a row is never sent. Our prompts and the guard clean every text they send, which would put
    U+FFFD in the surrogate's place and have the judge score a text nobody wrote. The official
    prompts without the guard send every text as the official code does, as it is: JSON-escaped
    (``\\ud83d``, :func:`~balcaprl.judge.calls.json_bytes`), so there the row is judged (None)."""
    if official and not guard:
        return None
    reason = unicode_refusal(texts, where)
    return None if reason is None else JudgeFailure("bad_input", reason)


def paraphrase_source(benchmark: str, rubrics: Sequence[str]) -> PromptSource:
    """Our own wording: the packaged rubrics' names and versions."""
    from balcaprl.judge.rubrics import load_rubric

    return PromptSource("paraphrase", benchmark, rubrics={r: load_rubric(r).version for r in rubrics})


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _git(root: Path, *args: str) -> str | None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    try:
        done = subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=20, env=env, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def _git_state(file: Path) -> tuple[str | None, bool | None]:
    """``(commit, modified)`` of the git work tree holding ``file``; ``(None, None)`` when none tracks it."""
    folder = file.parent
    if _git(folder, "ls-files", "--error-unmatch", file.name) is None:
        return None, None
    commit = (_git(folder, "rev-parse", "HEAD") or "").strip() or None
    status = _git(folder, "status", "--porcelain", "--", file.name)
    return commit, (None if status is None else bool(status.strip()))


def _source(benchmark: str, file: Path, names: Sequence[str], version: str | None = None) -> PromptSource:
    digest = _sha256(file)
    commit, modified = _git_state(file)
    return PromptSource(
        "official", benchmark, file=str(file), commit=commit, modified=modified, sha256=digest,
        published=_PUBLISHED.get(benchmark, {}).get(digest), version=version, names=tuple(names),
    )  # fmt: skip


# ----------------------------------------------------------------------------------------- templates


def _slots(text: str) -> list[str]:
    return [name for _, name, _, _ in string.Formatter().parse(text) if name is not None]


@dataclass(frozen=True)
class Template:
    """An official ``str.format`` template whose slots are known."""

    name: str
    text: str
    slots: tuple[str, ...]

    def fill(self, *, guard: bool = False, **values: str) -> str:
        """The template with each slot's value as it is, as the official code fills it; with ``guard``,
        as an escaped data block tagged with the slot's name (:data:`OFFICIAL_TEXT_CHANGE`)."""
        if set(values) != set(self.slots):
            raise ValueError(f"{self.name} needs exactly {sorted(self.slots)}, got {sorted(values)}")
        if guard:
            values = {slot: data_block(slot, value) for slot, value in values.items()}
        return self.text.format(**values)


def _checked_template(name: str, text: str, slots: Sequence[str], where: Path) -> Template:
    found = _slots(text)
    missing = [s for s in slots if s not in found]
    extra = sorted({s for s in found if s not in slots})
    if missing or extra:
        problems = []
        if missing:
            problems.append(f"has no slot {', '.join('{' + s + '}' for s in missing)}")
        if extra:
            problems.append(f"has unexpected slots {', '.join('{' + s + '}' for s in extra)}")
        raise ConfigError(f"{where}: `{name}` {' and '.join(problems)}; is this the official file?")
    try:
        text.format(**dict.fromkeys(slots, ""))
    except (IndexError, KeyError, ValueError) as error:
        raise ConfigError(f"{where}: `{name}` is not a format template ({error})") from None
    return Template(name, text, tuple(slots))


# ----------------------------------------------------------------------------------------- ast reading


def _parse(file: Path, what: str) -> ast.Module:
    if not file.is_file():
        raise ConfigError(
            f"{what}: {file} does not exist; give the path of a checkout of the official repository"
        )
    try:
        return ast.parse(file.read_text(encoding="utf-8"), filename=str(file))
    except (OSError, UnicodeDecodeError, SyntaxError) as error:
        raise ConfigError(f"{what}: {file} cannot be read as Python ({error})") from None


def _module_string(tree: ast.Module, name: str, file: Path) -> str:
    """The last module-level ``name = "..."`` (a plain string constant, as published)."""
    value = None
    for node in tree.body:
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign)
            else []
        )
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            value = node.value
    if value is None:
        raise ConfigError(f"{file}: no module-level `{name}`; is this the official file?")
    if not (isinstance(value, ast.Constant) and isinstance(value.value, str)):
        raise ConfigError(f"{file}: `{name}` is not a plain string literal; is this the official file?")
    return value.value


def _function(tree: ast.Module, name: str, file: Path) -> ast.FunctionDef:
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise ConfigError(f"{file}: no function `{name}`; is this the official file?")


def _parameter_default(fn: ast.FunctionDef, parameter: str, file: Path) -> str:
    args = fn.args
    positional = [*args.posonlyargs, *args.args]
    defaults = dict(
        zip([a.arg for a in positional[len(positional) - len(args.defaults) :]], args.defaults, strict=True)
    )
    defaults.update(
        {a.arg: d for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is not None}
    )
    value = defaults.get(parameter)
    if not (isinstance(value, ast.Constant) and isinstance(value.value, str)):
        raise ConfigError(
            f"{file}: `{fn.name}` has no string default for `{parameter}`; is this the official file?"
        )
    return value.value


def _fstring_template(node: ast.JoinedStr, name: str, file: Path) -> str:
    """An f-string of plain ``{name}`` fields, as a ``str.format`` template (literal braces doubled)."""
    parts = []
    for value in node.values:
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            parts.append(value.value.replace("{", "{{").replace("}", "}}"))
        elif (
            isinstance(value, ast.FormattedValue)
            and isinstance(value.value, ast.Name)
            and value.conversion == -1
            and value.format_spec is None
        ):
            parts.append("{" + value.value.id + "}")
        else:
            raise ConfigError(
                f"{file}: `{name}` has a field that is not a plain name; is this the official file?"
            )
    return "".join(parts)


# ------------------------------------------------------------------------- CaptionQA's captioning script

_CQA_CAPTION_FILE = Path("caption.py")


def _count_line(node: ast.JoinedStr) -> str | None:
    """``f"...{len(x)}...{prompt}"`` as a ``str.format`` template with ``{n}`` for the count and
    without the trailing prompt field; None for any other f-string."""
    values = node.values
    counts = [
        v
        for v in values
        if isinstance(v, ast.FormattedValue)
        and isinstance(v.value, ast.Call)
        and isinstance(v.value.func, ast.Name)
        and v.value.func.id == "len"
    ]
    last = values[-1] if values else None
    if len(counts) != 1 or not (isinstance(last, ast.FormattedValue) and isinstance(last.value, ast.Name)):
        return None
    parts = []
    for value in values[:-1]:
        if value is counts[0]:
            parts.append("{n}")
        elif isinstance(value, ast.Constant) and isinstance(value.value, str):
            parts.append(value.value.replace("{", "{{").replace("}", "}}"))
        else:
            return None
    return "".join(parts)


def load_captionqa_multi_image_line(root: Path | str) -> tuple[str, PromptSource]:
    """The line CaptionQA's own captioning script (``caption.py``) puts before the prompt of an entry
    with several images, read with :mod:`ast` from the user's checkout of the benchmark's repository:
    the one f-string of the form ``f"...{len(images)}...{prompt}"``. Returned as a template with ``{n}``
    for the number of images, and where it came from."""
    file = _locate(Path(root).expanduser(), _CQA_CAPTION_FILE, "CaptionQA's captioning script")
    lines = {line for node in ast.walk(_parse(file, "CaptionQA")) if isinstance(node, ast.JoinedStr)
             for line in [_count_line(node)] if line is not None}  # fmt: skip
    if len(lines) != 1:
        raise ConfigError(
            f"{file}: expected one f-string putting the number of images before the prompt, found "
            f"{len(lines)}; is this the official caption.py?"
        )
    return lines.pop(), _source("captionqa", file, ["caption.py: the multi-image count line"])


# ----------------------------------------------------------------------------------------- DeCapBench

_DECAP_FILE = Path("eval") / "evaluation_decapbench.py"
_DECAP_TEMPLATES = {
    "extract_prompt": ("caption",),
    "match_prompt": ("predicted_atomic_facts", "oracle_atomic_facts"),
    "verify_prompt": ("reference_caption", "atomic_facts"),
}


@dataclass(frozen=True)
class DeCapBenchPrompts:
    """DCScore's three official templates and system message (see the module docstring)."""

    system: str
    extract: Template
    match: Template
    verify: Template
    source: PromptSource


def _locate(root: Path, relative: Path, what: str) -> Path:
    root = Path(root).expanduser()
    if root.is_file():
        return root
    for candidate in (root / relative, root / relative.name):
        if candidate.is_file():
            return candidate
    raise ConfigError(
        f"{what}: neither {root / relative} nor {root / relative.name} exists; "
        f"give the path of a checkout of the official repository"
    )


def load_decapbench_prompts(root: Path | str) -> DeCapBenchPrompts:
    """DCScore's official prompts from a DeCapBench checkout (its root, its ``eval/`` folder or the file)."""
    file = _locate(Path(root), _DECAP_FILE, "official.decapbench")
    tree = _parse(file, "official.decapbench")
    templates = {
        name: _checked_template(name, _module_string(tree, name, file), slots, file)
        for name, slots in _DECAP_TEMPLATES.items()
    }
    system = _parameter_default(_function(tree, "run_gpt_text", file), "sys_prompt", file)
    if _parameter_default(_function(tree, "run_gpt_multimodal", file), "sys_prompt", file) != system:
        raise ConfigError(
            f"{file}: the text and image calls have different system messages; is this the official file?"
        )
    names = (*_DECAP_TEMPLATES, "run_gpt_text(sys_prompt=...)")
    return DeCapBenchPrompts(
        system, templates["extract_prompt"], templates["match_prompt"], templates["verify_prompt"],
        _source("decapbench", file, names),
    )  # fmt: skip


# ----------------------------------------------------------------------------------------- CapArena

_ARENA_FILE = Path("vlm_as_a_judge.py")
_ARENA_SLOTS = ("caption_1", "caption_2", "caption_ref")


@dataclass(frozen=True)
class CapArenaPrompts:
    """CapArena-Auto's official system message (with a reference) and pairwise template."""

    system: str
    compare: Template
    source: PromptSource


def _with_ref_compare_prompt(fn: ast.FunctionDef, file: Path) -> ast.JoinedStr:
    for node in ast.walk(fn):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "with_ref":
            for statement in node.body:
                if (
                    isinstance(statement, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == "compare_prompt" for t in statement.targets)
                    and isinstance(statement.value, ast.JoinedStr)
                ):
                    return statement.value
    raise ConfigError(
        f"{file}: `mllm_judge_pairs` has no f-string `compare_prompt` under `if with_ref:`; is this the official file?"
    )


def load_caparena_prompts(root: Path | str) -> CapArenaPrompts:
    """CapArena-Auto's official prompts from a CapArena checkout (its root or ``vlm_as_a_judge.py``)."""
    file = _locate(Path(root), _ARENA_FILE, "official.caparena")
    tree = _parse(file, "official.caparena")
    system = _module_string(tree, "system_prompt_with_ref", file)
    node = _with_ref_compare_prompt(_function(tree, "mllm_judge_pairs", file), file)
    compare = _checked_template(
        "compare_prompt", _fstring_template(node, "compare_prompt", file), _ARENA_SLOTS, file
    )
    names = ("system_prompt_with_ref", "mllm_judge_pairs: compare_prompt (with_ref)")
    return CapArenaPrompts(system, compare, _source("caparena", file, names))


# ----------------------------------------------------------------------------------------- CaptionQA

_CQA_FILE = Path("lmms_eval") / "tasks" / "captionqa" / "utils.py"
_CQA_NAMES: dict[str, type | None] = {
    "QA_SYSTEM_PROMPT": str,
    "CANNOT_ANSWER_TEXT": str,
    "build_caption_qa_prompt": None,  # callables
    "extract_letter": None,
    "add_cannot_answer_option": None,
}


@dataclass(frozen=True)
class CaptionQATask:
    """What CaptionQA takes from lmms-eval's official task: the judge's system message, the prompt
    builder, the letter reader and the cannot-answer option (text, and when it is added)."""

    system: str
    cannot_answer: str
    build_prompt: Callable[[str, str, list[str]], str]
    extract_letter: Callable[[str, int], str | None]
    add_cannot_answer: Callable[[str, list[str]], list[str]]
    source: PromptSource


def _captionqa_file(spec: str) -> tuple[Path, str | None]:
    if spec == "lmms-eval":
        from importlib import metadata

        try:
            distribution = metadata.distribution("lmms_eval")
        except metadata.PackageNotFoundError:
            raise ConfigError(f"official.captionqa: lmms-eval is not installed; {_LIGHT_INSTALL}") from None
        file = Path(str(distribution.locate_file(str(_CQA_FILE))))
        if not file.is_file():
            raise ConfigError(
                f"official.captionqa: the installed lmms-eval {distribution.version} has no {_CQA_FILE}; "
                "use lmms-eval >= 0.6"
            )
        return file, distribution.version
    root = Path(spec)
    if root.is_file():
        return root, None
    for candidate in (root / _CQA_FILE, root / "tasks" / "captionqa" / "utils.py", root / "utils.py"):
        if candidate.is_file():
            return candidate, None
    raise ConfigError(
        f"official.captionqa: {root / _CQA_FILE} does not exist; give 'lmms-eval' (the installed package) "
        "or the path of an lmms-eval checkout"
    )


def load_captionqa_task(spec: str | Path) -> CaptionQATask:
    """lmms-eval's ``captionqa`` task module, loaded by file path (``spec``: "lmms-eval" or a path)."""
    file, version = _captionqa_file(str(spec))
    module_name = "balcaprl_official_captionqa_" + hashlib.sha256(str(file).encode()).hexdigest()[:12]
    loader = importlib.util.spec_from_file_location(module_name, file)
    if loader is None or loader.loader is None:
        raise ConfigError(f"official.captionqa: {file} cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(loader)
    try:
        loader.loader.exec_module(module)
    except ImportError as error:
        raise ConfigError(
            f"official.captionqa: {file} needs the module {error.name or error}; {_LIGHT_INSTALL}"
        ) from None
    except Exception as error:  # the task file is someone else's code: any failure is a set-up problem
        raise ConfigError(
            f"official.captionqa: {file} failed to load ({type(error).__name__}: {error})"
        ) from None
    finally:
        sys.modules.pop(module_name, None)
    missing = [
        name
        for name, kind in _CQA_NAMES.items()
        if not hasattr(module, name)
        or (kind is not None and not isinstance(getattr(module, name), kind))
        or (kind is None and not callable(getattr(module, name)))
    ]
    if missing:
        raise ConfigError(
            f"{file}: missing or wrong type: {', '.join(missing)}; is this lmms-eval's captionqa task?"
        )
    return CaptionQATask(
        system=module.QA_SYSTEM_PROMPT,
        cannot_answer=module.CANNOT_ANSWER_TEXT,
        build_prompt=module.build_caption_qa_prompt,
        extract_letter=module.extract_letter,
        add_cannot_answer=module.add_cannot_answer_option,
        source=_source("captionqa", file, tuple(_CQA_NAMES), version=version),
    )


# ----------------------------------------------------------------------------------------- request bytes


@dataclass(frozen=True)
class OfficialBody:
    """How an official client lays out a request body: its top-level key order and its JSON
    serialiser. Called on a body, the bytes that client would send for it (keys it does not know go
    last, in the body's order). A text that is no valid Unicode (a lone surrogate) goes with every
    non-ASCII character escaped, as :func:`~balcaprl.judge.calls.json_bytes` sends it."""

    client: str  # which client's layout: "requests", "openai 3.57.0"
    order: tuple[str, ...]
    ensure_ascii: bool
    separators: tuple[str, str]

    def __call__(self, body: Mapping[str, Any]) -> bytes:
        ordered = {k: body[k] for k in self.order if k in body}
        ordered.update((k, v) for k, v in body.items() if k not in ordered)
        dump = functools.partial(json.dumps, separators=self.separators, allow_nan=False)
        try:
            return dump(ordered, ensure_ascii=self.ensure_ascii).encode("utf-8")
        except UnicodeEncodeError:
            return dump(ordered, ensure_ascii=True).encode("ascii")


# ``requests.post(url, json=body)`` (CapArena's script, lmms-eval's captionqa task): ``json.dumps`` with
# its defaults, encoded as UTF-8; the key order is the script's dict literal.
_REQUESTS_JSON = {"ensure_ascii": True, "separators": (", ", ": ")}
CAPARENA_BODY = OfficialBody(
    "requests", ("model", "messages", "max_tokens", "top_p", "temperature"), **_REQUESTS_JSON
)
CAPTIONQA_BODY = OfficialBody(
    "requests", ("model", "messages", "temperature", "max_tokens"), **_REQUESTS_JSON
)

_PROBE = {"model": "m", "messages": [{"role": "user", "content": "é"}], "max_tokens": 1, "temperature": 1,
          "n": 1, "top_p": 1}  # fmt: skip


@functools.cache
def openai_body() -> OfficialBody:
    """The installed openai client's layout of a chat-completions body (DeCapBench's script calls
    ``client.chat.completions.create``): its key order and serialiser, read from the bytes the client
    itself builds for a probe request, answered in memory (no network)."""
    import httpx
    import openai

    sent: list[bytes] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request.read())
        choice = {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "x"}}
        return httpx.Response(200, json={"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                                         "choices": [choice]})  # fmt: skip

    with httpx.Client(transport=httpx.MockTransport(answer)) as http:
        client = openai.OpenAI(
            api_key="unused", base_url="http://probe.invalid/v1", http_client=http, max_retries=0
        )
        client.chat.completions.create(**_PROBE)
    value = json.loads(sent[0])
    for ensure_ascii in (False, True):
        for separators in ((",", ":"), (", ", ": ")):
            if json.dumps(value, ensure_ascii=ensure_ascii, separators=separators).encode() == sent[0]:
                return OfficialBody(f"openai {openai.__version__}", tuple(value), ensure_ascii, separators)
    raise RuntimeError(f"openai {openai.__version__}: its request bytes match no known JSON layout")


# ----------------------------------------------------------------------------------------- comparability


def departures(settings: Mapping[str, Any], official: Mapping[str, tuple[Any, ...]]) -> list[str]:
    """The options in ``settings`` whose values are not among the official ones (``official``: option ->
    the values an official scorer uses; several when lmms-eval's task and the authors' script differ)."""
    out = []
    for name, allowed in official.items():
        value = settings.get(name)
        if value not in allowed:
            shown = " or ".join(repr(a) for a in allowed)
            out.append(f"{name}={value!r} (official: {shown})")
    return out


# What still differs from the official scorer with the official prompts and every option official:
# balcaprl's fixed choices (docs/evaluation-official.md lists each with its effect).
REMAINING_DIFFERENCES: dict[str, tuple[str, ...]] = {
    "dcscore": (
        "a failed call (after the client's retries) is a failure asked again by a re-run (official: one of "
        "the caption's 5 tries)",
        "matching and verification answers must list exactly the extracted facts (official: the same facts "
        "in both)",
    ),
    "captionqa": (
        "a failed call is a failure, left out and asked again by a re-run (lmms-eval: scored 0)",
        "the answer is read stripped (lmms-eval: unstripped)",
    ),
    "caparena": ("positions drawn per image from a seeded RNG (official: unseeded)",),
}
_CAPTIONQA_VARIANTS = {
    "qa.py": {"shuffle_over": "captioned", "cannot_answer": "text", "rounding": "question"},
    "lmms-eval": {"shuffle_over": "all", "cannot_answer": "position", "rounding": "mean"},
}


def scoring_rules(
    protocol: str, settings: Mapping[str, Any], official: Mapping[str, tuple[Any, ...]]
) -> dict[str, Any]:
    """The rules a protocol's number was scored under, for ``eval.json``: ``rules`` (``official`` or
    ``official, with deviations``; ``ours`` for b-CapScore, which has no official scorer),
    ``deviations`` from the official rules (prompts not the official ones, options not official) and
    the ``remaining_differences`` every run keeps (:data:`REMAINING_DIFFERENCES`)."""
    if protocol not in REMAINING_DIFFERENCES:
        return {"rules": "ours", "deviations": ["no official scorer: our wording of the paper's prompt"]}
    kind = (settings.get("prompts") or {}).get("kind") or "not recorded"
    deviations = [] if kind == "official" else [f"prompts: {kind} (not the official ones)"]
    deviations += [f"option {d}" for d in departures(settings, official)]
    out: dict[str, Any] = {"rules": "official" if not deviations else "official, with deviations"}
    if protocol == "captionqa":
        out["variant"] = next(
            (name for name, values in _CAPTIONQA_VARIANTS.items()
             if all(settings.get(k) == v for k, v in values.items())), "mixed (qa.py and lmms-eval)",
        )  # fmt: skip
    return {**out, "deviations": deviations, "remaining_differences": list(REMAINING_DIFFERENCES[protocol])}


def rules_line(protocol: str, entry: Mapping[str, Any]) -> str:
    """One line naming the rules a protocol entry of ``eval.json`` was scored under and each
    deviation from the official ones (for ``report`` and ``inspect``)."""
    rules = entry.get("rules")
    if not isinstance(rules, Mapping):
        return f"{protocol}: not recorded (evaluated by an earlier balcaprl)"
    name = rules.get("rules", "?") + (f" ({rules['variant']})" if rules.get("variant") else "")
    deviations = rules.get("deviations") or []
    return f"{protocol}: {name}" + (f"; deviations: {'; '.join(deviations)}" if deviations else "")


def _model_name(model: str) -> str:
    return model.strip().lower().rsplit("/", 1)[-1]


def paper_comparability(
    protocol: str, prompts: Mapping[str, Any] | None, option_departures: Sequence[str], judge: str | None
) -> list[str]:
    """Why a protocol's number is not comparable with the paper's Table 1 (empty: it is): prompts that
    are not the official ones, options that are not the official protocol's, another judge model."""
    reasons: list[str] = []
    kind = (prompts or {}).get("kind")
    if protocol == "bcapscore":
        reasons.append("prompts: our wording of the paper's evaluation prompt (the paper's text is not used)")
    elif kind != "official":
        reasons.append(f"prompts: {kind or 'not recorded'} (not the benchmark's official prompts)")
    elif (prompts or {}).get("modified"):
        reasons.append("prompts: the official file differs from its git commit")
    reasons += [f"option {d}" for d in option_departures]
    expected = OFFICIAL_JUDGES.get(protocol)
    if expected and (judge is None or _model_name(judge) != _model_name(expected)):
        reasons.append(f"judge {judge or 'unknown'} (the benchmark's scorer uses {expected})")
    return reasons
