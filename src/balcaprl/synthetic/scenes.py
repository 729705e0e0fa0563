"""Scene graphs: the ground truth of the synthetic world, generated from a seed.

A scene puts 2..7 shapes into the cells of a 3x3 grid (one shape per cell, so every position word
is unambiguous), each with a kind, a colour and a size, some with a short printed word, on a plain or
textured background. No two shapes of a scene share both kind and colour, so "the red circle" always
names exactly one shape: the oracle can then bind every mention of a caption to one object.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Any

from balcaprl.errors import ConfigError
from balcaprl.synthetic.lexicon import CELL_NAMES, COLORS, KINDS, SIZES, TEXT_WORDS, TEXTURES


@dataclass(frozen=True)
class SceneObject:
    kind: str
    color: str
    size: str
    row: int  # 0 top .. 2 bottom
    col: int  # 0 left .. 2 right
    text: str | None = None  # a word printed on the shape, if any
    dx: float = 0.0  # jitter inside the cell, as a fraction of the cell side, in [-0.1, 0.1]
    dy: float = 0.0

    @property
    def cell(self) -> tuple[int, int]:
        return (self.row, self.col)

    @property
    def position_name(self) -> str:
        return CELL_NAMES[self.cell]

    @property
    def name(self) -> str:
        """``"red circle"``: unique within a scene."""
        return f"{self.color} {self.kind}"


@dataclass(frozen=True)
class Scene:
    id: str
    objects: tuple[SceneObject, ...]
    texture: str = "plain"

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "texture": self.texture, "objects": [asdict(o) for o in self.objects]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Scene:
        return cls(
            id=str(data["id"]),
            texture=str(data.get("texture", "plain")),
            objects=tuple(SceneObject(**o) for o in data["objects"]),
        )


@dataclass(frozen=True)
class SceneSpec:
    """How scenes are drawn from the world; the defaults are the issue's (2..7 shapes)."""

    min_objects: int = 2
    max_objects: int = 7
    text_probability: float = 0.3  # per medium/large shape
    texture_probability: float = 0.5  # a non-plain background
    # Subsets of the vocabulary to draw from (a smaller world learns faster; the parser and the
    # oracle still know every word, so naming an absent kind or colour is still a hallucination).
    kinds: tuple[str, ...] = KINDS
    colors: tuple[str, ...] = COLORS

    def __post_init__(self) -> None:  # ConfigError: these come from flags and config files
        if not 1 <= self.min_objects <= self.max_objects <= 9:
            raise ConfigError(
                f"need 1 <= min_objects <= max_objects <= 9 (one shape per 3x3 cell), "
                f"got {self.min_objects}..{self.max_objects}"
            )
        object.__setattr__(self, "kinds", tuple(self.kinds))  # lists from JSON/YAML are fine too
        object.__setattr__(self, "colors", tuple(self.colors))
        for name, chosen, known in (("kinds", self.kinds, KINDS), ("colors", self.colors, COLORS)):
            unknown = sorted(set(chosen) - set(known))
            if unknown or len(set(chosen)) != len(chosen) or not chosen:
                raise ConfigError(
                    f"{name} must be distinct, non-empty and drawn from {list(known)}; got {list(chosen)}"
                )
        if len(self.kinds) * len(self.colors) < self.max_objects:
            raise ConfigError(
                f"{len(self.kinds)} kinds x {len(self.colors)} colours cannot give {self.max_objects} "
                "shapes a unique (kind, colour) each"
            )


def generate_scene(rng: random.Random, scene_id: str, spec: SceneSpec = SceneSpec()) -> Scene:
    """One scene from ``rng``; all randomness comes from it, so a seed fixes the scene."""
    n = rng.randint(spec.min_objects, spec.max_objects)
    cells = rng.sample([(r, c) for r in range(3) for c in range(3)], n)
    pairs = rng.sample([(k, c) for k in spec.kinds for c in spec.colors], n)  # unique (kind, colour)
    objects = []
    for (row, col), (kind, color) in sorted(zip(cells, pairs, strict=True)):
        size = rng.choice(SIZES)
        text = rng.choice(TEXT_WORDS) if size != "small" and rng.random() < spec.text_probability else None
        objects.append(
            SceneObject(
                kind=kind,
                color=color,
                size=size,
                row=row,
                col=col,
                text=text,
                dx=round(rng.uniform(-0.1, 0.1), 3),
                dy=round(rng.uniform(-0.1, 0.1), 3),
            )
        )
    texture = rng.choice(TEXTURES[1:]) if rng.random() < spec.texture_probability else "plain"
    return Scene(id=scene_id, objects=tuple(objects), texture=texture)


def generate_scenes(n: int, seed: int, prefix: str = "scene", spec: SceneSpec = SceneSpec()) -> list[Scene]:
    """``n`` scenes with ids ``{prefix}-000000``...; the same seed gives the same scenes."""
    rng = random.Random(seed)
    return [generate_scene(rng, f"{prefix}-{i:06d}", spec) for i in range(n)]
