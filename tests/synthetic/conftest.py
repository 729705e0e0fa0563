"""Shared fixtures for the synthetic-world tests: one tiny dataset built once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from balcaprl.synthetic.scenes import Scene, SceneObject


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from balcaprl.synthetic.build import build_dataset

    return build_dataset(tmp_path_factory.mktemp("synthetic") / "ds", n_train=16, n_eval=4, seed=3)


@pytest.fixture()
def scene() -> Scene:
    """A hand-made scene the hand-written captions below describe."""
    return Scene(
        id="hand",
        texture="striped",
        objects=(
            SceneObject(kind="circle", color="red", size="large", row=0, col=0, text="go"),
            SceneObject(kind="square", color="blue", size="small", row=1, col=1),
            SceneObject(kind="triangle", color="green", size="medium", row=2, col=2),
            SceneObject(kind="circle", color="orange", size="small", row=0, col=2),
        ),
    )
