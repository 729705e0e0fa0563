"""From a dataset folder (the pinned on-disk format) to the rows TRL's GRPOTrainer reads.

Each row becomes:
    id                the dataset row id (groups the G rollouts of one prompt)
    prompt            [{"role": "user", "content": <prompt>}]; TRL puts the image before the text
    image             a PIL image, opened lazily when TRL fetches the row (RGB, optionally downscaled, and
                      resized to the policy processor's image grid so the rollout engine counts the same
                      image tokens as the trainer: ``train/modeling.py``)
    image_path        absolute path, what the judge is sent
    reference         the reference caption the judge compares against (recipe: data.reference)
    reference_tokens  its length in the *policy's* tokenizer, for the length mask (Sec. 2.3)

Reference lengths must be counted with the policy's tokenizer (the caption is counted with it too).
The dataset's ``reference_tokens`` column is reused only when its card names the policy's tokenizer
and the column is complete; otherwise the references are recounted here (cheap: text only).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from balcaprl.data.format import COLUMNS, read_card
from balcaprl.errors import ConfigError
from balcaprl.recipe import DataConfig, ImageConfig

if TYPE_CHECKING:
    from balcaprl.train.modeling import ImageGrid

logger = logging.getLogger(__name__)


def count_tokens(tokenizer: Any, texts: Sequence[str]) -> list[int]:
    """Token counts without special tokens, as ``balcaprl.data.format.TokenCounter`` counts them."""
    tok = getattr(tokenizer, "tokenizer", tokenizer)
    return [len(ids) for ids in tok(list(texts), add_special_tokens=False)["input_ids"]]


def reference_tokens_source(
    cfg: DataConfig, card: dict[str, Any], policy_names: Sequence[str], column_complete: bool
) -> str:
    """'dataset' or 'recount': where the reference lengths for the mask come from."""
    if cfg.reference == "reference_original":
        return "recount"  # the dataset's column counts the re-captioned reference, not this one
    if cfg.reference_tokens == "recount":
        return "recount"
    if cfg.reference_tokens == "dataset":
        if not column_complete:
            raise ConfigError(
                f"data.reference_tokens=dataset, but {cfg.path} has null reference_tokens; use 'auto' or 'recount'"
            )
        return "dataset"
    same_tokenizer = card.get("tokenizer") is not None and str(card["tokenizer"]) in {
        str(n) for n in policy_names
    }
    return "dataset" if same_tokenizer and column_complete else "recount"


def open_image(path: str, max_side: int | None, grid: ImageGrid | None = None):
    """A training image as every consumer sees it: RGB, at most ``max_side`` pixels a side (decoded
    within the one pixel limit, at a reduced scale where the format allows), then on ``grid``."""
    from balcaprl.images import open_image as open_bounded

    image = open_bounded(path, max_side=max_side, mode="RGB")
    return grid.resize(image) if grid is not None else image


def prepare_train_dataset(
    cfg: DataConfig,
    image_cfg: ImageConfig,
    tokenizer: Any,
    policy_names: Sequence[str],
    grid: ImageGrid | None = None,
):
    """Load ``cfg.path``'s train split as a ``datasets.Dataset`` in the shape above (images on ``grid``,
    the policy processor's :class:`~balcaprl.train.modeling.ImageGrid`, when it has one)."""
    from balcaprl.data.format import load_split

    root = Path(cfg.path).expanduser().resolve()
    card = read_card(root)
    ds = load_split(root, "train")
    missing = [c for c in COLUMNS if c not in ds.column_names]
    if missing:
        raise ConfigError(
            f"{root}/train.parquet lacks columns {missing}; rebuild it with the balcaprl data tools"
        )
    if cfg.max_samples is not None:
        ds = ds.select(range(min(cfg.max_samples, len(ds))))
    if len(ds) == 0:
        raise ConfigError(f"{root} has no training rows")

    references = ds[cfg.reference]
    absent = sum(r is None or not str(r).strip() for r in references)
    if absent:
        raise ConfigError(
            f"{absent} of {len(ds)} training rows of {root} have no {cfg.reference!r} caption; "
            "choose data.reference=reference or rebuild the dataset"
        )
    stored = ds["reference_tokens"]
    source = reference_tokens_source(
        cfg, card, policy_names, column_complete=all(n is not None for n in stored)
    )
    lengths = [int(n) for n in stored] if source == "dataset" else count_tokens(tokenizer, references)
    logger.info(
        "reference lengths for the length mask: %s (card tokenizer %r)", source, card.get("tokenizer")
    )
    empty = [row_id for row_id, n in zip(ds["id"], lengths, strict=True) if n <= 0]
    if empty:
        raise ConfigError(
            f"reference captions with no tokens (no length ratio possible), e.g. rows {empty[:5]}"
        )

    import datasets

    ds = datasets.Dataset.from_dict(
        {
            "id": [str(i) for i in ds["id"]],
            "prompt": [[{"role": "user", "content": p}] for p in ds["prompt"]],
            "image_path": [str(root / p) for p in ds["image"]],
            "reference": list(references),
            "reference_tokens": lengths,
        }
    )
    max_side = image_cfg.max_side

    def load_images(batch: dict[str, list]) -> dict[str, list]:
        # A generation batch repeats each prompt once per rollout: each image is opened once and
        # shared by its rows (read-only from here on: processors copy before they resize).
        opened: dict[str, Any] = {}
        for path in batch["image_path"]:
            if path not in opened:
                opened[path] = open_image(path, max_side, grid)
        return {**batch, "image": [opened[path] for path in batch["image_path"]]}

    return ds.with_transform(load_images)
