"""A small, generated stand-in for ShareGPT4V in its exact published layout (tests, benchmark, demos).

``make_sharegpt4v_fixture(dir)`` writes ``dir/sharegpt4v_fixture.json`` (the list-of-conversations
JSON) and images under ``dir/images/`` in the real sub-folders (``coco/train2017``,
``sam/images``, ``llava/llava/pretrain/...``, ``wikiart/images``, ...), plus, when ``bad=True``, one
entry for every way an entry can be rejected. The returned :class:`Fixture` says which ids must be
kept and which reason each bad entry must be rejected for.
"""

from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

# Human turns as they appear in ShareGPT4V (the tag sits before or after the instruction).
PROMPTS = [
    "<image>\nWhat do you see happening in this image?",
    "Describe this image in detail.\n<image>",
    "<image>\nAnalyze the image in a comprehensive and detailed manner.",
    "<image>\nWhat's happening in the scene?",
]

# (folder under the image root, file-name pattern) per ShareGPT4V source.
SOURCES = [
    ("coco/train2017", "{:012d}.jpg"),
    ("sam/images", "sa_{}.jpg"),
    ("llava/llava_pretrain/images/00000", "{:09d}.jpg"),
    ("wikiart/images", "painting-{}.jpg"),
    ("web-celebrity/images", "celebrity_{}.jpg"),
    ("web-landmark/images", "landmark_{}.jpg"),
    ("share_textvqa/images", "{:016x}.jpg"),
]


@dataclass
class Fixture:
    json_path: Path
    image_root: Path
    good: list[str] = field(default_factory=list)  # ids that must be kept, in file order
    bad: dict[str, str] = field(default_factory=dict)  # JSON index (as str) -> expected reason
    renamed: dict[str, str] = field(default_factory=dict)  # kept under a new id: new id -> original


def _image_bytes(
    rng: np.random.Generator, size: tuple[int, int], fmt: str = "JPEG", mode: str = "RGB"
) -> bytes:
    """Smooth random colour fields plus grain: compresses like a photo (a 640x480 JPEG is ~120 KB,
    as COCO's are), and is unique per call, so no two fixture images share a hash by accident."""
    from PIL import Image

    w, h = size
    coarse = rng.integers(0, 256, (max(2, h // 16), max(2, w // 16), 3), dtype=np.uint8)
    smooth = np.asarray(
        Image.fromarray(coarse, "RGB").resize((w, h), Image.Resampling.BICUBIC), dtype=np.int16
    )
    grain = rng.integers(-10, 11, (h, w, 1), dtype=np.int16)
    img = Image.fromarray(np.clip(smooth + grain, 0, 255).astype(np.uint8), "RGB").convert(mode)
    buffer = io.BytesIO()
    img.save(buffer, fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return buffer.getvalue()


def png_claiming(width: int, height: int) -> bytes:
    """A PNG whose header claims a size its data does not have (a decompression bomb, as far as the
    header goes; only the header is ever read)."""
    import struct
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(b"\0" * 64))
        + chunk(b"IEND", b"")
    )


def _entry(sample_id: str, image: str, prompt: str, caption: str) -> dict:
    return {
        "id": sample_id,
        "image": image,
        "conversations": [{"from": "human", "value": prompt}, {"from": "gpt", "value": caption}],
    }


def make_sharegpt4v_fixture(
    out_dir: Path | str,
    n_good: int = 28,
    *,
    bad: bool = True,
    size: tuple[int, int] = (64, 48),
    seed: int = 0,
) -> Fixture:
    """Write the fixture; ``n_good`` distinct good images spread over all sources, ``size`` (w, h)."""
    rng = np.random.default_rng(seed)
    out = Path(out_dir)
    root = out / "images"
    fixture = Fixture(json_path=out / "sharegpt4v_fixture.json", image_root=root)
    entries: list = []

    def write(rel: str, data: bytes) -> str:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return rel

    def good_image(i: int, **kw) -> str:
        folder, pattern = SOURCES[i % len(SOURCES)]
        return write(f"{folder}/{pattern.format(1000 + i)}", _image_bytes(rng, size, **kw))

    def add_good(sample_id: str, image: str) -> None:
        caption = (
            f"A detailed description of picture {sample_id}, with a {['red', 'blue', 'green'][len(entries) % 3]} "
            "object in the centre. " + "It has many details. " * int(rng.integers(1, 12))
        )
        entries.append(_entry(sample_id, image, PROMPTS[len(entries) % len(PROMPTS)], caption))
        fixture.good.append(sample_id)

    def add_bad(reason: str, entry: object) -> None:
        fixture.bad[str(len(entries))] = reason
        entries.append(entry)

    for i in range(n_good):
        add_good(f"good-{i}", good_image(i))

    if bad:
        first = entries[0]["image"]
        # Files that exist but are not usable images.
        add_bad(
            "missing_image", _entry("bad-missing", "coco/train2017/000000999999.jpg", PROMPTS[0], "a cat")
        )
        add_bad(
            "zero_size_image",
            _entry("bad-empty", write("coco/train2017/000000000001.jpg", b""), PROMPTS[0], "x"),
        )
        add_bad(
            "unreadable_image",
            _entry(
                "bad-garbage", write("sam/images/sa_9.jpg", b"<html>404 Not Found</html>"), PROMPTS[1], "x"
            ),
        )
        whole = _image_bytes(rng, (320, 240))
        add_bad(
            "truncated_image",
            _entry(
                "bad-truncated",
                write("llava/llava_pretrain/images/00000/000000009.jpg", whole[: len(whole) // 2]),
                PROMPTS[2],
                "a partial download",
            ),
        )
        add_bad(
            "truncated_image",
            _entry(
                "bad-truncated-png",
                write("wikiart/images/cut.png", _image_bytes(rng, (120, 90), "PNG")[:300]),
                PROMPTS[2],
                "x",
            ),
        )
        add_bad(
            "absurd_aspect_ratio",
            _entry(
                "bad-banner",
                write("web-landmark/images/banner.jpg", _image_bytes(rng, (600, 40))),
                PROMPTS[0],
                "a very wide banner",
            ),
        )
        add_bad(
            "image_too_small",
            _entry(
                "bad-tiny",
                write("web-celebrity/images/tiny.jpg", _image_bytes(rng, (20, 20))),
                PROMPTS[0],
                "a thumbnail",
            ),
        )
        add_bad(
            "image_too_large",
            _entry(
                "bad-bomb", write("sam/images/sa_bomb.png", png_claiming(30_000, 30_000)), PROMPTS[0], "x"
            ),
        )
        # Paths that leave the image root (the targets exist, so only the path check can stop them).
        outside = out / "outside.jpg"
        outside.write_bytes(_image_bytes(rng, size))
        add_bad("unsafe_path", _entry("bad-dotdot", "../outside.jpg", PROMPTS[0], "escapes with .."))
        add_bad("unsafe_path", _entry("bad-dotdot-inner", "coco/../../outside.jpg", PROMPTS[0], "escapes"))
        add_bad("unsafe_path", _entry("bad-absolute", str(outside.resolve()), PROMPTS[0], "absolute path"))
        link = root / "coco/train2017/000000000777.jpg"
        os.symlink(os.path.relpath(outside, link.parent), link)  # relative: the fixture can be copied
        add_bad(
            "unsafe_path", _entry("bad-symlink", "coco/train2017/000000000777.jpg", PROMPTS[0], "a link out")
        )
        # Malformed entries.
        add_bad("malformed_entry", "not an object")
        add_bad(
            "malformed_entry", {"image": good_image(n_good + 0), "conversations": entries[0]["conversations"]}
        )
        add_bad("malformed_entry", {"id": "bad-no-image", "conversations": entries[0]["conversations"]})
        add_bad(
            "malformed_entry",
            {
                "id": "bad-value",
                "image": good_image(n_good + 1),
                "conversations": [
                    {"from": "human", "value": PROMPTS[0]},
                    {"from": "gpt", "value": ["not", "text"]},
                ],
            },
        )
        add_bad("missing_conversations", {"id": "bad-no-conv", "image": good_image(n_good + 2)})
        add_bad(
            "missing_conversations",
            {"id": "bad-empty-conv", "image": good_image(n_good + 3), "conversations": []},
        )
        add_bad(
            "no_gpt_turn",
            {
                "id": "bad-no-gpt",
                "image": good_image(n_good + 4),
                "conversations": [{"from": "human", "value": PROMPTS[0]}],
            },
        )
        add_bad(
            "no_human_turn",
            {
                "id": "bad-no-human",
                "image": good_image(n_good + 5),
                "conversations": [{"from": "gpt", "value": "a caption"}],
            },
        )
        add_bad("empty_caption", _entry("bad-empty-caption", good_image(n_good + 6), PROMPTS[0], "  \n "))
        add_bad("empty_prompt", _entry("bad-empty-prompt", good_image(n_good + 7), "<image>\n", "a caption"))
        # Duplicates by content: the same file again, and a byte-identical copy under another name.
        add_bad("duplicate_image", _entry("bad-dup-same-path", first, PROMPTS[1], "the first image again"))
        copy = write("share_textvqa/images/copy_of_first.jpg", (root / first).read_bytes())
        add_bad("duplicate_image", _entry("bad-dup-copy", copy, PROMPTS[1], "a copy of the first image"))
        # Good samples in unusual shapes that must *not* be lost.
        inner = root / "llava/llava_pretrain/images/00000/inner_link.jpg"
        os.symlink(
            os.path.relpath(root / entries[1]["image"], inner.parent), inner
        )  # a link inside the root...
        fixture.bad[str(len(entries))] = "duplicate_image"  # ...to an image already kept is a duplicate
        entries.append(
            _entry(
                "bad-dup-inner-link",
                "llava/llava_pretrain/images/00000/inner_link.jpg",
                PROMPTS[0],
                "via a link",
            )
        )
        add_good("good-png-gray", write("wikiart/images/gray.png", _image_bytes(rng, size, "PNG", mode="L")))
        add_good("good-rgba", write("wikiart/images/rgba.png", _image_bytes(rng, size, "PNG", mode="RGBA")))
        add_good(
            "good-dotslash", "./" + good_image(n_good + 8).replace("/", "//", 1)
        )  # odd but inside the root
        entries.append(
            _entry(12345, good_image(n_good + 9), "Describe this image.\n<image>\nBe concise.", "An int id.")
        )
        fixture.good.append("12345")
        # A repeated id on a different image: kept under a new id.
        entries.append(
            _entry("good-0", good_image(n_good + 10), PROMPTS[0], "Another image that reuses an id.")
        )
        fixture.good.append("good-0#2")
        fixture.renamed["good-0#2"] = "good-0"

    fixture.json_path.write_text(json.dumps(entries, ensure_ascii=False, indent=1), encoding="utf-8")
    return fixture
