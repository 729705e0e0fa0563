"""Numbers, tables and the figure of a demo run: paired bootstrap, before/after table, variant
comparison (Markdown + CSV), and the reward/length curves over RL steps.

Pure functions over plain data (lists of per-caption scores, metrics.jsonl rows), so they are easy to
test with hand-computed values; the pipeline decides what to feed them.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

# (metrics.jsonl key, label) of the reward curves; each reward has a panel (unmasked: linguistic's).
REWARD_CURVES = (
    ("rewards/precision/mean", "precision"),
    ("rewards/recall/mean", "recall"),
    ("rewards/linguistic/mean", "linguistic (after length mask)"),
    ("rewards/linguistic_unmasked/mean", "linguistic (judge, unmasked)"),
)


# ------------------------------------------------------------------------------------ statistics


@dataclass(frozen=True)
class BootstrapInterval:
    """Mean paired difference ``after - before`` and its percentile bootstrap interval (same units)."""

    delta: float
    low: float
    high: float
    level: float
    samples: int

    @property
    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "excludes_zero": self.excludes_zero}


def paired_bootstrap(
    before: Sequence[float],
    after: Sequence[float],
    *,
    samples: int = 10_000,
    level: float = 0.95,
    seed: int = 0,
    scale: float = 1.0,
) -> BootstrapInterval:
    """Percentile bootstrap of the mean paired difference: resample *scenes* with replacement and
    take each resample's mean of ``after[i] - before[i]`` (the same scenes before and after, so the
    scene-to-scene spread cancels). ``scale`` multiplies everything (100 for b-CapScore x100)."""
    a = np.asarray(before, dtype=np.float64)
    b = np.asarray(after, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"before and after must be 1-D and paired, got shapes {a.shape} and {b.shape}")
    if a.size == 0:
        raise ValueError("no scenes to bootstrap")
    if not 0 < level < 1 or samples < 1:
        raise ValueError(f"need 0 < level < 1 and samples >= 1, got {level} and {samples}")
    diff = (b - a) * scale
    rng = np.random.default_rng(seed)
    means = np.empty(samples)
    chunk = max(1, 2_000_000 // diff.size)  # bounds memory for large evaluations
    for start in range(0, samples, chunk):
        n = min(chunk, samples - start)
        means[start : start + n] = diff[rng.integers(0, diff.size, size=(n, diff.size))].mean(axis=1)
    alpha = (1 - level) / 2
    low, high = np.quantile(means, [alpha, 1 - alpha])
    return BootstrapInterval(float(diff.mean()), float(low), float(high), level, samples)


def seed_scene_bootstrap(
    differences: Sequence[Sequence[float]], *, samples: int = 10_000, level: float = 0.95, seed: int = 0
) -> BootstrapInterval:
    """Percentile bootstrap of the mean of a (seeds x scenes) matrix of paired differences over both
    sources of variation: each resample draws seeds with replacement, then scenes with replacement
    (the same scenes for every seed drawn, as the scenes are shared), and takes the mean."""
    d = np.asarray(differences, dtype=np.float64)
    if d.ndim != 2 or d.size == 0:
        raise ValueError(f"need a non-empty seeds x scenes matrix, got shape {d.shape}")
    if not 0 < level < 1 or samples < 1:
        raise ValueError(f"need 0 < level < 1 and samples >= 1, got {level} and {samples}")
    rng = np.random.default_rng(seed)
    n_seeds, n_scenes = d.shape
    means = np.empty(samples)
    for k in range(samples):
        rows = rng.integers(0, n_seeds, size=n_seeds)
        cols = rng.integers(0, n_scenes, size=n_scenes)
        means[k] = d[np.ix_(rows, cols)].mean()
    alpha = (1 - level) / 2
    low, high = np.quantile(means, [alpha, 1 - alpha])
    return BootstrapInterval(float(d.mean()), float(low), float(high), level, samples)


def direction_verdict(interval: BootstrapInterval, sign: int) -> str:
    """``reproduced`` when the interval excludes zero on the paper's side (``sign`` +1: higher),
    ``opposite`` when it excludes zero on the other side, else ``not reproduced``."""
    if not interval.excludes_zero:
        return "not reproduced"
    return "reproduced" if (interval.delta > 0) == (sign > 0) else "opposite"


def moving_average(values: Sequence[float | None], window: int) -> list[float]:
    """Trailing mean over the last ``window`` finite values (NaN/None skipped; NaN until one is seen)."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    out, recent = [], []
    for value in values:
        if value is not None and math.isfinite(value):
            recent.append(float(value))
            if len(recent) > window:
                recent.pop(0)
        out.append(sum(recent) / len(recent) if recent else math.nan)
    return out


# ------------------------------------------------------------------------------- held-out figures


@dataclass
class HeldOut:
    """Held-out oracle figures of one policy: means in [0, 1], b-CapScore x100 (the paper's scale)."""

    label: str
    b_capscore: float
    precision: float
    recall: float
    linguistic: float
    mean_tokens: float
    n: int
    non_pointable_share: float = math.nan  # meta-commentary among caption assertions
    non_visible_share: float = math.nan  # hallucination among caption assertions
    fluency: float = math.nan  # the judge's fluency score, 1..10
    truncated_share: float = math.nan  # captions that hit the generation cap

    def to_json(self) -> dict[str, Any]:
        return {
            k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in asdict(self).items()
        }


def _fmt(value: float, spec: str) -> str:
    return (
        "-"
        if value is None or (isinstance(value, float) and not math.isfinite(value))
        else format(value, spec)
    )


def _signed(value: float, spec: str) -> str:
    return "-" if not math.isfinite(value) else format(value, "+" + spec)


BEFORE_AFTER_METRICS = (  # (attribute, label, scale, format)
    ("precision", "precision", 1.0, ".3f"),
    ("recall", "recall", 1.0, ".3f"),
    ("linguistic", "linguistic", 1.0, ".3f"),
    ("b_capscore", "b-CapScore (x100)", 1.0, ".1f"),
    ("mean_tokens", "mean length (tok.)", 1.0, ".1f"),
)


def before_after_rows(before: HeldOut, after: HeldOut, ci: BootstrapInterval | None) -> list[list[str]]:
    """Rows ``[metric, before, after, change]``; the b-CapScore row's change carries the interval."""
    rows = []
    for attr, label, scale, spec in BEFORE_AFTER_METRICS:
        b, a = getattr(before, attr) * scale, getattr(after, attr) * scale
        change = _signed(a - b, spec)
        if attr == "b_capscore" and ci is not None:
            change += f"  [{ci.low:+.1f}, {ci.high:+.1f}]"
        rows.append([label, _fmt(b, spec), _fmt(a, spec), change])
    return rows


def rich_before_after_table(before: HeldOut, after: HeldOut, ci: BootstrapInterval | None, title: str):
    from rich.table import Table

    level = f"{ci.level:.0%}" if ci is not None else "95%"
    table = Table(
        title=title, caption=f"change of b-CapScore with its paired bootstrap {level} CI over scenes"
    )
    table.add_column("held-out oracle", style="bold")
    for name in (f"before ({before.label})", f"after RL ({after.label})", "change"):
        table.add_column(name, justify="right")
    for row in before_after_rows(before, after, ci):
        table.add_row(*row)
    return table


# ------------------------------------------------------------------------------ variant comparison

COMPARISON_COLUMNS = (  # (key, header, format)
    ("variant", "variant", "s"),
    ("precision", "P", ".3f"),
    ("recall", "R", ".3f"),
    ("linguistic", "L", ".3f"),
    ("b_capscore", "b-CapScore", ".1f"),
    ("delta", "Δ b-CapScore", "+.1f"),
    ("ci", "95% CI", "s"),
    ("mean_tokens", "tokens", ".1f"),
    ("non_pointable_share", "meta", ".3f"),
    ("non_visible_share", "halluc.", ".3f"),
    ("fluency", "fluency", ".2f"),
    ("train_steps", "steps", "d"),
)


def comparison_rows(
    baseline: HeldOut, results: Sequence[tuple[str, HeldOut, BootstrapInterval | None, int]]
) -> list[dict[str, Any]]:
    """One dict per row: the SFT start first, then each variant (name, held-out, CI, RL steps)."""
    rows: list[dict[str, Any]] = []
    for name, held, ci, steps in [("SFT start", baseline, None, 0), *results]:
        rows.append(
            {
                "variant": name,
                "precision": held.precision,
                "recall": held.recall,
                "linguistic": held.linguistic,
                "b_capscore": held.b_capscore,
                "delta": ci.delta if ci is not None else math.nan,
                "ci": f"[{ci.low:+.1f}, {ci.high:+.1f}]" if ci is not None else "",
                "ci_low": ci.low if ci is not None else math.nan,
                "ci_high": ci.high if ci is not None else math.nan,
                "mean_tokens": held.mean_tokens,
                "non_pointable_share": held.non_pointable_share,
                "non_visible_share": held.non_visible_share,
                "fluency": held.fluency,
                "train_steps": steps,
            }
        )
    return rows


def _cell(value: Any, spec: str) -> str:
    if spec == "s":
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return "-"
    return format(value, spec)


def comparison_markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    header = "| " + " | ".join(h for _, h, _ in COMPARISON_COLUMNS) + " |"
    align = "| " + " | ".join("---" if s == "s" else "---:" for _, _, s in COMPARISON_COLUMNS) + " |"
    lines = [header, align]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row[k], s) for k, _, s in COMPARISON_COLUMNS) + " |")
    return "\n".join(lines) + "\n"


def comparison_csv(rows: Sequence[Mapping[str, Any]]) -> str:
    keys = [k for k, _, _ in COMPARISON_COLUMNS if k != "ci"] + ["ci_low", "ci_high"]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=keys, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow(
            {k: ("" if isinstance(row[k], float) and not math.isfinite(row[k]) else row[k]) for k in keys}
        )
    return buffer.getvalue()


def rich_comparison_table(rows: Sequence[Mapping[str, Any]], title: str):
    from rich.table import Table

    table = Table(title=title)
    for _, header, spec in COMPARISON_COLUMNS:
        table.add_column(header, justify="left" if spec == "s" else "right")
    for row in rows:
        table.add_row(*(_cell(row[k], s) for k, _, s in COMPARISON_COLUMNS))
    return table


# ---------------------------------------------------------------------------------------- figure


def plot_training_curves(
    metrics: Sequence[Mapping[str, Any]], out_png: Path | str, *, title: str = "", window: int = 20
) -> Path:
    """One panel per reward and one for caption length over RL steps, from ``metrics.jsonl`` step
    rows: each step faint, a trailing moving average of ``window`` steps bold. Each reward has an axis
    of its own, scaled to its values, and its panel title says start -> end: on one shared 0-1 axis a
    rise of 0.02 was invisible and precision and recall lay on top of each other."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure = training_curves_figure(metrics, title=title, window=window)
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=110)
    plt.close(figure)
    return out


def training_curves_figure(metrics: Sequence[Mapping[str, Any]], *, title: str = "", window: int = 20) -> Any:
    """The figure :func:`plot_training_curves` saves (a matplotlib ``Figure``; the caller closes it)."""
    import matplotlib.pyplot as plt

    steps_rows = [m for m in metrics if m.get("kind", "step") == "step"]
    if not steps_rows:
        raise ValueError("no step rows in the metrics: nothing to plot")
    steps = [m["step"] for m in steps_rows]
    fig, grid = plt.subplots(2, 2, figsize=(12, 8))
    panels = {"precision": grid[0][0], "recall": grid[0][1], "linguistic": grid[1][0]}
    colours = ("tab:blue", "tab:orange", "tab:green", "tab:olive")
    for (key, label), colour in zip(REWARD_CURVES, colours, strict=True):
        values = [m.get(key) for m in steps_rows]
        if all(v is None for v in values):
            continue
        axis = panels[key.split("/")[1].removesuffix("_unmasked")]
        smooth = moving_average(values, window)
        dashed = "unmasked" in key
        if not dashed:
            axis.plot(steps, [math.nan if v is None else v for v in values], color=colour, alpha=0.2, lw=0.8)
            axis.axhline(smooth[0], color="gray", lw=0.8, ls=":")  # where the reward started
            finite = [v for v in smooth if math.isfinite(v)]
            axis.set_title(f"{label}: {finite[0]:.3f} -> {finite[-1]:.3f} ({finite[-1] - finite[0]:+.3f})")
        axis.plot(steps, smooth, color=colour, lw=2, ls="--" if dashed else "-", label=label)
    for axis in panels.values():
        axis.set(xlabel="RL step", ylabel="training reward (sampled rollouts)")
        axis.grid(alpha=0.3)
        if axis.get_legend_handles_labels()[0]:
            axis.legend(loc="lower right", fontsize=8)

    right = grid[1][1]
    caption = [m.get("length/caption_tokens_mean") for m in steps_rows]
    reference = [m.get("length/reference_tokens_mean") for m in steps_rows]
    right.plot(steps, [math.nan if v is None else v for v in caption], color="tab:red", alpha=0.2, lw=0.8)
    right.plot(steps, moving_average(caption, window), color="tab:red", lw=2, label="caption")
    if any(v is not None for v in reference):
        right.plot(steps, moving_average(reference, window), color="gray", lw=1.5, ls="--", label="reference")
    right.set(xlabel="RL step", ylabel="tokens (policy tokenizer)", title="caption length")
    right.set_ylim(bottom=0)
    right.grid(alpha=0.3)
    masked = [m.get("length/out_of_band_share") for m in steps_rows]
    if any(v is not None for v in masked):
        share = right.twinx()
        share.plot(
            steps,
            moving_average(masked, window),
            color="tab:purple",
            lw=1,
            alpha=0.7,
            label="outside [τl, τu]",
        )
        share.set(ylim=(0, 1), ylabel="share of rollouts outside the length band")
        lines = right.get_legend_handles_labels()
        extra = share.get_legend_handles_labels()
        right.legend(lines[0] + extra[0], lines[1] + extra[1], loc="lower right", fontsize=8)
    else:
        right.legend(loc="lower right", fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig
