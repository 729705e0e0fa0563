"""Reading the published JSON as a stream (`JsonArrayStream`): the same elements as the standard
library's decoder at every buffer size, and a broken file named with where it breaks."""

import hashlib
import json
import re
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from balcaprl.data.sharegpt4v import PrepareOptions, prepare_sharegpt4v
from balcaprl.data.sharegpt4v.stream import JsonArrayStream
from balcaprl.errors import InputError


def reference(path):
    """The second implementation: the standard library, on the whole file."""
    return json.loads(path.read_text(encoding="utf-8-sig"), parse_float=Decimal)


@pytest.mark.parametrize("buffer", [1, 2, 3, 7, 1 << 16])
def test_matches_the_standard_library_at_every_buffer_size(tmp_path, monkeypatch, buffer):
    data = [
        {"id": i, "v": "é" * (i % 5), "n": 10 ** (i % 7), "f": 1.5e3, "z": [None, True]} for i in range(50)
    ]
    data += [12345678, "tail", 0.25, [], {}, 2**70, -(2**65), "😀\u2028", [[1, [2, {"a": []}]]]]
    path = tmp_path / "a.json"
    path.write_text(  # a byte-order mark, spaces and newlines around everything
        "\ufeff  [ " + " ,\n".join(json.dumps(x, ensure_ascii=False) for x in data) + " ]\n", encoding="utf-8"
    )
    monkeypatch.setattr(JsonArrayStream, "BUFFER", buffer)  # elements straddle every read's edge
    read = []
    stream = JsonArrayStream(path, on_bytes=read.append)
    got = list(stream)
    assert got == reference(path)
    assert got[50] == 12345678 and got[55] == 2**70 and got[52] == Decimal("0.25")
    assert stream.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert sum(read) == stream.size == path.stat().st_size  # progress sees every byte once


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@given(st.lists(json_values, max_size=8), st.booleans(), st.sampled_from([1, 5, 64]))
def test_any_list_reads_as_the_standard_library_reads_it(tmp_path_factory, values, ascii_only, buffer):
    path = tmp_path_factory.mktemp("prop") / "a.json"
    path.write_text(json.dumps(values, ensure_ascii=ascii_only), encoding="utf-8")
    JsonArrayStream.BUFFER, default = buffer, JsonArrayStream.BUFFER
    try:
        assert list(JsonArrayStream(path)) == reference(path)
    finally:
        JsonArrayStream.BUFFER = default


def test_empty_list(tmp_path):
    path = tmp_path / "a.json"
    path.write_text(" [ ]\n")
    stream = JsonArrayStream(path)
    assert list(stream) == [] and stream.sha256 == hashlib.sha256(b" [ ]\n").hexdigest()


def where(error):
    """(complete entries, first byte, last byte) from the message; normalised whitespace."""
    text = " ".join(str(error).split())
    complete = int(re.search(r"after (\d+) complete entr", text).group(1))
    span = re.search(r"in bytes (\d+)-(\d+) of", text)
    return complete, *(map(int, span.groups()) if span else (None, None))


@pytest.mark.parametrize(
    ("text", "message", "complete"),
    [
        ('{"id": 1}', "expected a JSON list '[', found '{'", 0),
        ('\ufeff \n{"item": 1}', "expected a JSON list '[', found '{'", 0),
        ("", "expected a JSON list '[', found no text", 0),
        ('[{"id": 1}, {"id": 2', "the file ends inside the list", 1),
        ('[{"id": 1}', "the file ends inside the list", 1),
        ('[{"id": 1} {"id": 2}]', "JSON syntax error", 1),
        ('[{"id": 1}, {"id": 2},]', "JSON syntax error", 2),
        ('[{"id": 1}] x', "text after the closing ']'", 1),
    ],
)
def test_broken_file_is_a_clear_error(tmp_path, text, message, complete):
    path = tmp_path / "broken.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(InputError) as caught:
        list(JsonArrayStream(path))
    error = caught.value
    assert isinstance(error, InputError)  # the CLI shows it as one line, exit 2
    text = " ".join(str(error).split())
    assert text.startswith(f"{path}: ") and message in text and "download it again" in text
    assert where(error)[0] == complete


def test_cut_file_names_the_entries_read_and_its_end(tmp_path, monkeypatch):
    entries = [
        {"id": f"{i:012d}", "image": f"coco/train2017/{i:012d}.jpg", "caption": "word " * 40}
        for i in range(300)
    ]
    whole = json.dumps(entries).encode()
    path = tmp_path / "cut.json"
    path.write_bytes(whole[: len(whole) * 2 // 3])  # an interrupted download
    monkeypatch.setattr(JsonArrayStream, "BUFFER", 4096)
    handed_out = []
    with pytest.raises(InputError, match="ends inside the list") as caught:
        for entry in JsonArrayStream(path):
            handed_out.append(entry)
    complete, first, last = where(caught.value)
    assert handed_out == entries[:complete] and 150 < complete < 300  # nothing read before is lost
    assert last == path.stat().st_size and first < last


def test_corrupt_byte_is_located(tmp_path, monkeypatch):
    entries = [{"id": i, "caption": "a long caption " * 20} for i in range(400)]
    data = bytearray(json.dumps(entries).encode())
    offset = data.index(b'{"id": 250,')
    data[offset] = ord("@")  # entry 250 is corrupt
    path = tmp_path / "corrupt.json"
    path.write_bytes(bytes(data))
    monkeypatch.setattr(JsonArrayStream, "BUFFER", 1024)
    with pytest.raises(InputError, match="JSON syntax error") as caught:
        list(JsonArrayStream(path))
    complete, first, last = where(caught.value)
    assert complete == 250
    assert first <= offset < last and last - first <= 1024  # within the read that held it


def test_preparation_stops_on_a_broken_file(tmp_path, fixture_template):
    path = tmp_path / "broken.json"
    path.write_text('[{"id": 1}, {"id": 2')
    with pytest.raises(InputError, match="download it again"):
        prepare_sharegpt4v(
            path, fixture_template.image_root, tmp_path / "o", options=PrepareOptions(workers=0)
        )
