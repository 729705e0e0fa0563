"""`prepare_sharegpt4v` on a fixture in ShareGPT4V's exact layout: every bad input is reported with
its reason, no good sample is lost, and the run is parallel, seeded and resumable. (Reading the JSON
and checking one entry have their own files: test_data_sharegpt4v_stream.py, ..._entries.py.)"""

import errno
import hashlib
import json
import os
from collections import Counter
from pathlib import Path

import pytest
from PIL import Image

from balcaprl.data.format import TokenCounter, load_split, read_card, read_split_rows
from balcaprl.data.sharegpt4v import PrepareOptions, prepare_sharegpt4v
from balcaprl.data.validation import REASONS, ImageLimits, inspect_image
from balcaprl.errors import InputError


def all_rows(out):
    return [r for split in ("train", "eval") for r in read_split_rows(out, split)]


def rejections_by_index(out):
    lines = (Path(out) / "rejections.jsonl").read_text().splitlines()
    return {str(r["index"]): r for r in map(json.loads, lines)}


@pytest.fixture(scope="module")
def prepared(fixture_template, tmp_path_factory):
    out = tmp_path_factory.mktemp("prepared") / "ds"
    report = prepare_sharegpt4v(
        fixture_template.json_path,
        fixture_template.image_root,
        out,
        options=PrepareOptions(eval_size=4, workers=2),
    )
    return fixture_template, out, report


# --------------------------------------------------------------------------------------------------
# Each bad input: the clear report, and no good sample lost


BAD_CASES = sorted(set(REASONS))


@pytest.mark.parametrize("reason", BAD_CASES)
def test_each_bad_input_is_reported_with_its_reason(prepared, reason):
    fixture, out, report = prepared
    expected = [i for i, r in fixture.bad.items() if r == reason]
    assert expected, f"the fixture has no case for {reason}"
    got = rejections_by_index(out)
    entries = json.loads(fixture.json_path.read_text())
    for index in expected:
        assert index in got, f"entry {index} ({entries[int(index)]!r:.80}) was not rejected"
        assert got[index]["reason"] == reason, got[index]
        assert got[index]["detail"], "a rejection must say what was wrong"
        entry = entries[int(index)]
        if isinstance(entry, dict) and "id" in entry:
            assert got[index]["id"] == str(entry["id"])
    assert report.rejections[reason] == len(expected)
    assert read_card(out)["rejections"][reason] == len(expected)


def test_no_good_sample_is_lost(prepared):
    fixture, out, report = prepared
    ids = [r["id"] for r in all_rows(out)]
    assert sorted(ids) == sorted(fixture.good)
    assert len(ids) == len(set(ids))
    assert report.kept == len(fixture.good) and report.entries == len(fixture.good) + len(fixture.bad)
    # Every entry is accounted for exactly once: kept or rejected.
    assert set(rejections_by_index(out)) == set(fixture.bad)


def test_rejection_details_name_the_problem(prepared):
    _, out, _ = prepared
    got = {r["id"]: r for r in rejections_by_index(out).values() if r["id"]}
    assert "climbs out of the image root" in got["bad-dotdot"]["detail"]
    assert "absolute path" in got["bad-absolute"]["detail"]
    assert "outside the image root" in got["bad-symlink"]["detail"]
    assert "--allow-symlinks-out" in got["bad-symlink"]["detail"]
    assert "truncated" in got["bad-truncated"]["detail"]
    assert "600x40" in got["bad-banner"]["detail"]
    assert "good-0" in got["bad-dup-copy"]["detail"]  # which kept sample it duplicates
    assert got["bad-missing"]["image"] == "coco/train2017/000000999999.jpg"


def test_rejection_summary_file(prepared):
    fixture, out, _ = prepared
    summary = json.loads((out / "rejections.json").read_text())
    assert summary["rejected"] == len(fixture.bad) and summary["kept"] == len(fixture.good)
    assert {k: v["count"] for k, v in summary["by_reason"].items()} == dict(Counter(fixture.bad.values()))
    assert all(v["meaning"] for v in summary["by_reason"].values())


def test_sample_fields(prepared):
    fixture, out, _ = prepared
    listed = [e for e in json.loads(fixture.json_path.read_text()) if isinstance(e, dict) and "id" in e]
    entries: dict = {}
    for e in listed:
        entries.setdefault(str(e["id"]), e)  # the first entry keeps the id
    rows = {r["id"]: r for r in all_rows(out)}
    for sample_id, row in rows.items():
        if sample_id in fixture.renamed:  # (the later entry with a repeated id)
            entry = next(e for e in listed[::-1] if e["id"] == fixture.renamed[sample_id])
        else:
            entry = entries[sample_id]
        human, gpt = entry["conversations"][0]["value"], entry["conversations"][1]["value"]
        assert "<image>" not in row["prompt"] and row["prompt"] == row["prompt"].strip()
        assert "".join(row["prompt"].split()) == "".join(human.replace("<image>", "").split())
        assert row["reference"] == row["reference_original"] == gpt.strip()
        assert row["image"].startswith("images/")
        src = os.path.normpath(fixture.image_root / entry["image"])
        assert row["image"] == "images/" + os.path.relpath(src, fixture.image_root)
        assert row["source"] == "sharegpt4v/" + row["image"].split("/")[1]
        data = (out / row["image"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == row["image_sha256"]
        assert os.path.samefile(out / row["image"], os.path.realpath(src))  # hard-linked, not copied
    assert rows["12345"]["prompt"] == "Describe this image.\nBe concise."
    assert rows["good-1"]["prompt"] == "Describe this image in detail."
    assert rows["good-0"]["prompt"] == "What do you see happening in this image?"
    assert {r["source"] for r in rows.values()} == {
        "sharegpt4v/" + s
        for s in ("coco", "sam", "llava", "wikiart", "web-celebrity", "web-landmark", "share_textvqa")
    }


def test_repeated_id_is_renamed_and_recorded(prepared):
    fixture, out, report = prepared
    assert report.renamed_ids == 1 and read_card(out)["renamed_ids"] == 1
    (rename,) = map(json.loads, (out / "renamed_ids.jsonl").read_text().splitlines())
    assert rename["id"] == "good-0#2" and rename["original_id"] == "good-0"


def test_card_and_loading_through_datasets(prepared):
    fixture, out, _ = prepared
    card = read_card(out)
    assert card["counts"] == {"train": len(fixture.good) - 4, "eval": 4}
    assert card["source"]["json"] == fixture.json_path.name
    assert card["source"]["json_sha256"] == hashlib.sha256(fixture.json_path.read_bytes()).hexdigest()
    assert card["split"]["seed"] == 0 and card["split"]["eval_size"] == 4
    assert card["images"]["mode"] == "auto" and card["images"]["hardlinked"] == len(fixture.good)
    assert card["tokenizer"] is None and card["recaption"] is None
    train = load_split(out, "train")
    assert len(train) == len(fixture.good) - 4 and train[0]["reference_tokens"] is None


# --------------------------------------------------------------------------------------------------
# Split, tokens, options


def test_split_is_seeded_and_stable(fixture_template, tmp_path):
    def eval_ids(seed, name):
        out = tmp_path / name
        prepare_sharegpt4v(
            fixture_template.json_path,
            fixture_template.image_root,
            out,
            options=PrepareOptions(eval_size=6, seed=seed, workers=0),
        )
        return {r["id"] for r in read_split_rows(out, "eval")}

    first, again, other = eval_ids(1, "a"), eval_ids(1, "b"), eval_ids(2, "c")
    assert first == again and len(first) == 6
    assert first != other


def test_eval_size_is_capped_at_half(fixture_template, tmp_path):
    report = prepare_sharegpt4v(
        fixture_template.json_path,
        fixture_template.image_root,
        tmp_path / "o",
        options=PrepareOptions(eval_size=10_000, workers=0),
    )
    assert report.eval == report.kept // 2 and report.train == report.kept - report.eval
    assert read_card(tmp_path / "o")["split"]["eval_size_requested"] == 10_000


def test_reference_tokens_with_a_local_tokenizer(fixture_template, tiny_tokenizer_dir, tmp_path):
    from transformers import AutoTokenizer

    counter = TokenCounter.load(str(tiny_tokenizer_dir))
    out = tmp_path / "o"
    prepare_sharegpt4v(
        fixture_template.json_path,
        fixture_template.image_root,
        out,
        options=PrepareOptions(eval_size=3, workers=0),
        token_counter=counter,
    )
    assert read_card(out)["tokenizer"] == str(tiny_tokenizer_dir)
    tok = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    rows = all_rows(out)
    expected = [len(tok(r["reference"], add_special_tokens=False)["input_ids"]) for r in rows]
    assert [r["reference_tokens"] for r in rows] == expected
    assert len(set(expected)) > 3  # the captions really differ in length


def test_tokenizer_that_cannot_load_is_a_clear_error(tmp_path):
    (tmp_path / "no-tokenizer").mkdir()
    with pytest.raises(ValueError, match="cannot load a tokenizer"):
        TokenCounter.load(str(tmp_path / "no-tokenizer"))
    with pytest.raises(ValueError, match="no-such-tokenizer: no such folder"):  # never asked of the hub
        TokenCounter.load(str(tmp_path / "no-such-tokenizer"))


def test_limit_reads_only_the_first_entries(fixture_template, tmp_path):
    report = prepare_sharegpt4v(
        fixture_template.json_path,
        fixture_template.image_root,
        tmp_path / "o",
        options=PrepareOptions(eval_size=1, workers=0, limit=5),
    )
    assert report.entries == 5 and report.kept == 5
    assert read_card(tmp_path / "o")["source"]["json_sha256"] is None  # only part of the file was read


def test_thresholds_are_options(fixture_template, tmp_path):
    loose = PrepareOptions(eval_size=1, workers=0, limits=ImageLimits(min_side=8, max_aspect_ratio=20))
    report = prepare_sharegpt4v(
        fixture_template.json_path, fixture_template.image_root, tmp_path / "o", options=loose
    )
    ids = {r["id"] for r in all_rows(tmp_path / "o")}
    assert {"bad-banner", "bad-tiny"} <= ids
    assert report.rejections["absurd_aspect_ratio"] == report.rejections["image_too_small"] == 0


def test_allow_symlinks_out(fixture_template, tmp_path):
    prepare_sharegpt4v(
        fixture_template.json_path,
        fixture_template.image_root,
        tmp_path / "o",
        options=PrepareOptions(eval_size=1, workers=0, allow_symlinks_out=True),
    )
    rows = {r["id"]: r for r in all_rows(tmp_path / "o")}
    assert "bad-symlink" in rows  # followed on request; '..' and absolute paths stay refused
    assert not {"bad-dotdot", "bad-absolute"} & set(rows)
    assert Path(tmp_path / "o" / rows["bad-symlink"]["image"]).is_file()


def test_parallel_and_serial_runs_agree(fixture_template, tmp_path):
    def snapshot(workers, name):
        out = tmp_path / name
        prepare_sharegpt4v(
            fixture_template.json_path,
            fixture_template.image_root,
            out,
            options=PrepareOptions(eval_size=4, workers=workers),
        )
        return [{k: v for k, v in r.items() if k != "image_path"} for r in all_rows(out)], (
            out / "rejections.jsonl"
        ).read_text().replace(str(out), "")

    assert snapshot(0, "serial") == snapshot(2, "parallel")


def test_progress_lines_in_a_log(fixture_template, tmp_path, capsys):
    capsys.readouterr()
    report = prepare_sharegpt4v(
        fixture_template.json_path,
        fixture_template.image_root,
        tmp_path / "o",
        options=PrepareOptions(eval_size=1, workers=0),
        progress=True,
    )
    out = capsys.readouterr()
    assert out.out == ""  # stdout stays free for a command's own output
    lines = out.err.splitlines()  # captured: not a terminal, so plain lines, one per start and end
    name, checked = fixture_template.json_path.name, report.images_checked
    assert [line.split(":")[0] for line in lines] == [f"reading {name}"] * 2 + ["checking images"] * 2 + [
        "placing images (auto)"
    ] * 2
    assert lines[0].startswith(f"reading {name}: started, ") and lines[0].endswith(" kB")
    assert f"; {report.entries:,} entries" in lines[1]
    assert lines[3].startswith(f"checking images: done, {checked}/{checked} images in ")
    assert lines[5].startswith(f"placing images (auto): done, {report.kept}/{report.kept} images in ")


def test_out_must_not_be_the_image_root(fixture_template):
    with pytest.raises(ValueError, match="must not be the image root"):
        prepare_sharegpt4v(
            fixture_template.json_path, fixture_template.image_root, fixture_template.image_root
        )


# --------------------------------------------------------------------------------------------------
# Images: hard links, copies, re-encoding


def test_copy_fallback_when_hard_links_fail(fixture_template, tmp_path, monkeypatch):
    def cross_device(src, dst, **kw):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", cross_device)
    report = prepare_sharegpt4v(
        fixture_template.json_path,
        fixture_template.image_root,
        tmp_path / "o",
        options=PrepareOptions(eval_size=1, workers=0),
    )
    assert report.placement == Counter({"copied": report.kept})
    row = all_rows(tmp_path / "o")[0]
    src = fixture_template.image_root / row["image"].removeprefix("images/")
    assert not os.path.samefile(tmp_path / "o" / row["image"], src)
    assert (tmp_path / "o" / row["image"]).read_bytes() == src.read_bytes()
    with pytest.raises(OSError, match="cross-device"):
        prepare_sharegpt4v(
            fixture_template.json_path,
            fixture_template.image_root,
            tmp_path / "h",
            options=PrepareOptions(eval_size=1, workers=0, image_mode="hardlink"),
        )


def test_reencode_mode(fixture_template, tmp_path):
    out = tmp_path / "o"
    report = prepare_sharegpt4v(
        fixture_template.json_path,
        fixture_template.image_root,
        out,
        options=PrepareOptions(eval_size=1, workers=0, image_mode="reencode", reencode_max_side=32),
    )
    assert report.placement["reencoded"] == report.kept
    for row in all_rows(out):
        assert row["image"].endswith(".jpg")
        with Image.open(out / row["image"]) as img:
            assert img.format == "JPEG" and img.mode == "RGB" and max(img.size) <= 32
        assert hashlib.sha256((out / row["image"]).read_bytes()).hexdigest() == row["image_sha256"]
    assert {r["id"]: r["image"] for r in all_rows(out)}["good-rgba"] == "images/wikiart/images/rgba.png.jpg"
    assert read_card(out)["images"]["max_side"] == 32


def test_stale_images_are_pruned_on_a_rerun(fixture_template, tmp_path):
    out = tmp_path / "o"
    opts = PrepareOptions(eval_size=1, workers=0, limits=ImageLimits(min_side=8, max_aspect_ratio=20))
    first = prepare_sharegpt4v(fixture_template.json_path, fixture_template.image_root, out, options=opts)
    assert (out / "images/web-celebrity/images/tiny.jpg").exists()
    report = prepare_sharegpt4v(
        fixture_template.json_path,
        fixture_template.image_root,
        out,
        options=PrepareOptions(eval_size=1, workers=0),
    )
    assert not (out / "images/web-celebrity/images/tiny.jpg").exists()
    assert report.pruned_images == 2
    # Facts come from the checkpoint; only the missing file and the link out (no file to compare
    # against, cheap to look at) are checked again.
    assert report.images_checked == 2 and report.images_reused == first.images_checked - 2
    assert report.placement["already_present"] == report.kept


# --------------------------------------------------------------------------------------------------
# Resuming


class Interrupt(BaseException):
    """Stands in for Ctrl-C / a killed job."""


def counting_inspector(stop_after=None):
    calls = []

    def inspect(root, image, allow_symlinks_out=False):
        if stop_after is not None and len(calls) >= stop_after:
            raise Interrupt
        calls.append(image)
        return inspect_image(root, image, allow_symlinks_out)

    return inspect, calls


def test_interrupted_run_resumes_without_rechecking(fixture_template, tmp_path):
    out = tmp_path / "o"
    opts = PrepareOptions(eval_size=4, workers=0)
    first, first_calls = counting_inspector(stop_after=10)
    with pytest.raises(Interrupt):
        prepare_sharegpt4v(
            fixture_template.json_path, fixture_template.image_root, out, options=opts, inspect=first
        )
    assert not (out / "dataset.json").exists()  # an interrupted run never looks finished
    assert len(first_calls) == 10

    second, second_calls = counting_inspector()
    report = prepare_sharegpt4v(
        fixture_template.json_path, fixture_template.image_root, out, options=opts, inspect=second
    )
    # Everything checked before the interruption with a file on disk is reused; missing / unsafe paths
    # (no file to compare against) are cheap and checked again.
    reusable = [
        i
        for i in first_calls
        if os.path.isfile(os.path.realpath(fixture_template.image_root / i))
        and os.path.realpath(fixture_template.image_root / i).startswith(
            os.path.realpath(fixture_template.image_root)
        )
    ]
    assert not set(reusable) & set(second_calls)
    assert report.images_reused == len(reusable) > 0
    assert report.images_checked == len(second_calls)

    clean = tmp_path / "clean"
    prepare_sharegpt4v(fixture_template.json_path, fixture_template.image_root, clean, options=opts)
    strip = lambda rows: [{k: v for k, v in r.items() if k != "image_path"} for r in rows]  # noqa: E731
    assert strip(all_rows(out)) == strip(all_rows(clean))
    assert rejections_by_index(out) == rejections_by_index(clean)


NO_FILE = ["coco/train2017/000000999999.jpg", "coco/train2017/000000000777.jpg"]  # missing; link out


def test_checkpoint_survives_a_line_cut_short(fixture_template, tmp_path):
    out = tmp_path / "o"
    opts = PrepareOptions(eval_size=4, workers=0)
    prepare_sharegpt4v(fixture_template.json_path, fixture_template.image_root, out, options=opts)
    checkpoint = out / ".prepare" / "image-checks.jsonl"
    lines = checkpoint.read_text().splitlines()
    checkpoint.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][: len(lines[-1]) // 2])  # killed mid-write
    inspect, calls = counting_inspector()
    prepare_sharegpt4v(
        fixture_template.json_path, fixture_template.image_root, out, options=opts, inspect=inspect
    )
    # Only the fact that was cut short is redone (besides the two paths with no file, always re-looked at).
    assert sorted(calls) == sorted([json.loads(lines[-1])["image"], *NO_FILE])
    after = checkpoint.read_text().splitlines()
    assert after[: len(lines) - 1] == lines[:-1]  # the cut line is gone: valid JSONL again
    redone = [json.loads(line) for line in after[len(lines) - 1 :]]
    assert json.loads(lines[-1]) in redone


def test_broken_json_keeps_the_checks_of_an_earlier_run(sharegpt4v, tmp_path):
    out = tmp_path / "o"
    opts = PrepareOptions(eval_size=1, workers=0)
    first = prepare_sharegpt4v(sharegpt4v.json_path, sharegpt4v.image_root, out, options=opts)
    checkpoint = out / ".prepare" / "image-checks.jsonl"
    before = checkpoint.read_bytes()
    good = sharegpt4v.json_path.read_bytes()
    sharegpt4v.json_path.write_bytes(good[: len(good) // 2])  # a new download, interrupted
    inspect, calls = counting_inspector()
    with pytest.raises(InputError) as caught:
        prepare_sharegpt4v(sharegpt4v.json_path, sharegpt4v.image_root, out, options=opts, inspect=inspect)
    assert isinstance(caught.value, InputError) and str(sharegpt4v.json_path) in str(caught.value)
    assert "complete entries" in " ".join(str(caught.value).split())
    assert calls == [] and checkpoint.read_bytes() == before  # nothing checked, nothing lost
    assert read_card(out)["counts"] == {"train": first.train, "eval": first.eval}  # still the old dataset

    sharegpt4v.json_path.write_bytes(good)  # downloaded again
    report = prepare_sharegpt4v(
        sharegpt4v.json_path, sharegpt4v.image_root, out, options=opts, inspect=inspect
    )
    assert sorted(calls) == sorted(NO_FILE)  # every image with a file is known from the first run
    assert report.images_reused == first.images_checked - len(NO_FILE) and report.kept == first.kept


def test_changed_file_is_checked_again(sharegpt4v, tmp_path):
    out = tmp_path / "o"
    opts = PrepareOptions(eval_size=1, workers=0)
    prepare_sharegpt4v(sharegpt4v.json_path, sharegpt4v.image_root, out, options=opts)
    victim = sharegpt4v.image_root / "sam/images/sa_1008.jpg"
    data = victim.read_bytes()
    victim.unlink()  # replaced by a truncated download (new inode, new size)
    victim.write_bytes(data[: len(data) // 2])
    inspect, calls = counting_inspector()
    report = prepare_sharegpt4v(
        sharegpt4v.json_path, sharegpt4v.image_root, out, options=opts, inspect=inspect
    )
    assert "sam/images/sa_1008.jpg" in calls
    assert report.rejections["truncated_image"] == 3
    assert "good-8" not in {r["id"] for r in all_rows(out)}


def test_checkpoint_of_another_image_root_is_set_aside(sharegpt4v, fixture_template, tmp_path):
    out = tmp_path / "o"
    opts = PrepareOptions(eval_size=1, workers=0)
    prepare_sharegpt4v(fixture_template.json_path, fixture_template.image_root, out, options=opts)
    inspect, calls = counting_inspector()
    prepare_sharegpt4v(sharegpt4v.json_path, sharegpt4v.image_root, out, options=opts, inspect=inspect)
    assert len(calls) == len(set(calls)) > 30  # all checked again, against the new root
    assert (out / ".prepare" / "image-checks.jsonl.stale").exists()


def test_empty_list_gives_an_empty_dataset(tmp_path, fixture_template):
    path = tmp_path / "empty.json"
    path.write_text("[]")
    report = prepare_sharegpt4v(
        path, fixture_template.image_root, tmp_path / "o", options=PrepareOptions(workers=0)
    )
    assert report.kept == 0 and read_card(tmp_path / "o")["counts"] == {"train": 0, "eval": 0}


@pytest.mark.parametrize("mode", ["copy", "reencode"])
def test_placed_copies_are_reused_then_refreshed_when_the_source_changes(sharegpt4v, tmp_path, mode):
    out = tmp_path / "o"
    opts = PrepareOptions(eval_size=1, workers=0, image_mode=mode)
    first = prepare_sharegpt4v(sharegpt4v.json_path, sharegpt4v.image_root, out, options=opts)
    assert first.placement[{"copy": "copied", "reencode": "reencoded"}[mode]] == first.kept
    again = prepare_sharegpt4v(sharegpt4v.json_path, sharegpt4v.image_root, out, options=opts)
    assert again.placement == Counter({"already_present": first.kept})
    for row in all_rows(out):
        assert hashlib.sha256((out / row["image"]).read_bytes()).hexdigest() == row["image_sha256"]

    source = sharegpt4v.image_root / "sam/images/sa_1008.jpg"  # good-8: replaced by a new version
    with Image.open(source) as img:
        img.rotate(90, expand=True).save(source.with_suffix(".tmp.jpg"), "JPEG")
    os.replace(source.with_suffix(".tmp.jpg"), source)
    third = prepare_sharegpt4v(sharegpt4v.json_path, sharegpt4v.image_root, out, options=opts)
    assert third.placement["already_present"] == first.kept - 1
    row = next(r for r in all_rows(out) if r["id"] == "good-8")
    with Image.open(out / row["image"]) as placed:
        assert placed.size == (48, 64)  # the rotated version, not the stale copy
    assert hashlib.sha256((out / row["image"]).read_bytes()).hexdigest() == row["image_sha256"]
