"""The README and the guides under docs/ stay true to the code, and the repository stands alone.

- Every ``balcaprl ...`` command line (in a code block or an inline code span) names a command of the
  real command line, walked through the typer app's registered groups, and only options that command
  has; and every command the CLI has is shown somewhere (so the check cannot pass on empty docs).
- Every relative link points at a file in the repository, and a ``#fragment`` at a heading there.
- Every Python example runs, and prints what its ``print(...)  # expected`` comments say.
- No file in the repository points at material outside it.

The checkers are plain functions over text; the first tests feed them planted mistakes, so that a
checker that finds nothing fails here rather than passing vacuously on the real docs.
"""

from __future__ import annotations

import contextlib
import io
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import typer.main

from balcaprl.cli import app

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

# How a shell line ends a command, and where its comment starts.
SHELL_OPERATORS = {"|", "||", "&&", ";"}
COMMENT = re.compile(r"(^|\s)#.*$")
INLINE_CODE = re.compile(r"`([^`\n]+(?:\n[^`\n]+)*)`")  # may wrap, within a paragraph
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*(```+|~~~+)\s*([\w+-]*)")
OPTION = re.compile(r"^--?[A-Za-z]")
PRINT_EXPECTED = re.compile(r"^\s*print\(.*\)\s*#\s*(?P<expected>.+)$")

# Pointers to material outside the repository, spelled so that this file does not match itself.
OUTSIDE_POINTERS = re.compile(r"DESIG[N]\.md|\.\./share[d]\b|share[d]/(?:seeds|notes)")
SKIP_DIRS = {
    ".git",
    "__pycache__",
    ".pytest_cache",
    ".ruff_cache",
    ".hypothesis",
    "runs",
    "out",
    "dist",
    "build",
}
MAX_SCANNED_BYTES = 2_000_000


@dataclass(frozen=True)
class Block:
    """A fenced code block: its language tag, the line number of its first line, its lines."""

    lang: str
    first_line: int
    lines: tuple[str, ...]


def split_markdown(text: str) -> tuple[list[Block], list[tuple[int, str]]]:
    """The fenced blocks, and the lines outside them (numbered from 1)."""
    blocks: list[Block] = []
    prose: list[tuple[int, str]] = []
    fence: str | None = None
    lang, first, body = "", 0, []
    for number, line in enumerate(text.splitlines(), start=1):
        match = FENCE.match(line)
        if fence is None and match:
            fence, lang, first, body = match.group(1), match.group(2).lower(), number + 1, []
        elif fence is not None and line.strip().startswith(fence) and not line.strip()[len(fence) :].strip():
            blocks.append(Block(lang, first, tuple(body)))
            fence = None
        elif fence is not None:
            body.append(line)
        else:
            prose.append((number, line))
    assert fence is None, "an unclosed code fence"
    return blocks, prose


def prose_text(text: str) -> str:
    """``text`` with the lines of its code blocks blanked: offsets and line numbers stay those of the file."""
    lines = [""] * len(text.splitlines())
    for number, line in split_markdown(text)[1]:
        lines[number - 1] = line
    return "\n".join(lines)


def line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def inline_spans(text: str) -> list[tuple[int, str]]:
    """The inline code spans outside code blocks (a wrapped span joined into one line), by line."""
    prose = prose_text(text)
    return [(line_of(prose, m.start()), " ".join(m.group(1).split())) for m in INLINE_CODE.finditer(prose)]


def shell_snippets(text: str) -> list[tuple[int, str]]:
    """Every piece of text that may hold a command line: the lines of non-Python code blocks (comments
    cut, backslash continuations joined) and the inline code spans of the prose."""
    blocks, _ = split_markdown(text)
    snippets: list[tuple[int, str]] = []
    for block in blocks:
        if block.lang in {"python", "py", "json"}:
            continue
        pending, start = "", 0
        for offset, line in enumerate(block.lines):
            if not pending:
                start = block.first_line + offset
            code = COMMENT.sub("", line).rstrip()
            if code.endswith("\\"):
                pending += code[:-1] + " "
                continue
            snippets.append((start, pending + code))
            pending = ""
        if pending:
            snippets.append((start, pending))
    snippets.extend(inline_spans(text))
    return sorted(snippets, key=lambda snippet: snippet[0])


# typer builds on its own copy of click, so the command tree is read by duck typing: a group has
# `commands` (name -> command), a command has `params` (each with `param_type_name`, `opts`, ...).
CliNode = Any


def is_group(node: CliNode) -> bool:
    return isinstance(getattr(node, "commands", None), dict)


def option_names(command: CliNode) -> set[str]:
    names = {"--help", "-h"}  # the root's help_option_names, inherited by every command
    for param in command.params:
        if param.param_type_name == "option":
            names.update(param.opts)
            names.update(param.secondary_opts)
    return names


def check_commands(text: str, root: CliNode, where: str) -> tuple[list[str], set[tuple[str, ...]]]:
    """Problems with the ``balcaprl`` command lines in ``text``, and the command paths they name."""
    problems: list[str] = []
    found: set[tuple[str, ...]] = set()
    for number, snippet in shell_snippets(text):
        tokens = [token.strip("'\"") for token in snippet.split()]
        for start, token in enumerate(tokens):
            before = tokens[start - 1] if start else ""
            is_script = token == "balcaprl" and before not in {"from", "import"}
            is_module = token == "balcaprl.cli" and before == "-m"
            if not (is_script or is_module):
                continue
            words: list[str] = []
            for word in tokens[start + 1 :]:
                if word in SHELL_OPERATORS or word.startswith(">"):
                    break
                words.append(word)
            problems.extend(f"{where}:{number}: `{snippet.strip()}`: {p}" for p in _walk(root, words, found))
    return problems, found


def _walk(root: CliNode, words: list[str], found: set[tuple[str, ...]]) -> list[str]:
    """Follow ``words`` down the command tree; check the options given to the command reached."""
    node = root
    path: list[str] = []
    rest = list(words)
    while is_group(node) and rest and not OPTION.match(rest[0]):
        names = rest.pop(0).replace("\\|", "|").split("|")  # `verl export|launch` names two commands
        unknown = [name for name in names if name not in node.commands]
        if unknown:
            where = " ".join(["balcaprl", *path])
            return [
                f"{unknown[0]!r} is not a command of `{where}` (it has: {', '.join(sorted(node.commands))})"
            ]
        found.update((*path, name) for name in names)
        if len(names) > 1:
            return []
        path.append(names[0])
        node = node.commands[names[0]]
    allowed = option_names(node)
    where = " ".join(["balcaprl", *path])
    return [
        f"`{where}` has no option {word.split('=')[0]}"
        for word in rest
        if OPTION.match(word) and word.split("=")[0] not in allowed
    ]


def leaf_commands(group: CliNode, path: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    leaves: set[tuple[str, ...]] = set()
    for name, command in group.commands.items():
        if is_group(command):
            leaves |= leaf_commands(command, (*path, name))
        else:
            leaves.add((*path, name))
    return leaves


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    _, prose = split_markdown(text)
    seen: dict[str, int] = {}
    result = set()
    for _, line in prose:
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        slug = github_slug(match.group(1))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        result.add(slug if count == 0 else f"{slug}-{count}")
    return result


def check_links(text: str, folder: Path, where: str) -> list[str]:
    """Problems with the relative links in ``text`` (a Markdown file in ``folder``)."""
    problems = []
    prose = INLINE_CODE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), prose_text(text))  # same offsets
    for match in LINK.finditer(prose):
        target, number = match.group(1), line_of(prose, match.start(1))
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        file_part, _, fragment = target.partition("#")
        path = (folder / file_part).resolve() if file_part else None
        if path is not None and not (path.is_relative_to(REPO) and path.exists()):
            problems.append(f"{where}:{number}: link {target!r}: no such file in the repository")
            continue
        if fragment and (path is None or path.suffix == ".md"):
            heading_text = text if path is None else path.read_text(encoding="utf-8")
            if fragment not in anchors(heading_text):
                problems.append(f"{where}:{number}: link {target!r}: no heading #{fragment} there")
    return problems


def python_blocks(text: str) -> list[Block]:
    blocks, _ = split_markdown(text)
    return [block for block in blocks if block.lang in {"python", "py"}]


def run_python_block(block: Block) -> tuple[list[str], list[str]]:
    """Run one example; return what it printed and what its comments say it prints."""
    expected = [m.group("expected") for line in block.lines if (m := PRINT_EXPECTED.match(line))]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile("\n".join(block.lines), f"<block at line {block.first_line}>", "exec"), {})
    return printed.getvalue().splitlines(), expected


def _squeeze(text: str) -> str:
    return re.sub(r"\s+", "", text)


def repository_files() -> list[Path]:
    files = []
    for path in sorted(REPO.rglob("*")):
        parts = path.relative_to(REPO).parts
        if any(part in SKIP_DIRS or part.startswith(".venv") or part.endswith(".egg-info") for part in parts):
            continue
        if path.is_file() and path.stat().st_size <= MAX_SCANNED_BYTES:
            files.append(path)
    return files


@pytest.fixture(scope="module")
def cli_root() -> CliNode:
    root = typer.main.get_command(app)
    assert is_group(root) and "train" in root.commands
    return root


# ------------------------------------------------------------------- the checkers find planted mistakes


def test_command_check_finds_planted_mistakes(cli_root):
    text = "\n".join(
        [
            "Run `balcaprl trian configs/x.yaml` first.",
            "```bash",
            "balcaprl data prepare sharegpt5 --json x.json    # a dataset we do not prepare",
            "balcaprl train configs/x.yaml \\",
            "    --resum",
            "balcaprl verl export|lunch",
            "```",
            "A span may wrap: `balcaprl judge",
            "serf --port 0`.",
        ]
    )
    problems, _ = check_commands(text, cli_root, "planted.md")
    assert len(problems) == 5, problems
    assert "planted.md:1:" in problems[0] and "'trian' is not a command of `balcaprl`" in problems[0]
    assert (
        "planted.md:3:" in problems[1]
        and "'sharegpt5' is not a command of `balcaprl data prepare`" in problems[1]
    )
    assert "planted.md:4:" in problems[2] and "`balcaprl train` has no option --resum" in problems[2]
    assert "'lunch' is not a command of `balcaprl verl`" in problems[3]
    assert (
        "planted.md:8: `balcaprl judge serf --port 0`: 'serf' is not a command of `balcaprl judge`"
        in problems[4]
    )


def test_command_check_accepts_real_commands_and_ignores_python_and_prose(cli_root):
    text = "\n".join(
        [
            "balcaprl is a project; `from balcaprl import b_capscore` is Python.",
            "```python",
            "import balcaprl  # balcaprl anything here is Python, not a command line",
            "```",
            "```bash",
            "accelerate launch --config_file c.yaml -m balcaprl.cli train configs/x.yaml --resume  # x | y",
            "balcaprl data info data/x | head",
            "balcaprl --help",
            "```",
            "Groups alone: `balcaprl synthetic build|sft`, `balcaprl judge`.",
        ]
    )
    problems, found = check_commands(text, cli_root, "ok.md")
    assert problems == []
    assert found == {
        ("train",),
        ("data",),
        ("data", "info"),
        ("synthetic",),
        ("synthetic", "build"),
        ("synthetic", "sft"),
        ("judge",),
    }


def test_link_check_finds_planted_mistakes(tmp_path):
    text = "\n".join(
        [
            "# A page",
            "[ok](#a-page) [missing heading](#nowhere) [no file](docs/nowhere.md)",
            "[outside](../../outside.md) [web](https://example.org/x.md) [`code` in a",
            "wrapped link](nowhere.md) `[not a link](nowhere.md)`",
        ]
    )
    problems = check_links(text, REPO, "planted.md")
    assert [p.split(": ", 1)[1] for p in problems] == [
        "link '#nowhere': no heading #nowhere there",
        "link 'docs/nowhere.md': no such file in the repository",
        "link '../../outside.md': no such file in the repository",
        "link 'nowhere.md': no such file in the repository",
    ]
    assert problems[-1].startswith("planted.md:4: ")


def test_github_slug():
    assert github_slug("Figure 2: why c-GDPO") == "figure-2-why-c-gdpo"
    assert github_slug("Score a caption file (`balcaprl score`)") == "score-a-caption-file-balcaprl-score"
    assert github_slug("The defaults, and why") == "the-defaults-and-why"


def test_outside_pointer_pattern():
    assert OUTSIDE_POINTERS.search("see " + "DESI" + "GN.md")
    assert OUTSIDE_POINTERS.search("in ../sha" + "red/seeds/")
    assert OUTSIDE_POINTERS.search("sha" + "red/notes/x.md")
    assert not OUTSIDE_POINTERS.search("a shared filesystem, a package's design.md, shared_memory")


# -------------------------------------------------------------------------------------- the real docs


def test_the_docs_exist():
    names = {path.name for path in DOCS}
    assert {"README.md", "method.md", "training.md", "judge.md", "data.md", "evaluation.md"} <= names


@pytest.mark.parametrize("doc", DOCS, ids=lambda path: str(path.relative_to(REPO)))
def test_commands_in_docs_exist(doc, cli_root):
    problems, _ = check_commands(doc.read_text(encoding="utf-8"), cli_root, str(doc.relative_to(REPO)))
    assert problems == []


def test_every_command_is_documented(cli_root):
    found: set[tuple[str, ...]] = set()
    for doc in DOCS:
        found |= check_commands(doc.read_text(encoding="utf-8"), cli_root, doc.name)[1]
    missing = sorted(" ".join(path) for path in leaf_commands(cli_root) - found)
    assert missing == [], f"commands no guide shows: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda path: str(path.relative_to(REPO)))
def test_relative_links_resolve(doc):
    assert check_links(doc.read_text(encoding="utf-8"), doc.parent, str(doc.relative_to(REPO))) == []


def test_python_examples_print_what_they_say():
    blocks = [(doc, block) for doc in DOCS for block in python_blocks(doc.read_text(encoding="utf-8"))]
    assert len(blocks) >= 2  # the README's and the method guide's
    for doc, block in blocks:
        printed, expected = run_python_block(block)
        assert expected, f"{doc.name}:{block.first_line}: an example without `print(...)  # output` lines"
        assert [_squeeze(line) for line in printed] == [_squeeze(line) for line in expected], (
            f"{doc.name}:{block.first_line}"
        )


def test_no_file_points_outside_the_repository():
    files = repository_files()
    assert any(path.name == "README.md" for path in files) and len(files) > 100
    offenders = []
    for path in files:
        text = path.read_bytes().decode("utf-8", errors="ignore")
        for number, line in enumerate(text.splitlines(), start=1):
            if OUTSIDE_POINTERS.search(line):
                offenders.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert offenders == []


SOURCE_COMMAND = re.compile(r"`{1,2}(balcaprl [^`\n]+?)`{1,2}")


def source_files() -> list[Path]:
    patterns = ("src/**/*.py", "scripts/**/*", "configs/**/*.yaml", "configs/**/*.overrides", "Makefile")
    return sorted({p for pattern in patterns for p in REPO.glob(pattern) if p.is_file()})


def test_source_command_check_finds_a_planted_name(cli_root):
    text = "raise UserError('re-run `balcaprl export verl` first')"
    problems = [
        p for m in SOURCE_COMMAND.finditer(text) for p in _walk(cli_root, m.group(1).split()[1:], set())
    ]
    assert problems and "'export' is not a command of `balcaprl`" in problems[0]


def test_commands_named_in_code_and_configs_exist(cli_root):
    """Messages, docstrings and config comments name commands too (`re-run balcaprl verl export`)."""
    problems = []
    for path in source_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        for match in SOURCE_COMMAND.finditer(text):
            words = [w.strip("'\",.;:") for w in match.group(1).split()[1:]]
            words = [w for w in words if w and w not in ("...", "…")]  # `balcaprl data ...`: the group
            where = f"{path.relative_to(REPO)}:{line_of(text, match.start())}"
            problems += [f"{where}: `{match.group(1)}`: {p}" for p in _walk(cli_root, words, set())]
    assert problems == []


def test_no_guide_leaves_a_placeholder_in_an_address_to_fill_in():
    """A command block runs as written: an address names a port (docs/inspect.md once said ``PORT``)."""
    placeholder = re.compile(r"(?:localhost|127\.0\.0\.1):[A-Z_]+\b")
    found = [
        f"{doc.name}: {m.group(0)}"
        for doc in DOCS
        for m in placeholder.finditer(doc.read_text(encoding="utf-8"))
    ]
    assert not found, found
    assert placeholder.search("base_url: http://127.0.0.1:PORT/v1")  # the checker finds a planted one
