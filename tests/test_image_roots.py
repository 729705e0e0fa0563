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
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image
from typer.testing import CliRunner

from balcaprl.cli import app
from balcaprl.data.format import DatasetSample, read_split_rows, write_dataset
from balcaprl.images import ImageRoot, path_in_root
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


def _path_in_root_twin(root: Path | str, path: Path | str) -> Path | None:
    """The rules of :class:`ImageRoot`, resolved from scratch for every path (how ``path_in_root``
    worked before the root's folders were remembered): the reference the fast path must agree with."""
    import os

    given = Path(os.path.abspath(root))
    real = given.resolve()
    candidate = Path(path)
    full = Path(os.path.normpath(candidate if candidate.is_absolute() else given / candidate))
    base = next((b for b in (given, real) if full.is_relative_to(b)), None)
    if base is None:
        return None
    relative = full.relative_to(base)
    allowed, here = [real], real
    for part in relative.parts[:-1]:
        here = here / part
        if here.is_symlink():
            here = here.resolve()
            allowed.append(here)
    target = (real / relative).resolve()
    return relative if any(target.is_relative_to(a) for a in allowed) else None


@pytest.fixture(scope="module")
def maze(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A root reached through a symlink, holding every kind of link: a folder linked out (shared
    storage), a folder linked to a sibling inside, a file linked out, a file linked in, a dangling
    link, and a link out inside the linked-out folder."""
    base = tmp_path_factory.mktemp("maze")
    (base / "real" / "sub" / "deep").mkdir(parents=True)
    (base / "pool" / "inner").mkdir(parents=True)
    for file in (
        "real/a.png",
        "real/sub/b.png",
        "real/sub/deep/c.png",
        "pool/p.png",
        "pool/inner/q.png",
        "secret.png",
    ):
        (base / file).write_bytes(b"x")
    (base / "root").symlink_to(base / "real", target_is_directory=True)
    (base / "real" / "shared").symlink_to(base / "pool", target_is_directory=True)
    (base / "real" / "alias").symlink_to(base / "real" / "sub", target_is_directory=True)
    (base / "real" / "out.png").symlink_to(base / "secret.png")
    (base / "real" / "in.png").symlink_to(base / "real" / "sub" / "b.png")
    (base / "real" / "dangling.png").symlink_to(base / "nothing.png")
    (base / "pool" / "leak.png").symlink_to(base / "secret.png")
    (base / "pool" / "up").symlink_to(base, target_is_directory=True)
    return base


_PARTS = ["a.png", "sub", "deep", "b.png", "c.png", "shared", "alias", "out.png", "in.png", "dangling.png",
          "inner", "p.png", "q.png", "leak.png", "up", "secret.png", "real", "root", "pool", "..", ".", "",
          "missing.png"]  # fmt: skip


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=st.lists(st.sampled_from(_PARTS), min_size=1, max_size=6), absolute=st.booleans(),
       through_link=st.booleans())  # fmt: skip
def test_the_remembering_root_agrees_with_resolving_every_path(maze: Path, parts, absolute, through_link):
    root = maze / ("root" if through_link else "real")
    text = "/".join(parts)
    path = str(root / text) if absolute else text
    checker = ImageRoot(root)
    expected = _path_in_root_twin(root, path)
    for _ in range(2):  # the second answer comes from the remembered folders
        got = checker.relative(path)
        assert (None if got is None else Path(got)) == expected, path
    assert path_in_root(root, path) == expected


def _png(color: tuple[int, int, int], side: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (side, side), color).save(buffer, "PNG")
    return buffer.getvalue()


def test_a_folder_link_re_pointed_mid_run_never_lets_an_outside_image_be_read(tmp_path: Path):
    """``root/sub`` links to ``store1``; a thread keeps re-pointing it at ``store2``, whose ``a.png``
    links outside the root, and back. The run's loader met ``sub`` as ``store1``: whatever the link
    says when a file is opened, what is read is ``store1``'s image or nothing (an escape), never the
    outside one, through ``load`` (what is sent) and ``sha256`` (the cache key) alike."""
    import hashlib
    import os
    import threading

    (tmp_path / "root").mkdir()
    for store in ("store1", "store2"):
        (tmp_path / store).mkdir()
    inside, secret = _png((0, 200, 0), 16), _png((200, 0, 0), 24)
    (tmp_path / "store1" / "a.png").write_bytes(inside)
    (tmp_path / "outside.png").write_bytes(secret)
    (tmp_path / "store2" / "a.png").symlink_to(tmp_path / "outside.png")
    sub = tmp_path / "root" / "sub"
    sub.symlink_to(tmp_path / "store1", target_is_directory=True)
    loader = ImageLoader(max_side=64, root=tmp_path / "root")
    assert loader.load("sub/a.png").data == inside  # the run meets sub as store1

    stop = threading.Event()

    def flip() -> None:
        flipped = tmp_path / "root" / ".sub.next"
        while not stop.is_set():
            for store in ("store2", "store1"):
                flipped.symlink_to(tmp_path / store, target_is_directory=True)
                os.replace(flipped, sub)  # atomic, as `ln -sfn` is not

    flipper = threading.Thread(target=flip)
    flipper.start()
    read, refused = [], 0
    try:
        for i in range(400):
            try:
                if i % 2:
                    read.append(loader.sha256("sub/a.png"))
                else:
                    read.append(hashlib.sha256(loader.load("sub/a.png").data).hexdigest())
            except ImageError as error:
                assert "escapes the image root" in str(error) or "cannot be read" in str(error), error
                refused += 1
    finally:
        stop.set()
        flipper.join()
    assert hashlib.sha256(secret).hexdigest() not in read
    assert set(read) <= {hashlib.sha256(inside).hexdigest()} and read, (len(read), refused)
