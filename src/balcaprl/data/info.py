"""`balcaprl data info DIR`: what is in a dataset folder, and a histogram of its reference lengths."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from balcaprl.data.format import SPLITS, TokenCounter, read_card, read_split_rows
from balcaprl.data.validation import REASONS
from balcaprl.errors import OutputError


def length_stats(lengths: list[int]) -> dict[str, float] | None:
    """count, mean, min, 5th/50th/95th percentiles and max of a list of lengths (None when empty)."""
    if not lengths:
        return None
    values = np.asarray(lengths, dtype=np.float64)
    p5, p50, p95 = np.percentile(values, [5, 50, 95])
    return {
        "count": len(lengths),
        "mean": round(float(values.mean()), 2),
        "min": int(values.min()),
        "p5": round(float(p5), 1),
        "median": round(float(p50), 1),
        "p95": round(float(p95), 1),
        "max": int(values.max()),
    }


def _words(texts: list[str]) -> list[int]:
    return [len(t.split()) for t in texts]


def dataset_info(dataset_dir: Path | str, tokenizer: TokenCounter | None = None) -> dict[str, Any]:
    """Counts, splits, sources, length statistics and rejections of a dataset folder.

    Lengths are in words for every text; in tokens for ``reference`` when the dataset stores them
    (the card's tokenizer), and for every text when ``tokenizer`` is given. ``lengths`` holds the
    raw per-row values the histogram is drawn from.
    """
    root = Path(dataset_dir)
    card = read_card(root)
    rows = {split: read_split_rows(root, split) for split in SPLITS}
    everything = [r for split in SPLITS for r in rows[split]]
    prompts = [r["prompt"] for r in everything]
    current = [r["reference"] for r in everything]
    with_original = [r for r in everything if r["reference_original"] is not None]
    original = [r["reference_original"] for r in with_original]
    recaptioned = sum(r["reference"] != r["reference_original"] for r in with_original)

    lengths: dict[str, dict[str, list[int]]] = {
        "words": {
            "prompt": _words(prompts),
            "reference_original": _words(original),
            "reference": _words(current),
        },
    }
    stored = [r["reference_tokens"] for r in everything]
    if tokenizer is not None:
        lengths["tokens"] = {
            "prompt": tokenizer.count(prompts) if prompts else [],
            "reference_original": tokenizer.count(original) if original else [],
            "reference": tokenizer.count(current) if current else [],
        }
    elif stored and all(n is not None for n in stored):
        lengths["tokens"] = {"reference": [int(n) for n in stored]}

    card_rejections = card.get("rejections") or {}
    return {
        "path": str(root),
        "name": card.get("name"),
        "version": card.get("version"),
        "counts": {split: len(rows[split]) for split in SPLITS},
        "tokenizer": tokenizer.name if tokenizer is not None else card.get("tokenizer"),
        "sources": dict(Counter(r["source"] for r in everything).most_common()),
        "distinct_prompts": len(set(prompts)),
        "recaptioned": recaptioned,
        "recaption": card.get("recaption"),
        "rejections": dict(sorted(card_rejections.items(), key=lambda kv: -kv[1])),
        "rejected": sum(card_rejections.values()),
        "length_stats": {
            unit: {field: length_stats(values) for field, values in per_field.items()}
            for unit, per_field in lengths.items()
        },
        "lengths": lengths,
    }


def write_length_histogram(info: dict[str, Any], png: Path | str) -> Path:
    """Overlaid histograms of reference lengths, original vs current (re-captioned), to ``png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    unit = "tokens" if "reference_original" in info["lengths"].get("tokens", {}) else "words"
    per_field = info["lengths"][unit]
    if info["recaptioned"] and per_field.get("reference_original"):
        series = [
            ("reference_original", per_field["reference_original"], "tab:orange"),
            ("reference (after re-captioning)", per_field["reference"], "tab:blue"),
        ]
    elif "tokens" in info["lengths"]:  # one series: prefer the tokens the trainer's length mask uses
        unit, series = (
            "tokens",
            [("reference (original captions)", info["lengths"]["tokens"]["reference"], "tab:blue")],
        )
    else:
        series = [("reference (original captions)", per_field["reference"], "tab:blue")]

    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    values = [v for _, vs, _ in series for v in vs]
    if values:
        bins = np.histogram_bin_edges(values, bins=min(50, max(5, len(set(values)))))
        for label, vs, color in series:
            stats = length_stats(vs)
            ax.hist(
                vs,
                bins=bins,
                alpha=0.55,
                color=color,
                label=f"{label}: n={len(vs)}, median {stats['median'] if stats else 0:g}",
            )
        ax.set_ylim(top=ax.get_ylim()[1] * 1.25)  # head-room, so the legend covers no bar
        ax.legend(loc="upper right", framealpha=0.9)
    else:
        ax.text(0.5, 0.5, "no rows", ha="center", va="center", transform=ax.transAxes)
    tokenizer = f" ({info['tokenizer']})" if unit == "tokens" and info.get("tokenizer") else ""
    ax.set_xlabel(f"reference length, {unit}{tokenizer}")
    ax.set_ylabel("samples")
    ax.set_title(f"{info['name']}: {info['counts']['train']} train / {info['counts']['eval']} eval")
    fig.tight_layout()
    png = Path(png)
    try:
        png.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(png)
    except OSError as error:  # a read-only dataset folder, or a folder where the file should go
        raise OutputError(
            f"--png {png}: cannot write the histogram there ({error.strerror or error}); pass --png FILE "
            "in a writable folder"
        ) from None
    finally:
        plt.close(fig)
    return png


def format_info(info: dict[str, Any]) -> str:
    """``info`` as plain text: a summary, a table of lengths, a table of rejections."""
    lines = [f"{info['name']} (version {info['version']}) at {info['path']}"]
    counts = info["counts"]
    lines.append(
        f"train {counts['train']}, eval {counts['eval']}; distinct prompts {info['distinct_prompts']}; "
        f"reference tokens counted with: {info['tokenizer'] or 'none'}"
    )
    recaption = info.get("recaption")
    if recaption:
        lines.append(
            f"re-captioned: {info['recaptioned']} rows by {recaption.get('model')} "
            f"(rubric {recaption.get('rubric_version')}); failures kept their original reference: "
            f"{recaption.get('failed', 0)}"
        )
    else:
        lines.append(f"re-captioned: {info['recaptioned']} rows (references are the original captions)")
    if info["sources"]:
        lines.append("sources: " + ", ".join(f"{k} {v}" for k, v in info["sources"].items()))

    keys = ("count", "mean", "min", "p5", "median", "p95", "max")
    length_rows = [
        [name, unit, *(f"{stats[k]:g}" for k in keys)]
        for unit, per_field in info["length_stats"].items()
        for name, stats in per_field.items()
        if stats
    ]
    lines += ["", "lengths", *_table(["text", "unit", "n", *keys[1:]], length_rows, left=2)]
    if info["rejections"]:
        rejected = [[reason, str(n), REASONS.get(reason, "")] for reason, n in info["rejections"].items()]
        lines += ["", f"rejected entries: {info['rejected']}"]
        lines += _table(["reason", "count", "meaning"], rejected, left=1, last_left=True)
    else:
        lines += ["", "rejected entries: 0"]
    return "\n".join(lines)


def _table(header: list[str], rows: list[list[str]], *, left: int, last_left: bool = False) -> list[str]:
    """Aligned columns: the first ``left`` columns (and the last, if ``last_left``) to the left,
    numbers to the right."""
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]

    def line(cells: list[str]) -> str:
        out = []
        for i, (cell, width) in enumerate(zip(cells, widths, strict=True)):
            to_left = i < left or (last_left and i == len(cells) - 1)
            out.append(cell.ljust(width) if to_left else cell.rjust(width))
        return "  ".join(out).rstrip()

    return [line(header), line(["-" * w for w in widths]), *map(line, rows)]


def render_info(info: dict[str, Any], console: Any) -> None:
    """Print :func:`format_info` through a rich ``Console`` (what the command passes), verbatim."""
    console.print(format_info(info), markup=False, highlight=False, soft_wrap=True)


def info_json(info: dict[str, Any]) -> str:
    """``info`` without the raw per-row lengths, as JSON."""
    return json.dumps({k: v for k, v in info.items() if k != "lengths"}, indent=2)
