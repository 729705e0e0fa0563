"""Training backends. ``balcaprl.train.train`` runs a recipe on TRL's GRPOTrainer (one machine).

    from balcaprl.recipe import load_recipe
    from balcaprl.train import train

    recipe = load_recipe("configs/qwen2_5_vl_3b.yaml", ["data.path=data/sharegpt4v", "run.output_dir=runs/3b"])
    result = train(recipe, judge)          # any balcaprl.judge.Judge
    result = train(recipe, judge, resume=True)

TRL and transformers are imported on first use, so ``import balcaprl.train`` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from balcaprl.train.trl_backend import BalancedGRPOTrainer, TrainResult

__all__ = ["BalancedGRPOTrainer", "TrainResult", "build_trainer", "train"]


def train(recipe, judge, **kwargs: Any) -> TrainResult:
    """See :func:`balcaprl.train.trl_backend.train`."""
    from balcaprl.train.trl_backend import train as _train

    return _train(recipe, judge, **kwargs)


def build_trainer(recipe, judge, **kwargs: Any) -> BalancedGRPOTrainer:
    """See :func:`balcaprl.train.trl_backend.build_trainer`."""
    from balcaprl.train.trl_backend import build_trainer as _build_trainer

    return _build_trainer(recipe, judge, **kwargs)


def __getattr__(name: str):
    if name in ("BalancedGRPOTrainer", "TrainResult"):
        from balcaprl.train import trl_backend

        return getattr(trl_backend, name)
    raise AttributeError(f"module 'balcaprl.train' has no attribute {name!r}")
