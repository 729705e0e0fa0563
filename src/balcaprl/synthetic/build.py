"""``balcaprl synthetic build``: scenes -> images + reference captions, in the pinned dataset format.

The folder is exactly what the real data path writes (``train.parquet``, ``eval.parquet``,
``images/``, ``dataset.json``; see :mod:`balcaprl.data.format`), so trainers cannot tell the
difference, plus ``scenes.jsonl``: one scene graph per image with its file hash, decoded-pixel hash
and thumbnail, which is what :meth:`OracleJudge.from_dataset` reads.

Each sample has the re-captioned reference (``reference``) and the degraded original it replaced
(``reference_original``, :func:`~balcaprl.synthetic.captioners.original_caption`): the paper's
"w/o recap" row trains against the latter (``data.reference: reference_original``).

``reference_tokens`` are counted with a policy's tokenizer when one is given, else with the synthetic
world's own word-level tokenizer (the tokenizer every tiny policy uses, so the counts are the same).

The card's ``synthetic`` section records the settings (:func:`build_settings`), so a folder can say
whether it already holds the dataset a build would write (``balcaprl synthetic build --resume``).
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict
from pathlib import Path

from balcaprl.data.format import DatasetSample, TokenCounter, write_dataset
from balcaprl.files import atomic_write_text
from balcaprl.progress import Progress
from balcaprl.synthetic.captioners import original_caption
from balcaprl.synthetic.captions import reference_caption
from balcaprl.synthetic.lexicon import PROMPT
from balcaprl.synthetic.oracle import SCENES_FILE, scene_record
from balcaprl.synthetic.render import DEFAULT_IMAGE_SIZE, png_bytes, render_scene
from balcaprl.synthetic.scenes import SceneSpec, generate_scenes
from balcaprl.synthetic.tokenizer import TOKENIZER_NAME, build_tokenizer

DATASET_NAME = "balcaprl-synthetic-shapes"
SOURCE = "synthetic"
GENERATOR_VERSION = 3  # 2: richer references, reference_original; 3: finer claims, longer references


def build_settings(
    n_train: int, n_eval: int, seed: int, image_size: int, spec: SceneSpec, policy_dir: Path | str | None
) -> dict:
    """Everything that decides the bytes of a build, as the card records it (JSON types)."""
    return json.loads(json.dumps({
        "counts": {"train": n_train, "eval": n_eval}, "seed": seed, "image_size": image_size,
        "scene_spec": asdict(spec), "generator_version": GENERATOR_VERSION,
        "tokenizer": str(policy_dir) if policy_dir is not None else TOKENIZER_NAME,
    }))  # fmt: skip


def built_settings(root: Path | str) -> dict | None:
    """The :func:`build_settings` of the finished synthetic dataset in ``root``, or None."""
    try:
        card = json.loads((Path(root) / "dataset.json").read_text(encoding="utf-8"))
        made = card["synthetic"]
        return {"counts": card["counts"], "seed": made["seed"], "image_size": made["image_size"],
                "scene_spec": made["scene_spec"], "generator_version": made["generator_version"],
                "tokenizer": card["tokenizer"]}  # fmt: skip
    except (OSError, ValueError, KeyError, TypeError):
        return None


def build_results(root: Path | str) -> list[str]:
    """What in ``root`` a build would write over (its files, finished or not)."""
    names = ("dataset.json", "train.parquet", "eval.parquet", SCENES_FILE, "images")
    return [name for name in names if (Path(root) / name).exists()]


def build_dataset(
    out_dir: Path | str,
    n_train: int = 2000,
    n_eval: int = 200,
    seed: int = 0,
    *,
    image_size: int = DEFAULT_IMAGE_SIZE,
    spec: SceneSpec = SceneSpec(),
    policy_dir: Path | str | None = None,
    progress: bool = False,
) -> Path:
    """Write a synthetic dataset folder and return it. Same arguments, same bytes.

    ``progress``: report the rendering (:class:`balcaprl.progress.Progress`: a bar on a terminal,
    periodic lines with count, rate and ETA in a log)."""
    if n_train < 1 or n_eval < 1:
        raise ValueError(
            f"need at least one train and one eval scene, got n_train={n_train}, n_eval={n_eval}"
        )
    root = Path(out_dir)
    if policy_dir is not None:
        # named by the path as given, so a trainer loading that same path can reuse the counts
        counter = TokenCounter.load(str(policy_dir), what="--policy")
    else:
        counter = TokenCounter.from_hf(build_tokenizer(), name=TOKENIZER_NAME)
    rng = random.Random(seed + 1)  # captions; scenes use `seed` itself
    original_rng = random.Random(seed + 2)  # its own stream: the re-captioned references stay as they were
    records = []
    splits: dict[str, list[DatasetSample]] = {}
    scenes = generate_scenes(n_train + n_eval, seed, prefix="shapes", spec=spec)
    with Progress("rendering scenes", total=len(scenes), unit="scenes", enabled=progress) as rendering:
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
                        reference_original=original_caption(scene, original_rng),
                        source=SOURCE,
                        image_name=name,
                    )
                )
                records.append(scene_record(scene, image, encoded, split=split, image_path=f"images/{name}"))
                rendering.advance()
            splits[split] = samples

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
