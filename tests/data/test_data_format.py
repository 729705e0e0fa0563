"""The pinned on-disk dataset format: what writers may rely on and what readers get back."""

import hashlib
import io
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from PIL import Image

from balcaprl import files
from balcaprl.data import format as fmt
from balcaprl.data.format import (
    COLUMNS,
    DatasetSample,
    TokenCounter,
    load_split,
    read_card,
    read_split_rows,
    write_dataset,
)
from balcaprl.errors import InputError


def png_bytes(color=(200, 30, 30), size=(8, 6)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, "PNG")
    return buffer.getvalue()


def words() -> TokenCounter:
    return TokenCounter(name="whitespace", count=lambda texts: [len(t.split()) for t in texts])


def sample(i: int, **kw) -> DatasetSample:
    base = dict(
        id=f"s{i}",
        image=png_bytes((i * 40 % 256, 10, 10)),
        prompt="Describe the image.",
        reference=f"a red square number {i}",
        source="test",
    )
    base.update(kw)
    return DatasetSample(**base)


def test_round_trip_all_columns(tmp_path):
    train = [sample(0), sample(1, reference_original="the original", image_name="sub/one.png")]
    root = write_dataset(
        tmp_path / "ds",
        train,
        [sample(2)],
        name="t",
        version="3",
        token_counter=words(),
        rejections={"missing_image": 2},
        extra={"note": "x"},
    )
    card = read_card(root)
    assert card == {
        "name": "t",
        "version": "3",
        "counts": {"train": 2, "eval": 1},
        "tokenizer": "whitespace",
        "rejections": {"missing_image": 2},
        "note": "x",
    }
    rows = read_split_rows(root, "train")
    assert [r["id"] for r in rows] == ["s0", "s1"]
    assert set(COLUMNS) <= set(rows[0])
    assert rows[0]["image"] == "images/s0.png" and rows[1]["image"] == "images/sub/one.png"
    assert rows[1]["reference_original"] == "the original" and rows[0]["reference_original"] is None
    assert [r["reference_tokens"] for r in rows] == [5, 5]
    for row in rows:
        data = Path(row["image_path"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == row["image_sha256"]
    assert read_split_rows(root, "eval")[0]["id"] == "s2"


def test_no_token_counter_gives_null_lengths(tmp_path):
    root = write_dataset(tmp_path, [sample(0)], [], name="t")
    assert read_split_rows(root, "train")[0]["reference_tokens"] is None
    assert read_card(root)["tokenizer"] is None
    assert read_split_rows(root, "eval") == []  # an empty split still has the schema


def test_loads_through_hf_datasets(tmp_path):
    root = write_dataset(tmp_path, [sample(0), sample(1)], [sample(2)], name="t", token_counter=words())
    ds = load_split(root, "train")
    assert len(ds) == 2 and set(COLUMNS) <= set(ds.column_names)
    assert ds[1]["reference"] == "a red square number 1"
    assert len(load_split(root, "eval")) == 1
    with pytest.raises(InputError, match="--split test: unknown split; choose train or eval"):
        load_split(root, "test")  # a user error (one line, exit status 2), still a ValueError


def test_duplicate_ids_rejected(tmp_path):
    with pytest.raises(ValueError, match="duplicate sample id 's0'"):
        write_dataset(tmp_path, [sample(0), sample(0)], [], name="t")
    assert not (tmp_path / "dataset.json").exists()
    assert not (tmp_path / "train.parquet").exists()  # the temporary file was removed
    assert not list(tmp_path.glob(".train.parquet.*"))


def test_train_eval_overlap_rejected(tmp_path):
    with pytest.raises(ValueError, match=r"ids in both train and eval: \['s1'\]"):
        write_dataset(tmp_path, [sample(0), sample(1)], [sample(1)], name="t")
    assert not (tmp_path / "dataset.json").exists()
    assert not (tmp_path / "eval.parquet").exists()


def test_image_outside_folder_rejected(tmp_path):
    outside = tmp_path / "elsewhere.png"
    outside.write_bytes(png_bytes())
    with pytest.raises(ValueError, match="outside the dataset folder"):
        write_dataset(tmp_path / "ds", [sample(0, image=outside)], [], name="t")
    # A symlink inside the folder that points out of it is outside too.
    (tmp_path / "ds2" / "images").mkdir(parents=True)
    link = tmp_path / "ds2" / "images" / "link.png"
    link.symlink_to(outside)
    with pytest.raises(ValueError, match="outside the dataset folder"):
        write_dataset(tmp_path / "ds2", [sample(0, image=link)], [], name="t")


def test_path_image_inside_folder_is_kept_and_hashed(tmp_path):
    inside = tmp_path / "images" / "a" / "b.png"
    inside.parent.mkdir(parents=True)
    inside.write_bytes(png_bytes())
    root = write_dataset(tmp_path, [sample(0, image=Path("images/a/b.png"))], [], name="t")
    row = read_split_rows(root, "train")[0]
    assert row["image"] == "images/a/b.png"
    assert row["image_sha256"] == hashlib.sha256(inside.read_bytes()).hexdigest()


def test_known_sha256_is_trusted_and_missing_file_caught(tmp_path):
    inside = tmp_path / "images" / "x.png"
    inside.parent.mkdir(parents=True)
    inside.write_bytes(png_bytes())
    root = write_dataset(tmp_path, [sample(0, image=inside, image_sha256="ab" * 32)], [], name="t")
    assert read_split_rows(root, "train")[0]["image_sha256"] == "ab" * 32
    with pytest.raises(FileNotFoundError, match="does not exist"):
        write_dataset(
            tmp_path, [sample(0, image=tmp_path / "images" / "gone.png", image_sha256="00")], [], name="t"
        )


def test_card_written_last_and_old_card_removed_first(tmp_path, monkeypatch):
    root = write_dataset(tmp_path, [sample(0)], [], name="old")
    assert read_card(root)["name"] == "old"
    order = []
    real = fmt.atomic_write_bytes

    def spy(path, data):
        order.append(Path(path).name)
        return real(path, data)

    monkeypatch.setattr(fmt, "atomic_write_bytes", spy)
    real_replace = fmt.os.replace

    def spy_replace(src, dst):
        order.append(Path(dst).name)
        return real_replace(src, dst)

    monkeypatch.setattr(fmt.os, "replace", spy_replace)
    write_dataset(root, [sample(1)], [sample(2)], name="new")
    assert order[-1] == "dataset.json"
    assert "train.parquet" in order and "eval.parquet" in order
    assert order.index("eval.parquet") < order.index("dataset.json")

    # A write that fails part-way must not leave the old card vouching for the new files.
    with pytest.raises(ValueError):
        write_dataset(root, [sample(3), sample(3)], [], name="broken")
    with pytest.raises(FileNotFoundError, match="not a finished balcaprl dataset"):
        read_card(root)


def test_many_rows_are_written_in_row_groups(tmp_path, monkeypatch):
    monkeypatch.setattr(fmt, "WRITE_BATCH_ROWS", 4)
    image = tmp_path / "images" / "one.png"
    image.parent.mkdir(parents=True)
    image.write_bytes(png_bytes())
    digest = hashlib.sha256(image.read_bytes()).hexdigest()
    rows = (sample(i, image=image, image_sha256=digest) for i in range(10))  # a lazy iterable
    root = write_dataset(
        tmp_path, rows, (sample(i, image=image) for i in range(10, 12)), name="t", token_counter=words()
    )
    assert read_card(root)["counts"] == {"train": 10, "eval": 2}
    assert pq.ParquetFile(root / "train.parquet").metadata.num_row_groups == 3
    assert [r["id"] for r in read_split_rows(root, "train")] == [f"s{i}" for i in range(10)]
    assert all(r["reference_tokens"] == 5 for r in read_split_rows(root, "train"))


def test_token_counter_from_hf_uses_inner_tokenizer():
    class Tok:
        name_or_path = "tiny/tok"

        def __call__(self, texts, add_special_tokens):
            assert add_special_tokens is False
            return {"input_ids": [list(t) for t in texts]}

    class Processor:
        tokenizer = Tok()

    counter = TokenCounter.from_hf(Processor())
    assert counter.name == "tiny/tok" and counter.count(["abc", ""]) == [3, 0]
    assert TokenCounter.from_hf(Tok(), name="given").name == "given"


def test_atomic_write_leaves_no_temporary_on_failure(tmp_path):
    target = tmp_path / "f.json"
    files.atomic_write_text(target, json.dumps({"a": 1}))
    assert json.loads(target.read_text()) == {"a": 1}
    with pytest.raises(TypeError):
        files.atomic_write_bytes(target, object())  # type: ignore[arg-type]
    assert json.loads(target.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["f.json"]


def test_written_files_get_the_mode_of_any_new_file(tmp_path):
    """Not mkstemp's owner-only 0600: results on a shared file system stay readable by a team."""
    expected = 0o666 & ~files._UMASK
    (tmp_path / "plain").write_text("x")  # what open() makes under this process's umask
    assert (tmp_path / "plain").stat().st_mode & 0o777 == expected
    root = write_dataset(tmp_path / "ds", [sample(0)], [sample(1)], name="t", token_counter=words())
    written = [p for p in root.rglob("*") if p.is_file()]
    assert {"dataset.json", "train.parquet", "eval.parquet"} <= {p.name for p in written}
    assert {p.name: p.stat().st_mode & 0o777 for p in written} == {p.name: expected for p in written}
