"""docs/rubrics.md, the rule table: its quotes are the rubric parts' own text, its summary counts its
rows, and its paraphrases of the paper stay in our own words."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

from judge_testkit import paper_run_hashes, run_hashes

DOC = Path(__file__).resolve().parents[2] / "docs" / "rubrics.md"
PARTS = resources.files("balcaprl.judge.rubrics").joinpath("parts")
SECTIONS = {  # heading -> the summary row's name
    "Training prompt": "Training",
    "Evaluation prompt (b-CapScore)": "Evaluation",
    'Re-captioning (Sec. 2.2 "Data")': "Re-captioning",
    'The "w/o pointability" ablation (Table 3)': '"w/o pointability"',
    "Cached-reference mode (no counterpart in the paper)": "Cached-reference mode",
}


def _squash(text: str) -> str:
    return " ".join(text.split())


def _rows(text: str) -> dict[str, list[list[str]]]:
    """The rule rows of each section: heading -> cells of each row whose first cell is an id."""
    rows: dict[str, list[list[str]]] = {}
    heading = None
    for line in text.splitlines():
        if line.startswith("### "):
            heading = line[4:].strip()
        elif heading and re.match(r"\| [TERAC]\d+ \|", line):
            rows.setdefault(heading, []).append([c.strip() for c in line.strip("|").split(" | ")])
    return rows


def _quotes(cell: str) -> list[tuple[str, str]]:
    """(part, quote) for every quote that follows a `part.md`: citation in a cell."""
    found = []
    for match in re.finditer(r"`(\w+)\.md`:(.*?)(?=`\w+\.md`:|$)", cell):
        for quote in re.findall(r'"((?:[^"\\]|\\.)*)"', match.group(2)):
            found.append((match.group(1), quote.replace('\\"', '"')))
    return found


def test_every_quote_is_the_parts_own_text():
    rows = _rows(DOC.read_text())
    quoted = [q for section in rows.values() for row in section for q in _quotes(row[2])]
    assert len(quoted) > 40
    for part, quote in quoted:
        text = PARTS.joinpath(f"{part}.md").read_text()
        assert _squash(quote) in _squash(text), (part, quote)


def test_every_section_is_complete_and_the_summary_counts_its_rows():
    text = DOC.read_text()
    rows = _rows(text)
    assert set(rows) == set(SECTIONS)
    summary = {}
    for line in text.split("## Summary", 1)[1].splitlines():
        cells = [c.strip().strip("*") for c in line.strip().strip("|").split(" | ")]
        if len(cells) == 5 and cells[1].isdigit():
            summary[cells[0]] = tuple(int(c) for c in cells[1:])
    totals = [0, 0, 0, 0]
    for heading, name in SECTIONS.items():
        verdicts = [row[3] for row in rows[heading]]
        form = sum(v.startswith("same, form differs") for v in verdicts)
        different = sum(v.startswith("different") for v in verdicts)
        same = sum(v.startswith("same") for v in verdicts) - form
        assert same + form + different == len(verdicts), heading
        assert summary[name] == (len(verdicts), same, form, different), name
        totals = [a + b for a, b in zip(totals, summary[name], strict=True)]
        numbers = [int(row[0][1:]) for row in rows[heading]]
        assert numbers == list(range(1, len(numbers) + 1)), heading  # no rule left out or repeated
    assert summary["All"] == tuple(totals)


def test_each_deliberate_difference_is_a_named_option():
    text = DOC.read_text()
    options = text.split("## Options", 1)[1].split("## The rule table", 1)[0]
    for section in _rows(text).values():
        for row in section:
            if row[3].startswith("different"):
                option = re.search(r"option `([^`]+)`", row[3]).group(1)
                assert f"`{option}`" in options or option.split()[-1] in options, row[0]


def test_the_page_paraphrases_the_paper_in_our_own_words():
    paper = paper_run_hashes()
    copied = [run for digest, run in run_hashes(DOC.read_text()).items() if digest in paper]
    assert not copied, copied
