"""Image roots are resolved through the folder symlinks inside them: a dataset whose ``images/`` links
to shared storage works everywhere (the judge's loader, ``score``, rewriting the dataset), while any
path that leaves the root (``..``, an absolute path elsewhere, a file symlink out) is still refused."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
import yaml
from PIL import Image
from typer.testing import CliRunner

from balcaprl.cli import app
from balcaprl.data.format import DatasetSample, read_split_rows, write_dataset
from balcaprl.images import path_in_root
from balcaprl.judge.images import ImageError, ImageLoader


def png() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (16, 16), (10, 200, 30)).save(buffer, "PNG")
    return buffer.getvalue()


@pytest.fixture()
def linked(tmp_path: Path) -> Path:
    """``data/images`` is a symlink to ``storage/pool``; ``storage/secret.png`` lies beside the pool."""
    pool = tmp_path / "storage" / "pool"
    pool.mkdir(parents=True)
    (pool / "a.png").write_bytes(png())
    (tmp_path / "storage" / "secret.png").write_bytes(png())
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "images").symlink_to(pool, target_is_directory=True)
    (tmp_path / "data" / "link-out.png").symlink_to(tmp_path / "storage" / "secret.png")
    return tmp_path / "data"


def test_a_linked_images_folder_is_inside_the_root(linked: Path):
    loader = ImageLoader(max_side=64, root=linked)
    for inside in ("images/a.png", str(linked / "images" / "a.png"), "images/./a.png", "x/../images/a.png"):
        assert path_in_root(linked, inside) == Path("images/a.png")
        assert loader.load(inside).data == png()


@pytest.mark.parametrize(
    "outside",
    [
        "../storage/secret.png",
        "images/../../storage/secret.png",
        "link-out.png",
        "/etc/hostname",
        "images/../..",
    ],
)
def test_paths_that_leave_the_root_are_refused(linked: Path, outside: str):
    assert path_in_root(linked, outside) is None
    with pytest.raises(ImageError, match="escapes the image root"):
        ImageLoader(max_side=64, root=linked).load(outside)


def test_a_dataset_with_linked_images_can_be_rewritten(linked: Path):
    """What ``data recaption`` does: rows naming their image by path, under the linked folder."""
    sample = DatasetSample(
        id="a", image=linked / "images" / "a.png", prompt="Describe.", reference="green.", source="t"
    )
    write_dataset(linked, [sample], [], name="linked")
    assert [row["image"] for row in read_split_rows(linked, "train")] == ["images/a.png"]


def test_score_reads_a_dataset_whose_images_folder_is_a_symlink(tmp_path: Path):
    from balcaprl.synthetic.build import build_dataset
    from balcaprl.synthetic.oracle import OracleJudge
    from balcaprl.testing.judge_server import JudgeServer

    data = build_dataset(tmp_path / "data", n_train=2, n_eval=1, seed=0)
    shutil.move(data / "images", tmp_path / "shared-images")
    (data / "images").symlink_to(tmp_path / "shared-images", target_is_directory=True)
    rows = read_split_rows(data, "train")
    (tmp_path / "captions.jsonl").write_text(
        "".join(json.dumps({"image": r["image"], "caption": r["reference"]}) + "\n" for r in rows)
    )
    (tmp_path / "references.json").write_text(json.dumps({r["image"]: r["reference"] for r in rows}))
    with JudgeServer(OracleJudge.from_dataset(data)) as server:
        (tmp_path / "judge.yaml").write_text(
            yaml.safe_dump(
                {"base_url": server.base_url, "model": "oracle", "api_key_env": None, "cache_path": None}
            )
        )
        result = CliRunner().invoke(
            app,
            [
                "score",
                "--images",
                str(data),
                "--captions",
                str(tmp_path / "captions.jsonl"),
                "--references",
                str(tmp_path / "references.json"),
                "--judge",
                str(tmp_path / "judge.yaml"),
                "--out",
                str(tmp_path / "out"),
                "--no-progress",
            ],  # fmt: skip
            env={"COLUMNS": "100"},
        )
    assert result.exit_code == 0, result.output
    scored = [json.loads(line) for line in (tmp_path / "out" / "scores.jsonl").read_text().splitlines()]
    assert len(scored) == 2 and all(row.get("recall") == 1.0 for row in scored), scored
