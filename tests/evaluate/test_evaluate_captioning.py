"""`balcaprl caption`: what gets captioned from each source, the output files in each benchmark's own
format, resuming, and the transformers backend on the synthetic world's tiny policy."""

from __future__ import annotations

import hashlib
import json

import pytest
from evaluate_testkit import png, write_caparena, write_captionqa, write_decapbench
from typer.testing import CliRunner

from balcaprl.cli import app
from balcaprl.errors import InputError
from balcaprl.evaluate.captioning import (
    GenerationSettings,
    caption_items,
    collect_items,
    native_path,
)


class FakeCaptioner:
    """Deterministic and instant: the caption names the prompt and the image's hash."""

    name = "fake"

    def __init__(self, model_id="fake-model", fail_after=None):
        self.model_id = model_id
        self.batches = 0
        self.fail_after = fail_after

    def generate(self, images, prompts, settings):
        if self.fail_after is not None and self.batches >= self.fail_after:
            raise KeyboardInterrupt
        self.batches += 1
        return [
            f"{p} | {hashlib.sha256(im.tobytes()).hexdigest()[:6]}"
            for im, p in zip(images, prompts, strict=True)
        ]


def test_sources(tmp_path):
    folder = tmp_path / "folder"
    (folder / "sub").mkdir(parents=True)
    (folder / "b.png").write_bytes(png((1, 2, 3)))
    (folder / "sub" / "a.jpg").write_bytes(png((4, 5, 6)))
    (folder / "notes.txt").write_text("not an image")
    assert [i.key for i in collect_items(folder)] == ["b.png", "sub/a.jpg"]

    annotations, images = write_decapbench(tmp_path)
    items = collect_items(images, benchmark="decapbench", annotations=annotations)
    assert [i.key for i in items] == ["iiw_001.jpg", "iiw_002.jpg"]
    assert items[0].extra["oracle_caption"].startswith("A red door")

    items = collect_items(None, benchmark="captionqa", annotations=write_captionqa(tmp_path))
    assert [i.key for i in items] == ["nat_001", "nat_002", "doc_001"] and isinstance(items[0].image, bytes)

    arena, arena_images, _ = write_caparena(tmp_path, n_per_baseline=1)
    assert [i.key for i in collect_items(arena_images, benchmark="caparena", annotations=arena)] == [
        "test_00000.jpg", "test_00001.jpg", "test_00002.jpg"
    ]  # fmt: skip
    assert len(collect_items(arena_images, benchmark="caparena", limit=2)) == 2
    with pytest.raises(InputError, match="--annotations"):
        collect_items(images, benchmark="decapbench")
    with pytest.raises(InputError, match="no images"):
        collect_items(_empty(tmp_path))


def _empty(tmp_path):
    (tmp_path / "empty").mkdir()
    return tmp_path / "empty"


def test_outputs_in_each_benchmarks_format(tmp_path):
    annotations, images = write_decapbench(tmp_path)
    items = collect_items(images, benchmark="decapbench", annotations=annotations)
    run = caption_items(items, FakeCaptioner(), tmp_path / "out" / "caps.jsonl", benchmark="decapbench")
    rows = [json.loads(line) for line in run.out.read_text().splitlines()]
    assert [r["key"] for r in rows] == ["iiw_001.jpg", "iiw_002.jpg"] and rows[0]["benchmark"] == "decapbench"
    assert rows[0]["prompt"] == "Describe this image in detail." and rows[0]["model"] == "fake-model"
    native = [json.loads(line) for line in run.native.read_text().splitlines()]
    assert run.native == tmp_path / "out" / "caps.decapbench.jsonl"
    assert native[1] == {"image_path": "iiw_002.jpg", "image_name": "iiw_002.jpg", "caption": rows[1]["caption"],
                         "oracle_caption": "A blue car is parked by a tree."}  # fmt: skip
    assert not (tmp_path / "out" / "caps.jsonl.part").exists()

    items = collect_items(None, benchmark="captionqa", annotations=write_captionqa(tmp_path))
    run = caption_items(
        items, FakeCaptioner(), tmp_path / "qa.jsonl", benchmark="captionqa", prompt="Say it all."
    )
    assert set(json.loads(run.native.read_text())) == {"nat_001", "nat_002", "doc_001"}
    assert run.native.name == "qa.captionqa.json" and run.rows[0]["caption"].startswith("Say it all. |")
    assert native_path(tmp_path / "x.jsonl", "caparena").name == "x.caparena.json"
    assert native_path(tmp_path / "x.jsonl", None).name == "x.json"


def test_an_interrupted_run_resumes_and_a_different_run_is_refused(tmp_path):
    folder = tmp_path / "imgs"
    folder.mkdir()
    for i in range(5):
        (folder / f"{i}.png").write_bytes(png((i * 40, 0, 0)))
    items = collect_items(folder)
    out = tmp_path / "caps.jsonl"
    settings = GenerationSettings(batch_size=2)
    with pytest.raises(KeyboardInterrupt):
        caption_items(items, FakeCaptioner(fail_after=1), out, settings=settings)
    assert not out.exists() and len((tmp_path / "caps.jsonl.part").read_text().splitlines()) == 2
    captioner = FakeCaptioner()
    run = caption_items(items, captioner, out, settings=settings)
    assert run.generated == 3 and captioner.batches == 2 and len(run.rows) == 5
    assert json.loads(run.native.read_text()) == {r["key"]: r["caption"] for r in run.rows}

    again = FakeCaptioner()
    assert caption_items(items, again, out, settings=settings).generated == 0  # a finished OUT resumes
    assert again.batches == 0

    (tmp_path / "caps.jsonl.part").write_text(json.dumps({**run.rows[0], "run_id": "other"}) + "\n")
    with pytest.raises(InputError, match="different run"):
        caption_items(items, FakeCaptioner(), out, settings=settings)
    run = caption_items(items, FakeCaptioner(), out, settings=settings, overwrite=True)
    assert run.generated == 5


def test_the_tiny_policy_through_the_cli(tmp_path):
    from balcaprl.data.format import read_split_rows
    from balcaprl.synthetic.build import build_dataset
    from balcaprl.synthetic.policy import create_policy

    dataset = build_dataset(tmp_path / "ds", n_train=1, n_eval=3, seed=5)
    policy = create_policy(tmp_path / "policy", seed=2)
    args = ["caption", "--model", str(policy), "--images", str(dataset), "--out", str(tmp_path / "c.jsonl"),
            "--max-new-tokens", "6", "--batch-size", "2", "--prompt", "dataset", "--no-progress"]  # fmt: skip
    result = CliRunner(env={"COLUMNS": "120"}).invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (tmp_path / "c.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(r["backend"] == "transformers" and r["caption"] for r in rows)
    assert rows[0]["key"] == read_split_rows(dataset, "eval")[0]["image"]  # the dataset's relative path
    assert rows[0]["prompt"] == "Describe this image in detail."
    # greedy decoding is deterministic: a fresh run reproduces every caption
    again = CliRunner(env={"COLUMNS": "120"}).invoke(app, [*args[:6], str(tmp_path / "d.jsonl"), *args[7:]])
    assert again.exit_code == 0, again.output
    assert (tmp_path / "d.json").read_text() == (tmp_path / "c.json").read_text()
    result = CliRunner(env={"COLUMNS": "120"}).invoke(app, ["caption", "--model", str(policy), "--images",
                                                            str(dataset), "--out", str(tmp_path / "v.jsonl"),
                                                            "--backend", "vllm"])  # fmt: skip
    assert (
        result.exit_code == 2 and "-c constraints/gpu-one-node.txt" in result.output
    )  # the hint installs the tested set
