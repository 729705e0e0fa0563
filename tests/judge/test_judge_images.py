"""Images: original bytes when already fine, downscale only when too large, hash once per image."""

from __future__ import annotations

import asyncio
import io
import os

import pytest
from judge_testkit import config, jpeg_bytes, judge_and_close, png_bytes, request
from PIL import Image

import balcaprl.judge.images as images_module
from balcaprl.judge import Judgement, OpenAICompatibleJudge
from balcaprl.judge.images import ImageError, ImageLoader, decode_data_url, sha256_hex


def decode(data: bytes) -> Image.Image:
    image = Image.open(io.BytesIO(data))
    image.load()
    return image


@pytest.mark.parametrize(("make", "mime"), [(png_bytes, "image/png"), (jpeg_bytes, "image/jpeg")])
def test_small_png_and_jpeg_travel_as_their_original_bytes(make, mime):
    data = make(40, 30)
    prepared = ImageLoader(max_side=40).load(data)
    assert prepared.data == data and prepared.mime == mime and not prepared.reencoded
    assert prepared.sha256 == sha256_hex(data)
    assert decode_data_url(prepared.data_url) == (mime, data)


def test_large_png_is_downscaled_and_stays_png():
    data = png_bytes(300, 120)
    prepared = ImageLoader(max_side=100).load(data)
    assert prepared.reencoded and prepared.mime == "image/png"
    image = decode(prepared.data)
    assert image.format == "PNG" and image.size == (100, 40) == (prepared.width, prepared.height)
    assert prepared.sha256 == sha256_hex(data)  # the key identifies the original, not the re-encoding


def test_large_jpeg_is_downscaled_to_jpeg_and_other_formats_become_png():
    prepared = ImageLoader(max_side=64).load(jpeg_bytes(128, 256))
    assert prepared.mime == "image/jpeg" and decode(prepared.data).size == (32, 64)
    buffer = io.BytesIO()
    Image.new("RGBA", (20, 20), (1, 2, 3, 128)).save(buffer, "WEBP")
    webp = ImageLoader(max_side=64).load(buffer.getvalue())
    assert webp.reencoded and webp.mime == "image/png" and decode(webp.data).mode == "RGBA"


def test_path_loading_is_remembered_until_the_file_changes(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(images_module, "sha256_hex", lambda data: calls.append(1) or "h")
    path = tmp_path / "a.png"
    path.write_bytes(png_bytes())
    loader = ImageLoader(max_side=64)
    assert loader.load(path) is loader.load(str(path))
    assert len(calls) == 1
    path.write_bytes(png_bytes(colour=(0, 0, 0)) + b"")
    os.utime(path, ns=(1, 1))  # a different modification time: a changed file is loaded again
    loader.load(path)
    assert len(calls) == 2


@pytest.mark.parametrize("as_path", [True, False])
def test_the_image_is_hashed_once_per_batch_not_once_per_rollout(
    judge_server, tmp_path, monkeypatch, as_path
):
    calls = []
    real = images_module.sha256_hex
    monkeypatch.setattr(images_module, "sha256_hex", lambda data: calls.append(1) or real(data))
    server = judge_server()
    (tmp_path / "a.png").write_bytes(png_bytes())
    image = "a.png" if as_path else png_bytes()
    judge = OpenAICompatibleJudge(config(server.base_url), image_root=tmp_path)
    outcomes = judge_and_close(judge, [request(f"rollout {i}", image=image) for i in range(8)])
    assert len(outcomes) == 8 and server.counters.total == 8
    assert len(calls) == 1


def test_an_image_object_is_prepared_once_when_its_rollouts_are_judged_one_at_a_time(
    judge_server, monkeypatch
):
    """A prompt's rollouts judged as each finishes (batches of one) share their image object: it is
    hashed and decoded once, and the later batches find it without a thread hop."""
    calls, hops = [], []
    real_hash, real_hop = images_module.sha256_hex, asyncio.to_thread
    monkeypatch.setattr(images_module, "sha256_hex", lambda data: calls.append(1) or real_hash(data))
    monkeypatch.setattr(asyncio, "to_thread", lambda f, *a: hops.append(f) or real_hop(f, *a))
    server = judge_server()
    image, other = png_bytes(), png_bytes(colour=(0, 0, 200))
    judge = OpenAICompatibleJudge(config(server.base_url))

    async def one_at_a_time() -> list:
        try:
            return [(await judge.judge_batch([request(f"rollout {i}", image=image)]))[0] for i in range(6)]
        finally:
            await judge.aclose()

    outcomes = asyncio.run(one_at_a_time())
    assert all(isinstance(o, Judgement) for o in outcomes) and server.counters.total == 6
    assert (len(calls), len(hops)) == (1, 1)
    assert judge.images.prepared(image) is judge.images.load(image)
    assert judge.images.prepared(bytes(bytearray(image))) is None  # equal bytes, another object
    assert judge.images.prepared(other) is None and judge.images.prepared(bytearray(image)) is None


def test_the_images_held_stay_within_their_count_and_bytes(monkeypatch):
    monkeypatch.setattr(images_module, "HELD_BYTES", 3 * len(png_bytes()) + 1)
    loader = ImageLoader(max_side=64, remember=4)
    images = [png_bytes(colour=(i, 0, 0)) for i in range(5)]
    for image in images:
        loader.load(image)
    assert [loader.prepared(image) is not None for image in images] == [False, False, True, True, True]
    small = ImageLoader(max_side=64, remember=2)
    for image in images:
        small.load(image)
    assert [small.prepared(image) is not None for image in images] == [False, False, False, True, True]


def test_root_confinement(tmp_path):
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "ok.png").write_bytes(png_bytes())
    (tmp_path / "outside.png").write_bytes(png_bytes())
    (root / "link.png").symlink_to(tmp_path / "outside.png")
    loader = ImageLoader(max_side=64, root=root)
    assert loader.load("sub/ok.png").data == png_bytes()
    assert loader.load("sub/../sub/ok.png").data == png_bytes()
    for escaping in ["../outside.png", str(tmp_path / "outside.png"), "link.png", "sub/../../outside.png"]:
        with pytest.raises(ImageError, match="escapes the image root"):
            loader.load(escaping)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "empty"),
        (b"GIF89a-truncated", "not a readable image"),
        (png_bytes()[:60], "not a readable image"),
    ],
)
def test_corrupt_images_raise_a_clear_error(data, message):
    with pytest.raises(ImageError, match=message):
        ImageLoader(max_side=64).load(data)


def test_data_url_errors():
    with pytest.raises(ValueError, match="base64 data URL"):
        decode_data_url("https://example.com/a.png")
    with pytest.raises(ValueError, match="corrupt"):
        decode_data_url("data:image/png;base64,@@@")


def test_a_fifo_under_the_root_is_refused_at_once_not_waited_on(tmp_path):
    """Hashing an image for its cache key opens it without blocking: a FIFO (or any file that is not
    a regular one) is refused by name instead of hanging the run."""
    os.mkfifo(tmp_path / "pipe.png")
    with pytest.raises(ImageError, match="'pipe.png' is not a regular file"):
        ImageLoader(max_side=64, root=tmp_path).sha256("pipe.png")
