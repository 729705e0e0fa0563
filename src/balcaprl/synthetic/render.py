"""Pillow renderer: scene graph -> RGB image, and the pixel keys that let a judge find the scene again.

Rendering is deterministic (same scene and size, same pixels), drawn at 2x and downsampled so edges
are smooth. The lookup key hashes the *decoded* pixels (plus the size), not the file bytes, so a
lossless re-encode of the PNG still finds its scene; small thumbnails let a lossy re-encode (JPEG) or a
resize of a scene's own image be recognised (see :class:`balcaprl.synthetic.oracle.OracleJudge`).
"""

from __future__ import annotations

import hashlib
import io
import math
from functools import lru_cache

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from balcaprl.synthetic.scenes import Scene, SceneObject

DEFAULT_IMAGE_SIZE = 224
THUMB_SIDE = 8
_SUPERSAMPLE = 2

RGB = {
    "red": (220, 40, 40),
    "orange": (245, 140, 20),
    "yellow": (240, 210, 30),
    "green": (40, 160, 60),
    "blue": (40, 90, 220),
    "purple": (130, 60, 180),
    "pink": (240, 120, 180),
    "black": (30, 30, 30),
}
_BACKGROUND = (242, 242, 238)
_PATTERN = (200, 200, 196)
_LIGHT_COLORS = {"yellow", "orange", "pink"}
_RADIUS = {"small": 0.17, "medium": 0.27, "large": 0.38}  # half-extent as a fraction of the cell side


@lru_cache(maxsize=32)
def _font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    return ImageFont.load_default(size=size)


def _regular_polygon(cx: float, cy: float, r: float, n: int, phase: float) -> list[tuple[float, float]]:
    return [
        (cx + r * math.cos(phase + 2 * math.pi * i / n), cy + r * math.sin(phase + 2 * math.pi * i / n))
        for i in range(n)
    ]


def _star(cx: float, cy: float, r: float) -> list[tuple[float, float]]:
    points = []
    for i in range(10):
        radius = r if i % 2 == 0 else 0.45 * r
        angle = -math.pi / 2 + math.pi * i / 5
        points.append((cx + radius * math.cos(angle), cy + radius * math.sin(angle)))
    return points


def _cross(cx: float, cy: float, r: float) -> list[tuple[float, float]]:
    w = 0.38 * r
    return [
        (cx - w, cy - r), (cx + w, cy - r), (cx + w, cy - w), (cx + r, cy - w), (cx + r, cy + w), (cx + w, cy + w),
        (cx + w, cy + r), (cx - w, cy + r), (cx - w, cy + w), (cx - r, cy + w), (cx - r, cy - w), (cx - w, cy - w),
    ]  # fmt: skip


def _draw_object(draw: ImageDraw.ImageDraw, obj: SceneObject, cell: float) -> None:
    cx = (obj.col + 0.5 + obj.dx) * cell
    cy = (obj.row + 0.5 + obj.dy) * cell
    r = _RADIUS[obj.size] * cell
    fill = RGB[obj.color]
    box = (cx - r, cy - r, cx + r, cy + r)
    if obj.kind == "circle":
        draw.ellipse(box, fill=fill)
    elif obj.kind == "square":
        s = 0.85 * r
        draw.rectangle((cx - s, cy - s, cx + s, cy + s), fill=fill)
    elif obj.kind == "triangle":
        draw.polygon([(cx, cy - r), (cx + r, cy + 0.8 * r), (cx - r, cy + 0.8 * r)], fill=fill)
    elif obj.kind == "star":
        draw.polygon(_star(cx, cy, r), fill=fill)
    elif obj.kind == "diamond":
        draw.polygon([(cx, cy - r), (cx + 0.7 * r, cy), (cx, cy + r), (cx - 0.7 * r, cy)], fill=fill)
    elif obj.kind == "hexagon":
        draw.polygon(_regular_polygon(cx, cy, r, 6, 0.0), fill=fill)
    elif obj.kind == "cross":
        draw.polygon(_cross(cx, cy, r), fill=fill)
    elif obj.kind == "ring":
        draw.ellipse(box, outline=fill, width=max(1, round(0.32 * r)))
    else:
        raise ValueError(f"unknown shape kind {obj.kind!r}")
    if obj.text:
        on_fill = obj.kind != "ring" and obj.color not in _LIGHT_COLORS
        ink = (255, 255, 255) if on_fill else (20, 20, 20)
        font = _font(max(6, round(0.42 * r)))
        draw.text(
            (cx, cy + (0.15 * r if obj.kind == "triangle" else 0)),
            obj.text.upper(),
            fill=ink,
            font=font,
            anchor="mm",
        )


def _draw_background(draw: ImageDraw.ImageDraw, texture: str, side: int) -> None:
    step = side / 14
    if texture == "striped":
        for i in range(-14, 15):
            x = i * step * 1.0
            draw.line([(x, 0), (x + side, side)], fill=_PATTERN, width=max(1, round(step / 4)))
    elif texture == "dotted":
        rad = step / 6
        for i in range(14):
            for j in range(14):
                x, y = (i + 0.5) * step, (j + 0.5) * step
                draw.ellipse((x - rad, y - rad, x + rad, y + rad), fill=_PATTERN)
    elif texture == "checkered":
        for i in range(14):
            for j in range(14):
                if (i + j) % 2:
                    draw.rectangle((i * step, j * step, (i + 1) * step, (j + 1) * step), fill=(228, 228, 224))
    elif texture != "plain":
        raise ValueError(f"unknown background texture {texture!r}")


def render_scene(scene: Scene, size: int = DEFAULT_IMAGE_SIZE) -> Image.Image:
    """Draw ``scene`` as a ``size`` x ``size`` RGB image."""
    if size < 24:
        raise ValueError(f"image size must be at least 24 px, got {size}")
    side = size * _SUPERSAMPLE
    image = Image.new("RGB", (side, side), _BACKGROUND)
    draw = ImageDraw.Draw(image)
    _draw_background(draw, scene.texture, side)
    for obj in scene.objects:
        _draw_object(draw, obj, side / 3)
    return image.resize((size, size), Image.Resampling.LANCZOS)


def png_bytes(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", optimize=False)
    return buffer.getvalue()


def pixel_key(image: Image.Image) -> str:
    """sha256 over the size and the decoded RGB pixels: survives any lossless re-encode."""
    rgb = image.convert("RGB")
    digest = hashlib.sha256(f"{rgb.width}x{rgb.height}:".encode())
    digest.update(rgb.tobytes())
    return digest.hexdigest()


def thumbnail(image: Image.Image, side: int = THUMB_SIDE) -> np.ndarray:
    """A ``side`` x ``side`` RGB box-filtered thumbnail (uint8, 3 * side**2 values): a fingerprint robust
    to resizing and JPEG (8x8, 192 values, is what ``scenes.jsonl`` stores)."""
    small = image.convert("RGB").resize((side, side), Image.Resampling.BOX)
    return np.asarray(small, dtype=np.uint8).reshape(-1)
