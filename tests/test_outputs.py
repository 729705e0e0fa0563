"""The output policy (refuse / --resume / --overwrite), the writability probe, shortfalls, the
append-only record and UTF-8 inputs: the shared helpers every command relies on."""

from __future__ import annotations

import os

import pytest

import balcaprl.outputs as outputs
from balcaprl.errors import InputError, OutputError, UserError
from balcaprl.files import JsonlLog, decode_utf8, read_utf8_text
from balcaprl.outputs import (
    claim_in_place,
    claim_output_dir,
    claim_output_file,
    ensure_writable_dir,
    present,
    release_output_locks,
    shortfall,
)


def results(folder):
    return present(folder, ["scores.jsonl", "*.parquet"])


def old_run(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "scores.jsonl").write_text("old\n")
    (out / "stale.parquet").write_text("old")
    (out / "cache.sqlite").write_text("answers")
    return out


def test_a_new_or_empty_folder_is_simply_written(tmp_path):
    target = claim_output_dir(tmp_path / "new" / "out", results=results)
    assert target.mode == "new" and target.work == target.final == tmp_path / "new" / "out"
    assert target.work.is_dir() and not target.replacing
    (tmp_path / "empty").mkdir()
    assert claim_output_dir(tmp_path / "empty", results=results).work == tmp_path / "empty"


def test_results_are_refused_without_a_flag(tmp_path):
    out = old_run(tmp_path)
    with pytest.raises(UserError) as caught:
        claim_output_dir(out, what="--out", results=results)
    assert str(caught.value) == (
        f"--out {out} already holds results (scores.jsonl, stale.parquet); pass --resume to continue them, "
        "--overwrite to replace them, or choose another place"
    )
    with pytest.raises(UserError, match="not both"):
        claim_output_dir(out, results=results, resume=True, overwrite=True)
    resumed = claim_output_dir(out, results=results, resume=True)
    assert resumed.mode == "resume" and resumed.work == out and (out / "scores.jsonl").read_text() == "old\n"


def test_a_command_without_resume_names_only_overwrite(tmp_path):
    out = old_run(tmp_path)
    with pytest.raises(UserError) as caught:
        claim_output_dir(out, what="--out", results=results, offers_resume=False)
    assert str(caught.value) == (
        f"--out {out} already holds results (scores.jsonl, stale.parquet); pass --overwrite to replace them, "
        "or choose another place"
    )


@pytest.mark.parametrize("atomic_exchange", [True, False])
def test_overwrite_builds_aside_then_swaps_leaving_no_stale_file(tmp_path, monkeypatch, atomic_exchange):
    if not atomic_exchange:  # a system without renameat2: two renames
        monkeypatch.setattr(outputs, "_exchange", lambda a, b: False)
    out = old_run(tmp_path)
    target = claim_output_dir(out, results=results, overwrite=True, copy=["cache.sqlite"])
    assert target.replacing and target.work == tmp_path / ".out.overwrite"
    assert sorted(p.name for p in target.work.iterdir()) == ["cache.sqlite"]  # the cache came along
    (target.work / "scores.jsonl").write_text("new\n")
    assert (out / "scores.jsonl").read_text() == "old\n"  # untouched until the swap
    target.commit()
    assert sorted(p.name for p in out.iterdir()) == ["cache.sqlite", "scores.jsonl"]
    assert (out / "scores.jsonl").read_text() == "new\n"
    release_output_locks()  # what the command line does when the command ends
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # nothing left aside


def test_a_killed_replacement_keeps_only_its_record(tmp_path):
    out = old_run(tmp_path)
    leftover = tmp_path / ".out.overwrite"
    leftover.mkdir()
    (leftover / ".record").mkdir()
    (leftover / ".record" / "rows.jsonl").write_text("paid\n")
    (leftover / "half-written.json").write_text("{")
    target = claim_output_dir(out, results=results, overwrite=True, resumable=[".record"])
    assert sorted(p.name for p in target.work.iterdir()) == [".record"]
    assert (target.work / ".record" / "rows.jsonl").read_text() == "paid\n"


def test_committing_leaves_the_old_results_after_a_failure(tmp_path):
    out = old_run(tmp_path)
    target = claim_output_dir(out, results=results, overwrite=True)
    with pytest.raises(RuntimeError), target.committing():
        (target.work / "scores.jsonl").write_text("new\n")
        raise RuntimeError("the run failed")
    assert (out / "scores.jsonl").read_text() == "old\n"


def test_unwritable_places_are_found_before_any_work(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(OutputError, match="is a file; give a folder"):
        claim_output_dir(blocker, results=results)
    with pytest.raises(OutputError, match=f"--out {blocker / 'sub'}: cannot write there"):
        ensure_writable_dir(blocker / "sub")
    if os.geteuid() != 0:  # root writes anywhere; a read-only filesystem is tested in test_bad_inputs
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o555)
        with pytest.raises(OutputError, match="cannot write there"):
            ensure_writable_dir(locked)
    assert isinstance(OutputError("x"), OSError)  # library callers catching OSError still do


def test_one_file_results_and_in_place_results(tmp_path):
    out, part = tmp_path / "caps.jsonl", tmp_path / "caps.jsonl.part"
    assert claim_output_file(out, partial=[part]) == "new"
    part.write_text("half\n")
    with pytest.raises(UserError, match=r"already has results \(caps.jsonl.part\)"):
        claim_output_file(out, partial=[part])
    assert claim_output_file(out, partial=[part], resume=True) == "resume" and part.exists()
    assert claim_output_file(out, partial=[part], overwrite=True) == "overwrite" and not part.exists()
    with pytest.raises(OutputError, match="is a folder; give a file name"):
        claim_output_file(tmp_path, partial=[])
    dataset = tmp_path / "ds"
    dataset.mkdir()
    (dataset / "progress").write_text("x")
    with pytest.raises(UserError, match=r"--data .* already holds results \(progress\)"):
        claim_in_place(dataset, what="--data", results=lambda d: present(d, ["progress"]))
    assert (
        claim_in_place(dataset, what="--data", results=lambda d: present(d, ["progress"]), resume=True)
        == "resume"
    )


def test_shortfall_by_hand():
    assert shortfall(5, 5, 1.0, unit="captions", verb="scored") is None
    assert shortfall(3, 5, 0.6, unit="captions", verb="scored") is None
    assert shortfall(3, 5, 1.0, unit="captions", verb="scored") == (
        "only 3 of 5 captions scored (60.0%; --min-scored 1 asks for 100%)"
    )
    assert shortfall(0, 5, 0.0, unit="captions", verb="scored") == "none of the 5 captions scored"
    assert shortfall(0, 0, 0.0, unit="captions", verb="scored") == "no captions in the input: nothing scored"
    assert shortfall(1, 4, 0.5, unit="rows", verb="re-captioned", flag="--min-recaptioned") == (
        "only 1 of 4 rows re-captioned (25.0%; --min-recaptioned 0.5 asks for 50%)"
    )


def test_the_record_survives_a_cut_last_line(tmp_path):
    path = tmp_path / "sub" / "record.jsonl"
    with JsonlLog(path, sync_every=2) as log:
        for i in range(3):
            log.append({"i": i, "text": "é"})
    with path.open("ab") as handle:
        handle.write(b'{"i": 3, "te')  # what a kill in the middle of a write leaves
    assert [r["i"] for r in JsonlLog(path).read()] == [0, 1, 2]
    assert path.read_bytes().endswith(b"}\n")  # the cut line is gone, the file is valid JSONL again
    assert JsonlLog(tmp_path / "absent.jsonl").read() == []
    scanned = list(JsonlLog(path).scan())  # line by line, each with the offset that reads it back
    assert [JsonlLog(path).at(offset) for offset, _ in scanned] == [r for _, r in scanned] != []


def test_text_that_is_not_utf8_names_the_byte_and_line(tmp_path):
    assert decode_utf8("ok é".encode(), "x") == "ok é"
    assert decode_utf8(b"\xef\xbb\xbfbom", "x") == "bom"  # a byte-order mark is not text
    with pytest.raises(InputError) as caught:
        decode_utf8(b'{"a": 1}\n{"caption": "caf\xe9"}\n', "captions.jsonl")  # 9 + 16 bytes before it
    assert str(caught.value).startswith("captions.jsonl: not UTF-8 at byte 25 (line 2: bytes e9 22 7d 0a)")
    with pytest.raises(InputError, match="no such file"):
        read_utf8_text(tmp_path / "absent.json", "--captions")
    with pytest.raises(InputError, match="is a folder"):
        read_utf8_text(tmp_path, "--captions")
