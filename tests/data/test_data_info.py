"""`balcaprl data info`: statistics of a dataset folder and the reference-length histogram."""

import json

import numpy as np
import pytest
from PIL import Image

from balcaprl.data.format import DatasetSample, TokenCounter, write_dataset
from balcaprl.data.info import dataset_info, length_stats, write_length_histogram


def words():
    return TokenCounter(name="words", count=lambda texts: [len(t.split()) for t in texts])


@pytest.fixture
def recaptioned_dataset(tmp_path):
    """A dataset where some references were re-captioned (longer) and some were not."""
    png = tmp_path / "images" / "x.png"
    png.parent.mkdir(parents=True)
    Image.new("RGB", (4, 4)).save(png)

    def sample(i, recaptioned):
        original = " ".join(["word"] * (5 + i))
        return DatasetSample(
            id=f"s{i}",
            image=png,
            prompt="Describe this image." if i % 2 else "What is this?",
            reference=(original + " " + "more " * (10 + i)).strip() if recaptioned else original,
            reference_original=original,
            source="sharegpt4v/coco" if i < 6 else "sharegpt4v/sam",
        )

    root = write_dataset(
        tmp_path,
        [sample(i, i < 6) for i in range(8)],
        [sample(8, False), sample(9, True)],
        name="tiny",
        token_counter=words(),
        rejections={"missing_image": 3, "truncated_image": 1},
        extra={"recaption": {"model": "m", "rubric_version": "1+abc", "failed": 2}},
    )
    return root


def test_length_stats():
    stats = length_stats([1, 2, 3, 4, 100])
    assert stats["count"] == 5 and stats["min"] == 1 and stats["max"] == 100 and stats["median"] == 3
    assert stats["mean"] == pytest.approx(22.0)
    assert stats["p95"] == pytest.approx(float(np.percentile([1, 2, 3, 4, 100], 95)), abs=0.05)
    assert length_stats([]) is None


def test_dataset_info_counts_and_lengths(recaptioned_dataset):
    info = dataset_info(recaptioned_dataset)
    assert info["counts"] == {"train": 8, "eval": 2}
    assert info["recaptioned"] == 7  # rows 0..5 and 9
    assert info["sources"] == {"sharegpt4v/coco": 6, "sharegpt4v/sam": 4}
    assert info["distinct_prompts"] == 2
    assert info["rejections"] == {"missing_image": 3, "truncated_image": 1} and info["rejected"] == 4
    words_stats = info["length_stats"]["words"]
    assert words_stats["reference_original"]["min"] == 5 and words_stats["reference_original"]["max"] == 14
    assert words_stats["reference"]["max"] == 14 + 19  # row 9: its 14 original words + 19 added
    assert info["lengths"]["words"]["reference"][8] == 13  # row 8 kept its original
    assert info["length_stats"]["tokens"]["reference"]["count"] == 10  # stored column, the card's tokenizer
    assert info["tokenizer"] == "words"


def test_dataset_info_with_a_tokenizer_counts_every_text(recaptioned_dataset):
    chars = TokenCounter(name="chars", count=lambda texts: [len(t) for t in texts])
    info = dataset_info(recaptioned_dataset, tokenizer=chars)
    assert info["tokenizer"] == "chars"
    assert info["lengths"]["tokens"]["prompt"][0] == len("What is this?")
    assert set(info["length_stats"]["tokens"]) == {"prompt", "reference_original", "reference"}


def test_histogram_png(recaptioned_dataset, tmp_path):
    info = dataset_info(recaptioned_dataset)
    png = write_length_histogram(info, tmp_path / "plots" / "h.png")
    with Image.open(png) as img:
        assert img.format == "PNG" and img.width > 400 and img.height > 200
        pixels = np.asarray(img.convert("RGB")).reshape(-1, 3)
    # Both series are drawn: matplotlib's tab:orange and tab:blue (at alpha 0.55 over white).
    orange = np.array([255, 127, 14]) * 0.55 + 255 * 0.45
    blue = np.array([31, 119, 180]) * 0.55 + 255 * 0.45
    for color in (orange, blue):
        assert (np.abs(pixels - color).sum(axis=1) < 30).sum() > 100


def test_info_json_drops_raw_lengths(recaptioned_dataset):
    from balcaprl.data.info import info_json

    parsed = json.loads(info_json(dataset_info(recaptioned_dataset)))
    assert "lengths" not in parsed and parsed["counts"]["train"] == 8


def test_plain_text_tables(recaptioned_dataset):
    from balcaprl.data.info import format_info
    from balcaprl.data.validation import REASONS

    lines = format_info(dataset_info(recaptioned_dataset)).splitlines()
    assert lines[0] == f"tiny (version 1) at {recaptioned_dataset}"
    assert lines[2] == "re-captioned: 7 rows by m (rubric 1+abc); failures kept their original reference: 2"
    lengths = lines.index("lengths")
    assert lines[lengths + 1].split() == ["text", "unit", "n", "mean", "min", "p5", "median", "p95", "max"]
    rows = {
        tuple(line.split()[:2]): line.split()[2:] for line in lines[lengths + 3 : lines.index("", lengths)]
    }
    assert rows[("reference", "words")][:1] == ["10"] and rows[("reference", "words")][-1] == "33"
    assert rows[("reference_original", "words")][2] == "5"  # min
    # Numbers are right-aligned: every row of the lengths table ends at the same column.
    table = lines[lengths + 1 : lines.index("", lengths)]
    assert len({len(line) for line in table}) == 1
    rejected = lines.index("rejected entries: 4")
    assert lines[rejected + 3].split(maxsplit=2) == ["missing_image", "3", REASONS["missing_image"]]
    assert lines[rejected + 4].split(maxsplit=2) == ["truncated_image", "1", REASONS["truncated_image"]]


def test_render_info_prints_the_text_verbatim(recaptioned_dataset):
    from rich.console import Console

    from balcaprl.data.info import format_info, render_info

    info = dataset_info(recaptioned_dataset)
    info["name"] = "[bold]tiny[/bold]"  # brackets in a name are shown, not taken as markup
    console = Console(record=True, width=400)
    render_info(info, console)
    assert console.export_text().rstrip("\n") == format_info(info)
