"""`balcaprl report`: evaluation folders (and the paper's published rows) in the paper's Table 1 form.

Rows come from evaluation folders (``eval.json`` from `balcaprl evaluate`; a training run folder is
searched one level down for them) and, on request, from the paper's Table 1 (``published/``).
Columns: DCScore, CaptionQA, CapArena (each with its delta against the baseline: ``--baseline``, else
the first run given), Arena Length (mean words of the CapArena captions) and b-CapScore (with its
delta). A delta is taken only within one comparability class: both numbers comparable with the
paper's Table 1, or both not for the same reasons. As in the paper, the best value of each score
column is marked in bold within each group of rows (your runs form one group, each of the paper's
model families another). A value from an incomplete evaluation (judge failures, benchmark items
without a caption, refused benchmark rows) carries a numbered dagger (†1), and a value that is not
comparable with the paper's Table 1 — our paraphrased prompts rather than the benchmark's official
ones, options other than the official protocol's, another judge model, or an evaluation that did not
record them — a numbered double dagger (‡1); under the table, one note per distinct reason lists
the cells it is about, never silently. ``report.png`` draws the 95% interval of every value whose
evaluation recorded one (b-CapScore's bootstrap interval).

Outputs: ``report.md``, ``report.csv``, ``report.png`` (the runs side by side on the three views, the
length and b-CapScore), ``general.md``/``general.csv`` when any row has general-benchmark results
(Table 2's form), and, with ``--human-ranking``, ``human_alignment.json`` and a section in
``report.md``: each metric's model-level Spearman correlation with a human ranking (Table 7).
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from balcaprl.errors import InputError
from balcaprl.evaluate.official import rules_line
from balcaprl.files import atomic_write_bytes, atomic_write_text

# (key, header, has a delta column)
COLUMNS: tuple[tuple[str, str, bool], ...] = (
    ("dcscore", "DCScore", True),
    ("captionqa", "CaptionQA", True),
    ("caparena", "CapArena", True),
    ("arena_length", "Arena Length", False),
    ("bcapscore", "b-CapScore", True),
)
SCORE_KEYS = tuple(k for k, _, delta in COLUMNS if delta)
_PROTOCOL_OF = {"dcscore": "dcscore", "captionqa": "captionqa", "caparena": "caparena",
                "arena_length": "caparena", "bcapscore": "bcapscore"}  # fmt: skip
RUNS_GROUP = "Runs"


@dataclass
class ReportRow:
    name: str
    group: str
    source: str
    values: dict[str, float | None]
    general: dict[str, float] = field(default_factory=dict)
    incomplete: dict[str, str] = field(default_factory=dict)  # column -> why (failures, missing items)
    not_comparable: dict[str, list[str]] = field(default_factory=dict)  # column -> why not like Table 1
    published: bool = False
    rules: list[str] = field(default_factory=list)  # per protocol: the rules it was scored under
    intervals: dict[str, tuple[float, float]] = field(default_factory=dict)  # column -> its 95% interval

    def comparability(self, key: str) -> tuple[str, ...]:
        """The column's comparability class: () for numbers like the paper's Table 1, else the reasons
        they are not. A difference is taken within one class only."""
        return tuple(sorted(self.not_comparable.get(key, ())))


# ----------------------------------------------------------------------------------------- loading


def _eval_files(path: Path) -> list[Path]:
    path = Path(path)
    if path.is_file() and path.name == "eval.json":
        return [path]
    if (path / "eval.json").is_file():
        return [path / "eval.json"]
    found = sorted(path.glob("*/eval.json"))
    if not found:
        raise InputError(
            f"{path}: no eval.json here or one level down; evaluate the run first (`balcaprl evaluate "
            f"--captions ... --out {path}/eval`)"
        )
    return found


def load_eval_rows(paths: Sequence[Path]) -> list[ReportRow]:
    """One row per evaluation folder found under ``paths`` (names: the eval labels, made unique)."""
    rows = []
    for path in paths:
        for file in _eval_files(Path(path)):
            record = json.loads(file.read_text(encoding="utf-8"))
            results = record.get("results") or {}
            headline = record.get("headline") or {}
            values = {key: headline.get(key) for key, _, _ in COLUMNS}
            incomplete, not_comparable = {}, {}
            for key in values:
                entry = results.get(_PROTOCOL_OF[key]) or {}
                if entry and not entry.get("complete", True):
                    n_failed, n_missing = entry.get("n_failed", 0), entry.get("n_missing", 0)
                    why = f"{n_failed} judge failures, {n_missing} items without a caption"
                    if entry.get("n_refused"):
                        why += f", {entry['n_refused']} benchmark rows refused"
                    incomplete[key] = why
                if entry and values[key] is not None:
                    reasons = _not_comparable(entry)
                    if reasons:
                        not_comparable[key] = reasons
            general = ((results.get("general") or {}).get("scores")) or {}
            name = record.get("label") or file.parent.name
            row = ReportRow(
                name, RUNS_GROUP, str(file.parent), values, dict(general), incomplete, not_comparable
            )
            for key in values:
                low, high = ((results.get(_PROTOCOL_OF[key]) or {}).get("metrics") or {}).get("ci95") or (
                    None,
                    None,
                )
                if low is not None and high is not None and values[key] is not None:
                    row.intervals[key] = (float(low), float(high))
            row.rules = [
                rules_line(p, e) for p, e in results.items() if p != "general" and isinstance(e, dict)
            ]
            rows.append(row)
    seen: dict[str, int] = {}
    for row in rows:  # two runs with one label stay apart
        seen[row.name] = seen.get(row.name, 0) + 1
        if seen[row.name] > 1:
            row.name = f"{row.name} ({Path(row.source).name}#{seen[row.name]})"
    return rows


def _not_comparable(entry: dict[str, Any]) -> list[str]:
    """Why a protocol entry of eval.json is not comparable with the paper's Table 1 (as `balcaprl
    evaluate` recorded it); an entry from before that was recorded cannot be vouched for."""
    if "comparable_with_paper" not in entry:
        return ["the prompts and options used were not recorded (evaluated by an earlier balcaprl)"]
    return [] if entry["comparable_with_paper"] else list(entry.get("not_comparable") or ["not recorded why"])


def _published_csv(name: str) -> list[dict[str, str]]:
    text = resources.files("balcaprl.evaluate").joinpath("published", name).read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    return list(csv.DictReader(io.StringIO("\n".join(lines))))


def _number(text: str | None) -> float | None:
    return None if text in (None, "") else float(text)


def published_rows(selection: str | Sequence[str] = "all") -> list[ReportRow]:
    """The paper's Table 1 rows (with Table 2's general scores where the paper gives them).

    ``selection``: "all", or row ids (``qwen2.5-vl-3b/baseline``), family prefixes (``qwen2.5-vl-3b``,
    ``proprietary``) or group names (``QwenVL2.5-3B``), comma-separated or as a list.
    """
    wanted = [
        s.strip() for s in (selection.split(",") if isinstance(selection, str) else selection) if s.strip()
    ]
    table2 = {r["id"]: r for r in _published_csv("table2.csv")}
    general_by_t1 = {"qwen2.5-vl-3b/baseline": "qwen2.5-vl-3b/base", "qwen2.5-vl-3b/caprl-3b": "qwen2.5-vl-3b/caprl-3b",
                     "qwen2.5-vl-3b/rubicap-3b": "qwen2.5-vl-3b/rubicap-3b",
                     "qwen2.5-vl-3b/balcaprl": "qwen2.5-vl-3b/balcaprl-3b"}  # fmt: skip
    rows = []
    for r in _published_csv("table1.csv"):
        family = r["id"].split("/")[0]
        if "all" not in wanted and not any(w in (r["id"], family, r["group"]) for w in wanted):
            continue
        general = {}
        t2 = table2.get(general_by_t1.get(r["id"], ""))
        if t2 is not None:
            general = {k: float(v) for k, v in t2.items() if k not in ("id", "group", "model", "average")}
        rows.append(
            ReportRow(
                name=f"{r['group']} {r['model']} (paper)",
                group=f"{r['group']} (paper)",
                source="paper, Table 1",
                values={key: _number(r[key]) for key, _, _ in COLUMNS},
                general=general,
                published=True,
            )
        )
    if wanted and "all" not in wanted and not rows:
        raise InputError(f"no published row matches {wanted}; ids look like qwen2.5-vl-3b/baseline")
    return rows


def published_spearman() -> list[dict[str, str]]:
    """The paper's Table 7 (model-level Spearman with CapArena's human ranking)."""
    return _published_csv("table7.csv")


# ----------------------------------------------------------------------------------------- table


def _find(rows: Sequence[ReportRow], name: str) -> ReportRow:
    exact = [r for r in rows if r.name == name]
    if exact:
        return exact[0]
    loose = [r for r in rows if r.name.lower().startswith(name.lower()) or Path(r.source).name == name]
    if len(loose) == 1:
        return loose[0]
    names = ", ".join(repr(r.name) for r in rows)
    raise InputError(f"--baseline {name!r} matches {len(loose)} rows; rows are: {names}")


def _best(rows: Sequence[ReportRow]) -> dict[tuple[str, str], float]:
    best: dict[tuple[str, str], float] = {}
    for row in rows:
        for key in SCORE_KEYS:
            value = row.values.get(key)
            if value is not None and value > best.get((row.group, key), -math.inf):
                best[(row.group, key)] = value
    return best


def _fmt(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _delta(value: float | None, base: float | None) -> float | None:
    return None if value is None or base is None else value - base


@dataclass
class Report:
    rows: list[ReportRow]
    baseline: ReportRow | None
    markdown: str
    csv: str
    general_markdown: str | None = None
    general_csv: str | None = None
    alignment: dict[str, Any] | None = None


class _Footnotes:
    """One footnote per distinct reason: ``mark`` numbers a reason at its first use (‡1, ‡2, ...),
    and each note lists the cells it is about."""

    def __init__(self, sign: str, lead: str) -> None:
        self.sign, self.lead = sign, lead
        self.cells: dict[str, list[str]] = {}  # reason -> "row: column" cells, in order of first use

    def mark(self, reasons: Sequence[str], cell: str) -> str:
        numbers = []
        for reason in reasons:
            self.cells.setdefault(reason, []).append(cell)
            numbers.append(str(list(self.cells).index(reason) + 1))
        return self.sign + ",".join(numbers)

    def notes(self) -> list[str]:
        return [
            f"{self.sign}{i} {self.lead}{reason} ({'; '.join(cells)})"
            for i, (reason, cells) in enumerate(self.cells.items(), start=1)
        ]


def _table(rows: Sequence[ReportRow], baseline: ReportRow | None) -> tuple[str, str, list[str]]:
    best = _best(rows)
    daggers = _Footnotes("†", "incomplete: ")
    double_daggers = _Footnotes("‡", "not comparable with the paper's Table 1: ")
    titles = {key: title for key, title, _ in COLUMNS}
    header = ["Model"]
    for _, title, has_delta in COLUMNS:
        header += [title, "Δ"] if has_delta else [title]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + [":---:"] * (len(header) - 1)) + "|"]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["group", "model", "source", *[c for k, _, d in COLUMNS for c in ([k, f"{k}_delta"] if d else [k])],
                     "best", "incomplete", "not_comparable"])  # fmt: skip
    notes: list[str] = []
    group = None
    for row in rows:
        if row.group != group:
            group = row.group
            lines.append(f"| *{group}* |" + " |" * (len(header) - 1))
        cells = [f"**{row.name}**" if baseline is row else row.name]
        record: list[Any] = [row.group, row.name, row.source]
        best_here = []
        for key, _, has_delta in COLUMNS:
            value = row.values.get(key)
            digits = 0 if key == "arena_length" else 1
            text = _fmt(value, digits)
            if has_delta and value is not None and best.get((row.group, key)) == value:
                text = f"**{text}**"
                best_here.append(key)
            cell = f"{row.name}: {titles[key]}"
            if key in row.incomplete:
                text += daggers.mark([f"{row.incomplete[key]}; see its eval.json"], cell)
            if key in row.not_comparable:
                text += double_daggers.mark(row.not_comparable[key], cell)
            cells.append(text)
            record.append("" if value is None else round(value, 4))
            if has_delta:
                d = (
                    _delta(value, baseline.values.get(key))
                    if baseline is not None
                    and row is not baseline
                    and row.comparability(key) == baseline.comparability(key)
                    else None
                )
                cells.append("–" if d is None else f"{d:+.1f}")
                record.append("" if d is None else round(d, 4))
        record += [
            ";".join(best_here),
            ";".join(sorted(row.incomplete)),
            ";".join(sorted(row.not_comparable)),
        ]
        writer.writerow(record)
        lines.append("| " + " | ".join(cells) + " |")
    notes += daggers.notes() + double_daggers.notes()
    return "\n".join(lines) + "\n", out.getvalue(), notes


def _general_table(rows: Sequence[ReportRow]) -> tuple[str, str] | None:
    from balcaprl.evaluate.general import GENERAL_BENCHMARKS

    with_general = [r for r in rows if r.general]
    if not with_general:
        return None
    names = [b.name for b in GENERAL_BENCHMARKS]
    best = {n: max((r.general[n] for r in with_general if n in r.general), default=None) for n in names}
    lines = ["| Model | " + " | ".join(names) + " | Avg. |", "|---|" + ":---:|" * (len(names) + 1)]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["model", "source", *names, "average"])
    for row in with_general:
        values = [row.general.get(n) for n in names]
        present = [v for v in values if v is not None]
        avg = sum(present) / len(present) if len(present) == len(names) else None
        cells = [
            "–" if v is None else (f"**{v:.2f}**" if v == best[n] else f"{v:.2f}")
            for n, v in zip(names, values, strict=True)
        ]
        lines.append(f"| {row.name} | " + " | ".join(cells) + f" | {_fmt(avg, 2)} |")
        writer.writerow(
            [
                row.name,
                row.source,
                *["" if v is None else v for v in values],
                "" if avg is None else round(avg, 4),
            ]
        )
    return "\n".join(lines) + "\n", out.getvalue()


# ----------------------------------------------------------------------------------------- Spearman


def rank_average(values: Sequence[float]) -> list[float]:
    """1-based ranks, ascending; tied values share the mean of the ranks they span."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rho with ties: the Pearson correlation of the average ranks."""
    if len(x) != len(y) or len(x) < 2:
        raise ValueError("Spearman needs two sequences of equal length >= 2")
    rx, ry = rank_average(x), rank_average(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    vx = sum((a - mx) ** 2 for a in rx)
    vy = sum((b - my) ** 2 for b in ry)
    if vx == 0 or vy == 0:
        raise ValueError("Spearman is undefined when one side has all values tied")
    return cov / math.sqrt(vx * vy)


def read_human_ranking(path: Path) -> dict[str, float]:
    """Model -> human score (higher is better) from: a text file listing models best first (one per
    line); a CSV with ``model`` and ``score`` (higher better) or ``rank`` (1 = best) columns; or a
    JSON object ``{model: score}`` / list of models best first."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise InputError(f"--human-ranking {path}: cannot read it ({error.strerror})") from None
    if path.suffix == ".json":
        data = json.loads(text)
        if isinstance(data, list):
            return {str(m): float(len(data) - i) for i, m in enumerate(data)}
        if isinstance(data, dict):
            return {str(k): float(v) for k, v in data.items()}
        raise InputError(f"{path}: expected a JSON list (best first) or {{model: score}}")
    if path.suffix == ".csv":
        rows = list(csv.DictReader(io.StringIO(text)))
        if rows and "score" in rows[0]:
            return {r["model"]: float(r["score"]) for r in rows}
        if rows and "rank" in rows[0]:
            return {r["model"]: -float(r["rank"]) for r in rows}
        raise InputError(f"{path}: a ranking CSV needs 'model' and 'score' or 'rank' columns")
    names = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    return {name: float(len(names) - i) for i, name in enumerate(names)}


def human_alignment(rows: Sequence[ReportRow], human: dict[str, float]) -> dict[str, Any]:
    """Per metric: Spearman between the rows' values and the human scores over the models in both."""
    by_name = {r.name: r for r in rows}
    unmatched = sorted(set(human) - set(by_name))
    out: dict[str, Any] = {
        "models": sorted(set(human) & set(by_name)),
        "unmatched_in_ranking": unmatched,
        "metrics": {},
    }
    for key, title, _ in COLUMNS:
        pairs = [(by_name[m].values.get(key), human[m]) for m in human if m in by_name]
        pairs = [(v, h) for v, h in pairs if v is not None]
        entry: dict[str, Any] = {"metric": title, "n_models": len(pairs)}
        try:
            entry["spearman"] = (
                spearman([p[0] for p in pairs], [p[1] for p in pairs]) if len(pairs) >= 3 else None
            )
        except ValueError as error:
            entry["spearman"], entry["note"] = None, str(error)
        if len(pairs) < 3:
            entry["note"] = "needs at least 3 models with a value"
        out["metrics"][key] = entry
    return out


# ----------------------------------------------------------------------------------------- figure


FIGURE_TITLE = (
    "Caption quality from three views (grey: the paper's published rows; outlined: baseline; "
    "whiskers: 95% bootstrap interval where the evaluation recorded one; "
    "†: incomplete evaluation; ‡: not comparable with the paper's Table 1)"
)


def plot_report(rows: Sequence[ReportRow], path: Path, baseline: ReportRow | None = None) -> Path:
    """Bars per row on each of the three views, the length and b-CapScore; the baseline outlined."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = report_figure(rows, baseline)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=130)
    plt.close(fig)
    atomic_write_bytes(Path(path), buffer.getvalue())
    return Path(path)


def report_figure(rows: Sequence[ReportRow], baseline: ReportRow | None = None) -> Any:
    """The figure :func:`plot_report` saves (a matplotlib ``Figure``; the caller closes it)."""
    import textwrap

    import matplotlib.pyplot as plt

    keys = [(k, t) for k, t, _ in COLUMNS if any(r.values.get(k) is not None for r in rows)]
    # The title is wrapped to the figure's width: with one metric the figure is one panel wide and
    # the title, on one line, was cut at both edges.
    width = 3.3 * max(1, len(keys))
    title = textwrap.fill(FIGURE_TITLE, width=max(30, int(width * 13)))
    fig_height = 1.2 + 0.42 * len(rows) + 0.16 * title.count("\n")
    fig, axes = plt.subplots(1, max(1, len(keys)), figsize=(width, fig_height), sharey=True)
    axes = list(axes) if len(keys) > 1 else [axes]
    names = [r.name for r in rows]
    positions = list(range(len(rows)))[::-1]
    palette = plt.get_cmap("tab10")
    for ax, (key, column) in zip(axes, keys, strict=True):
        for pos, row, index in zip(positions, rows, range(len(rows)), strict=True):
            value = row.values.get(key)
            if value is None:
                ax.text(0, pos, " n/a", va="center", fontsize=8, color="0.5")
                continue
            colour = "0.75" if row.published else palette(index % 10)
            interval = row.intervals.get(key)
            whisker = None if interval is None else [[value - interval[0]], [interval[1] - value]]
            bar = ax.barh(pos, value, color=colour, edgecolor="black" if row is baseline else colour,
                          linewidth=1.6 if row is baseline else 0.5, height=0.7, xerr=whisker,
                          error_kw={"elinewidth": 0.9, "capsize": 2})  # fmt: skip
            label = f"{value:.0f}" if key == "arena_length" else f"{value:.1f}"
            marks = ("†" if key in row.incomplete else "") + ("‡" if key in row.not_comparable else "")
            ax.bar_label(bar, labels=[label + marks], fontsize=7, padding=2)
        ax.axvline(0, color="black", linewidth=0.6)
        ax.set_title(column + ("" if key == "arena_length" else " ↑"), fontsize=10)
        ax.tick_params(axis="x", labelsize=8)
        ax.margins(x=0.18)
    axes[0].set_yticks(positions)
    axes[0].set_yticklabels(names, fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------------------- report


def build_report(
    paths: Sequence[Path],
    out_dir: Path,
    *,
    baseline: str | None = None,
    published: str | None = None,
    human_ranking: Path | None = None,
    title: str = "Caption evaluation",
) -> Report:
    """Load the rows, write ``report.md``/``.csv``/``.png`` (and the optional parts) to ``out_dir``."""
    rows = load_eval_rows(paths) if paths else []
    if published:
        rows += published_rows(published)
    if not rows:
        raise InputError("nothing to report: give evaluation folders and/or --published")
    # The baseline: --baseline, else the first run given (the model before training, as a report's
    # first argument usually is), else none (published rows alone).
    runs = [row for row in rows if not row.published]
    base = _find(rows, baseline) if baseline else (runs[0] if runs else None)
    table_md, table_csv, notes = _table(rows, base)
    parts = [f"# {title}\n", table_md]
    if base is not None:
        chosen = "" if baseline else " (the first run; --baseline chooses another)"
        parts.append(
            f"Δ: difference to the baseline, **{base.name}**{chosen}, taken only between numbers of one "
            "comparability class (both comparable with the paper's Table 1, or both not for the same "
            "reasons). Bold values: the best of their group.\n"
        )
    parts.extend(f"{n}\n" for n in dict.fromkeys(notes))
    parts.extend(f"Scoring rules, {row.name}: " + " | ".join(row.rules) + "\n" for row in rows if row.rules)
    if any(row.not_comparable for row in rows):
        parts.append(
            "‡ numbers compare with the paper's Table 1 only when they come from the benchmarks' official "
            "prompts (the `official:` section of the evaluation config), the official protocol options and "
            "the benchmark's judge model; see docs/evaluation-official.md.\n"
        )
    general = _general_table(rows)
    if general is not None:
        parts += ["\n## General vision benchmarks (lmms-eval)\n", general[0]]
    alignment = None
    if human_ranking is not None:
        human = read_human_ranking(human_ranking)
        alignment = human_alignment(rows, human)
        lines = ["\n## Agreement with the human ranking (model-level Spearman)\n",
                 "| Metric | Models | Spearman ρ |", "|---|:---:|:---:|"]  # fmt: skip
        for entry in alignment["metrics"].values():
            rho = "–" if entry["spearman"] is None else f"{entry['spearman']:.3f}"
            lines.append(f"| {entry['metric']} | {entry['n_models']} | {rho} |")
        paper = ", ".join(f"{r['metric']} {r['spearman']}" for r in published_spearman())
        lines.append(f"\nThe paper's Table 7 (CapArena's human ranking): {paper}.")
        if alignment["unmatched_in_ranking"]:
            lines.append(f"Not among the evaluated runs: {', '.join(alignment['unmatched_in_ranking'])}.")
        parts.append("\n".join(lines) + "\n")
    markdown = "\n".join(parts)
    out_dir = Path(out_dir)
    atomic_write_text(out_dir / "report.md", markdown)
    atomic_write_text(out_dir / "report.csv", table_csv)
    plot_report(rows, out_dir / "report.png", base)
    if general is not None:
        atomic_write_text(out_dir / "general.md", general[0])
        atomic_write_text(out_dir / "general.csv", general[1])
    if alignment is not None:
        atomic_write_text(out_dir / "human_alignment.json", json.dumps(alignment, indent=2) + "\n")
    return Report(rows, base, markdown, table_csv, *(general or (None, None)), alignment)
