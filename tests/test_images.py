"""One pixel limit for every reader, reduced decoding of large JPEGs, and a bound on decodes at once."""

from __future__ import annotations

import io
import threading
import time

import pytest
from PIL import Image

import balcaprl.judge.images as judge_images
from balcaprl.images import DECODE_SLOTS, MAX_PIXELS, ImageReadError, ImageTooLarge, check_pixels, open_image
from balcaprl.testing.sharegpt4v_fixture import png_claiming


def jpeg(width: int, height: int) -> bytes:
    buffer = io.BytesIO()
    Image.linear_gradient("L").resize((width, height)).convert("RGB").save(buffer, "JPEG", quality=85)
    return buffer.getvalue()


# 9,500 x 9,500 = 90.25 MP: just above the limit, below Pillow's own error threshold (2x), where
# Pillow alone would only have warned and decoded it.
OVER = (9_500, 9_500)


def test_the_limit_is_pillows_threshold_and_is_checked_from_the_header():
    assert MAX_PIXELS == 89_478_485 == int(1024 * 1024 * 1024 // 4 // 3)
    check_pixels(9_459, 9_459, "x")  # 89,472,681 pixels: allowed
    with pytest.raises(ImageTooLarge, match=r"x is 9460x9460 = 89\.5 MP, above the limit of 89\.5 MP"):
        check_pixels(9_460, 9_460, "x")


def test_every_reader_refuses_the_same_image(tmp_path):
    """prepare, the judge (score, evaluate, training rewards), the trainer's loader and `caption`."""
    from balcaprl.data.validation import inspect_image
    from balcaprl.errors import InputError
    from balcaprl.evaluate.captioning import CaptionItem, _load_pil
    from balcaprl.train.data import open_image as open_training_image

    path = tmp_path / "huge.png"
    path.write_bytes(png_claiming(*OVER))
    with pytest.raises(ImageTooLarge, match="above the limit"):
        open_image(path)
    facts = inspect_image(str(tmp_path), "huge.png")
    assert facts.error[0] == "image_too_large" and "above the limit of 89.5 MP" in facts.error[1]
    with pytest.raises(judge_images.ImageError, match="above the limit of 89.5 MP"):
        judge_images.ImageLoader(1024, root=tmp_path).load("huge.png")
    with pytest.raises(ImageTooLarge, match="above the limit of 89.5 MP"):
        open_training_image(str(path), max_side=512)
    with pytest.raises(InputError, match="above the limit of 89.5 MP"):
        _load_pil(CaptionItem("huge", path))


def test_a_large_jpeg_is_decoded_at_a_reduced_scale(monkeypatch):
    resized: list[tuple[int, int]] = []
    thumbnail = Image.Image.thumbnail

    def spy(self, size, *args, **kwargs):  # the size decoded, before it is resized
        resized.append(self.size)
        return thumbnail(self, size, *args, **kwargs)

    monkeypatch.setattr(Image.Image, "thumbnail", spy)
    exact = open_image(jpeg(4096, 3072), max_side=1024)
    assert exact.size == (1024, 768) and resized == []  # decoded at 1/4 scale: no resize needed
    image = open_image(jpeg(4000, 3000), max_side=1024)
    assert resized == [(2000, 1500)] and image.size == (1024, 768)  # 1/2 scale, then resized
    assert image.format == "JPEG" and open_image(jpeg(4000, 3000)).size == (4000, 3000)  # no max_side: full


def test_unreadable_images_are_input_errors(tmp_path):
    with pytest.raises(ImageReadError, match="no such file"):
        open_image(tmp_path / "absent.png")
    with pytest.raises(ImageReadError, match="not a readable image"):
        open_image(b"GIF89a not really")


def test_the_judge_decodes_a_bounded_number_at_once(tmp_path, monkeypatch):
    lock = threading.Lock()
    now = peak = 0

    def slow_open(*args, **kwargs):
        nonlocal now, peak
        with lock:
            now += 1
            peak = max(peak, now)
        time.sleep(0.05)
        try:
            return open_image(*args, **kwargs)
        finally:
            with lock:
                now -= 1

    monkeypatch.setattr(judge_images, "open_image", slow_open)
    for i in range(16):
        (tmp_path / f"{i}.jpg").write_bytes(jpeg(64 + i, 48))
    loader = judge_images.ImageLoader(1024, root=tmp_path)
    threads = [threading.Thread(target=loader.load, args=(f"{i}.jpg",)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert 1 <= peak <= DECODE_SLOTS  # 16 threads, never more than DECODE_SLOTS decodes at once
