"""Reading a training run (``balcaprl train``: rollouts.jsonl, metrics.jsonl, recipe.yaml) and a demo
run (``balcaprl demo --out``: data/, eval/NAME.json, rl/VARIANT/).

A training run's rollouts.jsonl logs rewards, not verdicts; when the run's dataset is a synthetic one,
the oracle re-derives each rollout's verdict (it is deterministic, so this is the verdict the trainer
saw) and the card keeps it only if it gives back the logged rewards. Elsewhere a rollout card shows
its rewards and shares without assertions. A verdict logged with a rollout (``"verdict"``) is used
as it is.
"""

from __future__ import annotations

import io
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from balcaprl.errors import InputError
from balcaprl.inspect.cards import metric_scores, verdict_fields, word_ratio
from balcaprl.inspect.inspection import (
    METRICS_FILE,
    RECIPE_FILE,
    ROLLOUTS_FILE,
    Inspection,
    RunView,
    finite_number,
    read_json,
)
from balcaprl.rewards import RolloutRecord, score_verdict

_CLOSE = 1e-9  # re-derived rewards must match the logged ones to this
# card key -> key of a demo's held-out record (eval/NAME.json)
HELDOUT_FIELDS = {"precision": "precision", "recall": "recall", "linguistic": "linguistic",
                  "b_capscore": "b_capscore", "meta": "non_pointable_share", "halluc": "non_visible_share"}  # fmt: skip


class _Dataset:
    """A run's dataset: rows by id (both splits) and, for a synthetic one, the oracle."""

    def __init__(self, path: Path):
        from balcaprl.data.format import read_split_rows

        self.path = path
        self.rows: dict[str, dict[str, Any]] = {}
        for split in ("train", "eval"):
            try:
                for row in read_split_rows(path, split):
                    self.rows.setdefault(str(row["id"]), row)
            except FileNotFoundError as error:
                raise InputError(f"the run's dataset {path}: {error}") from None
        self.oracle = None
        self._scenes: dict[str, Any] = {}
        try:
            from balcaprl.synthetic.oracle import OracleJudge

            self.oracle = OracleJudge.from_dataset(path)
        except (ImportError, FileNotFoundError):
            self.oracle = None  # not a synthetic dataset: no verdicts to re-derive

    def oracle_verdict(self, row_id: str, caption: str, reference: str, rubric: str):
        if self.oracle is None or row_id not in self.rows:
            return None
        scene = self._scenes.get(row_id)
        if scene is None:
            try:
                scene = self._scenes[row_id] = self.oracle.lookup(self.rows[row_id]["image_path"])
            except (LookupError, OSError):
                return None
        return self.oracle.verdict(scene, caption, reference, rubric)


def _matches(verdict, pointability: bool, expected: dict[str, Any]) -> bool:
    """The verdict gives back the logged rewards (so it is the verdict the trainer scored)."""
    scores = score_verdict(verdict, pointability=pointability)
    pairs = ((scores.precision, expected.get("precision")), (scores.recall, expected.get("recall")),
             (scores.linguistic, expected.get("linguistic_raw", expected.get("linguistic"))))  # fmt: skip
    return all(e is not None and abs(s - e) <= _CLOSE for s, e in pairs)


def _curves(
    metrics: Sequence[dict[str, Any]], title: str, held_out: tuple[float, float] | None = None
) -> bytes | None:
    """The reward curves (``demo.report``) above the run's dynamics (``train.curves``), one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from PIL import Image

    from balcaprl.demo.report import plot_training_curves
    from balcaprl.train.curves import training_dynamics_figure

    steps = [m for m in metrics if m.get("kind", "step") == "step"]
    if not steps:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        rewards = plot_training_curves(steps, Path(tmp) / "curves.png", title=title)
        figure = training_dynamics_figure(steps, held_out=held_out)
        figure.savefig(Path(tmp) / "dynamics.png", dpi=110)
        plt.close(figure)
        top, bottom = Image.open(rewards), Image.open(Path(tmp) / "dynamics.png")
        both = Image.new("RGB", (max(top.width, bottom.width), top.height + bottom.height), "white")
        both.paste(top, (0, 0))
        both.paste(bottom, (0, top.height))
        out = io.BytesIO()
        both.save(out, format="PNG")
        return out.getvalue()


def _heldout_bcapscore(path: Path) -> float | None:
    """A demo evaluation's held-out b-CapScore (x100), or None where there is none."""
    return finite_number(read_json(path).get("b_capscore")) if path.is_file() else None


def _recipe(run: Path) -> dict[str, Any]:
    path = run / RECIPE_FILE
    if not path.is_file():
        return {}
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as error:
        raise InputError(f"{path}: not YAML ({error})") from None


def add_training_run(
    found: Inspection,
    run: Path,
    steps: Sequence[int] | None,
    data_dir: Path | None,
    label: str,
    datasets: dict[Path, _Dataset],
    held_out: tuple[float, float] | None = None,
) -> None:
    from balcaprl.train.metrics import read_jsonl

    recipe = _recipe(run)
    metrics = read_jsonl(run / METRICS_FILE)
    rollouts = read_jsonl(run / ROLLOUTS_FILE)
    logged = sorted({int(r["step"]) for r in rollouts if "step" in r})
    chosen = list(steps) if steps else logged[-1:]
    missing = [s for s in chosen if s not in logged]
    if missing and logged:
        raise InputError(
            f"{run / ROLLOUTS_FILE} has no rollouts of step(s) {missing}; it logged steps "
            f"{_ranges(logged)} (recipe run.log_rollouts_every)"
        )
    step_rows = [m for m in metrics if m.get("kind", "step") == "step"]
    # A batch's later updates reuse its rollouts and log no rewards: the header's figures come from
    # the last step that judged a batch.
    judged = [m for m in step_rows if finite_number(m.get("rewards/precision/mean")) is not None]
    found.runs.append(
        RunView(
            label=label,
            curves_png=_curves(metrics, label, held_out),
            steps_logged=logged,
            steps_shown=[s for s in chosen if s in logged],
            last_metrics=(judged or step_rows or [{}])[-1],
        )
    )
    if not rollouts:
        found.notes.append(f"{run} has no {ROLLOUTS_FILE} rows (set run.log_rollouts_every to log them)")
        return
    data_section = recipe.get("data") or {}
    data_path = data_dir or (Path(data_section["path"]) if data_section.get("path") else None)
    dataset = None
    if data_path is not None and (data_path / "dataset.json").is_file():
        dataset = datasets.get(data_path) or datasets.setdefault(data_path, _Dataset(data_path))
    else:
        found.notes.append(
            f"{label}: the run's dataset ({data_path or 'not named in recipe.yaml'}) is not readable; pass "
            "--data DIR to show images and references"
        )
    reference_key = data_section.get("reference", "reference")
    rewards = recipe.get("rewards") or {}
    pointability = bool(rewards.get("pointability", True))
    mask = ((rewards.get("length") or {}).get("mode", "mask")) == "mask"
    source = found.source(label)
    rederived = disagreed = 0
    wanted = set(chosen)
    for row in rollouts:
        if row.get("step") not in wanted:
            continue
        row_id = str(row.get("id", ""))
        data_row = dataset.rows.get(row_id) if dataset is not None else None
        reference = data_row.get(reference_key) if data_row is not None else None
        caption = str(row.get("caption", ""))
        card = _rollout_card(row, source, caption, reference, mask)
        if data_row is not None:
            card["image"] = found.images.add(data_row["image"], dataset.path)
        verdict = row.get("verdict")
        if verdict is not None:
            card.update(verdict_fields(verdict), verdict_from="judge")
        elif card["failure"] is None and dataset is not None and reference is not None:
            verdict = dataset.oracle_verdict(row_id, caption, reference, "training")
            if verdict is not None:
                if _matches(verdict, pointability, row):
                    card.update(verdict_fields(verdict), verdict_from="oracle")
                    rederived += 1
                else:
                    disagreed += 1
                    card["note"] = "the oracle's verdict today does not give the logged rewards; not shown"
        if verdict is not None and card["failure"] is None and card.get("verdict_from"):
            card["b_capscore"] = metric_scores(verdict)["b_capscore"]
        found.cards.append(card)
    if rederived or disagreed:
        found.notes.append(
            f"{label}: the synthetic oracle re-derived {rederived} rollout verdicts (training rubric)"
            + (f"; {disagreed} did not match the logged rewards and are left out" if disagreed else "")
        )
    elif dataset is not None and dataset.oracle is None:
        found.notes.append(
            f"{label}: {ROLLOUTS_FILE} logs rewards, not verdicts: rollout cards show no assertions"
        )


def _rollout_card(
    row: dict[str, Any], source: int, caption: str, reference: str | None, mask: bool
) -> dict[str, Any]:
    r = RolloutRecord.from_row(row)  # a rollouts.jsonl line: the record's row, plus step, group, advantage
    return {
        "id": str(r.id),
        "source": source,
        "image": None,
        "caption": caption,
        "reference": reference,
        "precision": finite_number(r.precision),
        "recall": finite_number(r.recall),
        "linguistic": finite_number(r.linguistic),
        "linguistic_raw": finite_number(r.linguistic_raw),
        # Without a verdict, b-CapScore from the logged rewards (the metric's rule: the unmasked score).
        "b_capscore": finite_number(r.b_capscore),
        "ratio": finite_number(r.length_ratio),
        "ratio_unit": "tokens",
        "in_band": r.in_band,
        "masked": r.masked if mask and r.judged else None,
        "meta": finite_number(r.non_pointable_share),
        "halluc": finite_number(r.non_visible_share),
        "failure": r.failure,
        "detail": r.failure_detail or "",
        "step": row.get("step"),
        "group": row.get("group"),
        "advantage": finite_number(row.get("advantage")),
        "verdict_from": None,
        "note": "",
    }


def _ranges(values: Sequence[int]) -> str:
    if len(values) <= 6:
        return ", ".join(map(str, values))
    return f"{values[0]}, {values[1]}, ..., {values[-1]} ({len(values)} steps)"


def _add_heldout(found: Inspection, path: Path, dataset: _Dataset, label: str) -> None:
    records = read_json(path).get("records", [])
    source = found.source(label)
    rederived = 0
    for record in records:
        row_id = str(record.get("id", ""))
        row = dataset.rows.get(row_id)
        caption = str(record.get("caption", ""))
        reference = row.get("reference") if row is not None else None
        tokens, ref_tokens = record.get("tokens"), (row or {}).get("reference_tokens")
        card: dict[str, Any] = {
            "id": row_id,
            "source": source,
            "image": found.images.add(row["image"], dataset.path) if row is not None else None,
            "caption": caption,
            "reference": reference,
            "ratio": tokens / ref_tokens if tokens and ref_tokens else word_ratio(caption, reference),
            "ratio_unit": "tokens" if tokens and ref_tokens else "words",
            "in_band": None,
            "masked": None,  # held-out figures are the metric's: no length control
            "failure": record.get("failure"),
            "detail": "",
            "verdict_from": None,
            "note": "",
        }
        for key, name in HELDOUT_FIELDS.items():
            card[key] = finite_number(record.get(name))
        card["linguistic_raw"] = card["linguistic"]
        if card["failure"] is None and reference is not None:
            verdict = dataset.oracle_verdict(row_id, caption, reference, "evaluation")
            if verdict is not None and _matches(verdict, True, record):
                card.update(verdict_fields(verdict), verdict_from="oracle")
                rederived += 1
        found.cards.append(card)
    if records:
        found.notes.append(f"{label}: the synthetic oracle re-derived {rederived} of {len(records)} verdicts")


def load_demo(found: Inspection, root: Path, steps: Sequence[int] | None, data_dir: Path | None) -> None:
    data = data_dir or root / "data"
    if not (data / "dataset.json").is_file():
        raise InputError(f"{root} is a demo run without its dataset ({data}); pass --data DIR")
    datasets = {data: _Dataset(data)}
    for run in sorted(p for p in (root / "rl").glob("*") if (p / METRICS_FILE).is_file()):
        before, after = (_heldout_bcapscore(root / "eval" / f"{name}.json") for name in ("sft", run.name))
        held_out = (before, after) if before is not None and after is not None else None
        add_training_run(found, run, steps, data, f"rollouts: {run.name}", datasets, held_out)
    for path in sorted((root / "eval").glob("*.json")):
        name = "SFT" if path.stem == "sft" else path.stem
        _add_heldout(found, path, datasets[data], f"held-out: {name}")
    if not found.cards and not found.runs:
        raise InputError(f"{root} holds no RL run (rl/*/metrics.jsonl) and no evaluation (eval/*.json) yet")
