"""What `balcaprl inspect` reads, turned into caption cards (:mod:`balcaprl.inspect.cards`).

    a scores folder       ``balcaprl score --out``: scores.jsonl, summary.json, verdicts.jsonl
    an evaluation folder  ``balcaprl evaluate --out``: eval.json and bcapscore/ (a scores folder)
    a training run        ``balcaprl train``: rollouts.jsonl, metrics.jsonl, recipe.yaml
    a demo run            ``balcaprl demo --out``: data/, eval/NAME.json, rl/VARIANT/ (training runs)

Verdicts: a scores folder has them in verdicts.jsonl. A training run's rollouts.jsonl logs rewards,
not verdicts; when the run's dataset is a synthetic one, the oracle re-derives each rollout's verdict
(it is deterministic, so this is the verdict the trainer saw) and the card keeps it only if it gives
back the logged rewards. Elsewhere a rollout card shows its rewards and shares without assertions.
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from balcaprl.errors import InputError
from balcaprl.inspect.cards import metric_scores, verdict_fields, word_ratio
from balcaprl.inspect.images import ImageTable
from balcaprl.rewards import b_capscore, score_verdict

__all__ = ["Inspection", "InspectError", "RunView", "load_inspection"]

SCORES_FILE, SUMMARY_FILE, VERDICTS_FILE = "scores.jsonl", "summary.json", "verdicts.jsonl"
ROLLOUTS_FILE, METRICS_FILE, RECIPE_FILE = "rollouts.jsonl", "metrics.jsonl", "recipe.yaml"
EVAL_FILE, DEMO_CONFIG_FILE = "eval.json", "demo_config.yaml"
_CLOSE = 1e-9  # re-derived rewards must match the logged ones to this
# card key -> key of a demo's held-out record (eval/NAME.json)
HELDOUT_FIELDS = {"precision": "precision", "recall": "recall", "linguistic": "linguistic",
                  "b_capscore": "b_capscore", "meta": "non_pointable_share", "halluc": "non_visible_share"}  # fmt: skip


class InspectError(InputError):
    """A path `balcaprl inspect` cannot read; the message says what it expected."""


@dataclass
class RunView:
    """A training run's panel: its reward and length curves and which steps' rollouts the page holds."""

    label: str
    curves_png: bytes | None
    steps_logged: list[int]
    steps_shown: list[int]
    last_metrics: dict[str, Any] = field(default_factory=dict)


@dataclass
class Inspection:
    """Everything the page shows."""

    title: str
    kind: str  # scores | evaluation | training | demo
    sources: list[str] = field(default_factory=list)  # labels; a card's "source" indexes this
    cards: list[dict[str, Any]] = field(default_factory=list)
    images: ImageTable = field(default_factory=ImageTable)
    runs: list[RunView] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def source(self, label: str) -> int:
        self.sources.append(label)
        return len(self.sources) - 1


# ------------------------------------------------------------------------------------------ files


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    # split on newlines only: str.splitlines would also split inside a caption at U+2028, U+0085, ...
    for number, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise InspectError(f"{path}:{number}: not JSON ({error.msg})") from None
        if not isinstance(row, dict):
            raise InspectError(f"{path}:{number}: expected a JSON object")
        rows.append(row)
    return rows


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise InspectError(f"{path}: not JSON ({error.msg})") from None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


# ----------------------------------------------------------------------------------- scores folder


def _add_scores(found: Inspection, folder: Path, image_root: Path | None, label: str) -> None:
    scores = _read_jsonl(folder / SCORES_FILE)
    summary = _read_json(folder / SUMMARY_FILE) if (folder / SUMMARY_FILE).is_file() else {}
    verdicts_path = folder / VERDICTS_FILE
    verdicts: list[dict[str, Any]] | None = None
    if verdicts_path.is_file():
        verdicts = _read_jsonl(verdicts_path)
        if len(verdicts) != len(scores):
            raise InspectError(
                f"{verdicts_path} has {len(verdicts)} rows and {folder / SCORES_FILE} {len(scores)}; "
                "they come from one `balcaprl score` run and must match line by line"
            )
    else:
        found.notes.append(
            f"{folder} has no {VERDICTS_FILE} (written by `balcaprl score` since it records verdicts): "
            "cards show scores without assertions; score again to see them"
        )
    # An evaluation's b-CapScore folder keeps its inputs as {key: text} files next to the scores.
    texts = {name: _read_json(folder / f"{name}.json") for name in ("captions", "references")
             if (folder / f"{name}.json").is_file()}  # fmt: skip
    root = image_root or (Path(summary["image_root"]) if summary.get("image_root") else None)
    if root is None:
        found.notes.append(f"{folder}: no image folder known; pass --images DIR to show the images")
    source = found.source(label)
    for number, row in enumerate(scores):
        extra = verdicts[number] if verdicts is not None else {}
        image = str(row.get("image", ""))
        if verdicts is not None and extra.get("image") != image:
            raise InspectError(
                f"{verdicts_path}:{number + 1}: image {extra.get('image')!r} where {SCORES_FILE} has {image!r}"
            )
        caption = extra.get("caption", texts.get("captions", {}).get(image, ""))
        reference = extra.get("reference", texts.get("references", {}).get(image))
        card: dict[str, Any] = {
            "id": image,
            "source": source,
            "image": found.images.add(image, root) if root is not None else None,
            "caption": caption,
            "reference": reference,
            "ratio": word_ratio(caption, reference),
            "ratio_unit": "words",
            "in_band": None,
            "masked": None,  # b-CapScore has no length control
            "failure": row.get("failure"),
            "detail": row.get("detail") or "",
            "verdict_from": None,
            "note": "",
        }
        for key in ("precision", "recall", "linguistic", "b_capscore"):
            card[key] = _number(row.get(key))
        card["linguistic_raw"] = card["linguistic"]
        if extra.get("verdict") is not None:
            card.update(verdict_fields(extra["verdict"]), verdict_from="judge")
        found.cards.append(card)


def _load_evaluation(found: Inspection, folder: Path, image_root: Path | None) -> None:
    record = _read_json(folder / EVAL_FILE)
    bcap = folder / "bcapscore"
    if not (bcap / SCORES_FILE).is_file():
        raise InspectError(
            f"{folder} holds no b-CapScore results ({bcap / SCORES_FILE}); the page shows b-CapScore "
            "verdicts (run `balcaprl evaluate --suite bcapscore ...`)"
        )
    found.title = str(record.get("label") or folder.name)
    others = sorted(set(record.get("results", {})) - {"bcapscore"})
    if others:
        found.notes.append(f"other protocols in {EVAL_FILE} ({', '.join(others)}) are not shown")
    _add_scores(found, bcap, image_root, f"b-CapScore: {record.get('label') or folder.name}")


# ------------------------------------------------------------------------------------ training runs


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
                raise InspectError(f"the run's dataset {path}: {error}") from None
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


def _curves(metrics: Sequence[dict[str, Any]], title: str) -> bytes | None:
    from balcaprl.demo.report import plot_training_curves

    steps = [m for m in metrics if m.get("kind", "step") == "step"]
    if not steps:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        path = plot_training_curves(steps, Path(tmp) / "curves.png", title=title)
        return path.read_bytes()


def _recipe(run: Path) -> dict[str, Any]:
    path = run / RECIPE_FILE
    if not path.is_file():
        return {}
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as error:
        raise InspectError(f"{path}: not YAML ({error})") from None


def _add_training_run(
    found: Inspection,
    run: Path,
    steps: Sequence[int] | None,
    data_dir: Path | None,
    label: str,
    datasets: dict[Path, _Dataset],
) -> None:
    from balcaprl.train.metrics import read_jsonl

    recipe = _recipe(run)
    metrics = read_jsonl(run / METRICS_FILE)
    rollouts = read_jsonl(run / ROLLOUTS_FILE)
    logged = sorted({int(r["step"]) for r in rollouts if "step" in r})
    chosen = list(steps) if steps else logged[-1:]
    missing = [s for s in chosen if s not in logged]
    if missing and logged:
        raise InspectError(
            f"{run / ROLLOUTS_FILE} has no rollouts of step(s) {missing}; it logged steps "
            f"{_ranges(logged)} (recipe run.log_rollouts_every)"
        )
    step_rows = [m for m in metrics if m.get("kind", "step") == "step"]
    found.runs.append(
        RunView(
            label=label,
            curves_png=_curves(metrics, label),
            steps_logged=logged,
            steps_shown=[s for s in chosen if s in logged],
            last_metrics=step_rows[-1] if step_rows else {},
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
    precision, recall = _number(row.get("precision")), _number(row.get("recall"))
    linguistic, raw = _number(row.get("linguistic")), _number(row.get("linguistic_raw"))
    # Without a verdict, b-CapScore from the logged rewards (the metric's rule: the unmasked score).
    bcap = None
    if precision is not None and recall is not None and raw is not None:
        bcap = float(b_capscore(precision, recall, raw))
    return {
        "id": str(row.get("id", "")),
        "source": source,
        "image": None,
        "caption": caption,
        "reference": reference,
        "precision": precision,
        "recall": recall,
        "linguistic": linguistic,
        "linguistic_raw": raw,
        "b_capscore": bcap,
        "ratio": _number(row.get("length_ratio")),
        "ratio_unit": "tokens",
        "in_band": row.get("in_band"),
        "masked": bool(row.get("masked")) if mask and row.get("failure") is None else None,
        "meta": _number(row.get("non_pointable_share")),
        "halluc": _number(row.get("non_visible_share")),
        "failure": row.get("failure"),
        "detail": row.get("failure_detail") or "",
        "step": row.get("step"),
        "group": row.get("group"),
        "advantage": _number(row.get("advantage")),
        "verdict_from": None,
        "note": "",
    }


def _ranges(values: Sequence[int]) -> str:
    if len(values) <= 6:
        return ", ".join(map(str, values))
    return f"{values[0]}, {values[1]}, ..., {values[-1]} ({len(values)} steps)"


# --------------------------------------------------------------------------------------- demo runs


def _add_heldout(found: Inspection, path: Path, dataset: _Dataset, label: str) -> None:
    records = _read_json(path).get("records", [])
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
            card[key] = _number(record.get(name))
        card["linguistic_raw"] = card["linguistic"]
        if card["failure"] is None and reference is not None:
            verdict = dataset.oracle_verdict(row_id, caption, reference, "evaluation")
            if verdict is not None and _matches(verdict, True, record):
                card.update(verdict_fields(verdict), verdict_from="oracle")
                rederived += 1
        found.cards.append(card)
    if records:
        found.notes.append(f"{label}: the synthetic oracle re-derived {rederived} of {len(records)} verdicts")


def _load_demo(found: Inspection, root: Path, steps: Sequence[int] | None, data_dir: Path | None) -> None:
    data = data_dir or root / "data"
    if not (data / "dataset.json").is_file():
        raise InspectError(f"{root} is a demo run without its dataset ({data}); pass --data DIR")
    datasets = {data: _Dataset(data)}
    for run in sorted(p for p in (root / "rl").glob("*") if (p / METRICS_FILE).is_file()):
        _add_training_run(found, run, steps, data, f"rollouts: {run.name}", datasets)
    for path in sorted((root / "eval").glob("*.json")):
        name = "SFT" if path.stem == "sft" else path.stem
        _add_heldout(found, path, datasets[data], f"held-out: {name}")
    if not found.cards and not found.runs:
        raise InspectError(f"{root} holds no RL run (rl/*/metrics.jsonl) and no evaluation (eval/*.json) yet")


# ------------------------------------------------------------------------------------------ entry


def _kind(path: Path) -> tuple[str, Path]:
    if path.is_file():
        kinds = {SCORES_FILE: "scores", VERDICTS_FILE: "scores", SUMMARY_FILE: "scores", EVAL_FILE: "evaluation",
                 ROLLOUTS_FILE: "training", METRICS_FILE: "training"}  # fmt: skip
        if path.name in kinds:
            return kinds[path.name], path.parent
        raise InspectError(f"{path}: expected a folder, or one of {', '.join(sorted(kinds))}")
    if not path.is_dir():
        raise InspectError(f"{path} does not exist")
    if (path / DEMO_CONFIG_FILE).is_file():
        return "demo", path
    if (path / EVAL_FILE).is_file():
        return "evaluation", path
    if (path / SCORES_FILE).is_file():
        return "scores", path
    if (path / ROLLOUTS_FILE).is_file() or (path / METRICS_FILE).is_file():
        return "training", path
    raise InspectError(
        f"{path} is none of: a scores folder ({SCORES_FILE}), an evaluation folder ({EVAL_FILE}), a "
        f"training run ({ROLLOUTS_FILE}, {METRICS_FILE}) or a demo run ({DEMO_CONFIG_FILE}, rl/, eval/)"
    )


def load_inspection(
    path: Path | str,
    *,
    steps: Iterable[int] = (),
    image_root: Path | None = None,
    data_dir: Path | None = None,
) -> Inspection:
    """Read ``path`` (see the module docstring). ``steps``: the training steps whose rollouts the page
    shows (default: the last logged one). ``image_root``: the image folder of a scores folder (default:
    the one summary.json records). ``data_dir``: a training run's dataset (default: recipe.yaml's)."""
    path = Path(path)
    kind, folder = _kind(path)
    found = Inspection(title=folder.resolve().name, kind=kind)
    steps = sorted(set(steps))
    if kind == "scores":
        _add_scores(found, folder, image_root, f"scores: {folder.name}")
    elif kind == "evaluation":
        _load_evaluation(found, folder, image_root)
    elif kind == "training":
        _add_training_run(found, folder, steps, data_dir, f"rollouts: {folder.name}", {})
    else:
        _load_demo(found, folder, steps, data_dir)
    return found
