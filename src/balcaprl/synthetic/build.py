"""``balcaprl synthetic build``: scenes -> images + reference captions, in the pinned dataset format.

The folder is exactly what the real data path writes (``train.parquet``, ``eval.parquet``,
``images/``, ``dataset.json``; see :mod:`balcaprl.data.format`), so trainers cannot tell the
difference, plus ``scenes.jsonl``: one scene graph per image with its file hash, decoded-pixel hash
and thumbnail, which is what :meth:`OracleJudge.from_dataset` reads.

``reference_tokens`` are counted with a policy's tokenizer when one is given, else with the synthetic
world's own word-level tokenizer (the tokenizer every tiny policy uses, so the counts are the same).
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict
from pathlib import Path

from balcaprl.data.format import DatasetSample, TokenCounter, write_dataset
from balcaprl.files import atomic_write_text
from balcaprl.synthetic.captions import reference_caption
from balcaprl.synthetic.lexicon import PROMPT
from balcaprl.synthetic.oracle import SCENES_FILE, scene_record
from balcaprl.synthetic.render import DEFAULT_IMAGE_SIZE, png_bytes, render_scene
from balcaprl.synthetic.scenes import SceneSpec, generate_scenes
from balcaprl.synthetic.tokenizer import TOKENIZER_NAME, build_tokenizer

__all__ = ["DATASET_NAME", "SOURCE", "build_dataset"]

DATASET_NAME = "balcaprl-synthetic-shapes"
SOURCE = "synthetic"
GENERATOR_VERSION = 1


def build_dataset(
    out_dir: Path | str,
    n_train: int = 2000,
    n_eval: int = 200,
    seed: int = 0,
    *,
    image_size: int = DEFAULT_IMAGE_SIZE,
    spec: SceneSpec = SceneSpec(),
    policy_dir: Path | str | None = None,
) -> Path:
    """Write a synthetic dataset folder and return it. Same arguments, same bytes."""
    if n_train < 1 or n_eval < 1:
        raise ValueError(
            f"need at least one train and one eval scene, got n_train={n_train}, n_eval={n_eval}"
        )
    root = Path(out_dir)
    rng = random.Random(seed + 1)  # captions; scenes use `seed` itself
    records = []
    splits: dict[str, list[DatasetSample]] = {}
    scenes = generate_scenes(n_train + n_eval, seed, prefix="shapes", spec=spec)
    for split, chunk in (("train", scenes[:n_train]), ("eval", scenes[n_train:])):
        samples = []
        for scene in chunk:
            image = render_scene(scene, image_size)
            encoded = png_bytes(image)
            name = f"{scene.id}.png"
            samples.append(
                DatasetSample(
                    id=scene.id,
                    image=encoded,
                    prompt=PROMPT,
                    reference=reference_caption(scene, rng),
                    source=SOURCE,
                    image_name=name,
                )
            )
            records.append(scene_record(scene, image, encoded, split=split, image_path=f"images/{name}"))
        splits[split] = samples

    if policy_dir is not None:
        from transformers import AutoTokenizer

        # named by the path as given, so a trainer loading that same path can reuse the counts
        counter = TokenCounter.from_hf(AutoTokenizer.from_pretrained(policy_dir), name=str(policy_dir))
    else:
        counter = TokenCounter.from_hf(build_tokenizer(), name=TOKENIZER_NAME)

    root.mkdir(parents=True, exist_ok=True)
    atomic_write_text(root / SCENES_FILE, "".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
    return write_dataset(
        root,
        splits["train"],
        splits["eval"],
        name=DATASET_NAME,
        version=str(GENERATOR_VERSION),
        token_counter=counter,
        extra={
            "synthetic": {
                "scenes_file": SCENES_FILE,
                "seed": seed,
                "image_size": image_size,
                "scene_spec": asdict(spec),
                "generator_version": GENERATOR_VERSION,
                "judge": "OracleJudge.from_dataset(DIR) looks scenes up by image hash in scenes_file",
            }
        },
    )
