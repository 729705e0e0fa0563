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

from collections.abc import Iterable
from pathlib import Path

from balcaprl.errors import InputError
from balcaprl.inspect.inspection import (
    DEMO_CONFIG_FILE,
    EVAL_FILE,
    METRICS_FILE,
    ROLLOUTS_FILE,
    SCORES_FILE,
    SUMMARY_FILE,
    VERDICTS_FILE,
    Inspection,
)
from balcaprl.inspect.runs import add_training_run, load_demo
from balcaprl.inspect.scores import add_scores, load_evaluation


def _kind(path: Path) -> tuple[str, Path]:
    if path.is_file():
        kinds = {SCORES_FILE: "scores", VERDICTS_FILE: "scores", SUMMARY_FILE: "scores", EVAL_FILE: "evaluation",
                 ROLLOUTS_FILE: "training", METRICS_FILE: "training"}  # fmt: skip
        if path.name in kinds:
            return kinds[path.name], path.parent
        raise InputError(f"{path}: expected a folder, or one of {', '.join(sorted(kinds))}")
    if not path.is_dir():
        raise InputError(f"{path} does not exist")
    if (path / DEMO_CONFIG_FILE).is_file():
        return "demo", path
    if (path / EVAL_FILE).is_file():
        return "evaluation", path
    if (path / SCORES_FILE).is_file():
        return "scores", path
    if (path / ROLLOUTS_FILE).is_file() or (path / METRICS_FILE).is_file():
        return "training", path
    raise InputError(
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
        add_scores(found, folder, image_root, f"scores: {folder.name}")
    elif kind == "evaluation":
        load_evaluation(found, folder, image_root)
    elif kind == "training":
        add_training_run(found, folder, steps, data_dir, f"rollouts: {folder.name}", {})
    else:
        load_demo(found, folder, steps, data_dir)
    return found
