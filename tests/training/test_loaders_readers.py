"""Record readers: streamed JSON arrays, JSON Lines, UTF-8 repair, positions, truncation."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from training.loaders.readers import (
    Utf8Decoder,
    decode_utf8,
    detect_layout,
    iter_json_array_records,
    iter_jsonl_records,
    looks_cut_off,
)
from training.loaders.report import LoadReport, MalformedFileError


def is_record(value):
    return isinstance(value, dict) and "id" in value


def read_array(path, chunk_bytes=64):
    report = LoadReport(source=str(path), format="test")
    records = list(iter_json_array_records(path, report, is_record, chunk_bytes=chunk_bytes))
    return records, report


def test_utf8_decoder_carries_a_character_split_between_chunks():
    data = "é日".encode()
    decoder = Utf8Decoder()
    text = decoder.decode(data[:1]) + decoder.decode(data[1:4]) + decoder.decode(data[4:])
    text += decoder.decode(b"", final=True)
    assert text == "é日"
    assert decoder.take_replacements() == []


def test_decode_utf8_replaces_like_errors_replace_and_says_where():
    data = b"a\xffb\xe2\x82c\xe2"
    text, replacements = decode_utf8(data)
    assert text == data.decode("utf-8", errors="replace")
    assert replacements == [(1, 1), (3, 2), (5, 1)]


@pytest.mark.parametrize(
    ("text", "cut"),
    [
        ('{"a": "x', True),
        ('{"a": 1', True),
        ('{"a": tr', True),
        ('{"a": 1.', True),
        ('{"a": "\\u12', True),
        ('{"a": 1, ', True),
        ('{"a" 1}', False),
        ('{"a": [1,]}', False),
        ('{"a": x}', False),
    ],
)
def test_looks_cut_off(text, cut):
    with pytest.raises(json.JSONDecodeError) as caught:
        json.loads(text)
    assert looks_cut_off(caught.value, text) is cut


def test_an_item_much_larger_than_the_chunk_is_read_whole(tmp_path):
    big = {"id": "big", "text": "x" * 100_000}
    path = tmp_path / "a.json"
    path.write_text(json.dumps([{"id": "s"}, big, {"id": "t"}]))
    records, report = read_array(path, chunk_bytes=16)
    assert [r.value["id"] for r in records] == ["s", "big", "t"]
    assert records[1].value == big
    assert not report.truncated


def test_array_not_closed_is_a_truncation(tmp_path):
    path = tmp_path / "a.json"
    path.write_bytes(b'[{"id": "a"},\n  ')
    records, report = read_array(path)
    assert [r.value for r in records] == [{"id": "a"}]
    assert report.truncated_at_byte == len(b'[{"id": "a"},\n  ')
    assert any("not closed" in note for note in report.notes)


def test_missing_comma_costs_no_record(tmp_path):
    path = tmp_path / "a.json"
    path.write_text('[{"id": "a"} {"id": "b"}, {"id": "c"}]')
    records, _ = read_array(path)
    assert [r.value["id"] for r in records if r.problem is None] == ["a", "b", "c"]
    problems = [r.problem for r in records if r.problem]
    assert len(problems) == 1 and problems[0].startswith("expected ',' or ']'")


def test_a_trailing_comma_is_noted_not_a_problem(tmp_path):
    path = tmp_path / "a.json"
    path.write_text('[{"id": "a"}, {"id": "b"},\n]\n')
    records, report = read_array(path)
    assert [r.value["id"] for r in records] == ["a", "b"] and not report.truncated
    assert any("comma before the closing" in note for note in report.notes)


def test_garbage_to_the_end_is_one_problem_and_a_note(tmp_path):
    path = tmp_path / "a.json"
    path.write_text('[{"id": "a"}, {"id": "b" oops}, {"x": [1, 2}')
    records, report = read_array(path)
    assert [r.value["id"] for r in records if r.problem is None] == ["a"]
    problems = [r.problem for r in records if r.problem]
    assert problems == ["Expecting ',' delimiter (at byte 25)"]  # the o of oops
    assert any("rest of the file was ignored" in note for note in report.notes)


def test_a_byte_order_mark_and_trailing_whitespace_are_noted_or_ignored(tmp_path):
    path = tmp_path / "a.json"
    path.write_bytes(b'\xef\xbb\xbf[{"id": "a"}]\n \r\n\t\n')
    records, report = read_array(path)
    assert [r.value["id"] for r in records] == ["a"]
    assert report.notes == [f"{path}: UTF-8 byte order mark skipped"]


def test_a_record_after_the_closing_bracket_is_refused_naming_its_byte(tmp_path):
    """Issue 44's sibling of arrays joined with `cat`: a record appended after the array
    (`echo '{...}' >> chats.json`) was dropped with only a note; now the file is refused at
    its byte, in both modes, as a second array is."""
    from training.loaders import load_conversations

    first = '\ufeff[{"id": "a", "conversations": [{"from": "human", "value": "hi"}]}]\n'
    record = '{"id": "b", "conversations": [{"from": "human", "value": "ho"}]}\n'
    path = tmp_path / "chats.json"
    path.write_text(first + record, encoding="utf-8")
    byte = len(first.encode("utf-8"))
    for strict in (False, True):
        with pytest.raises(MalformedFileError) as caught:
            load_conversations(path, strict=strict)
        assert str(caught.value) == (
            f"{path}: byte {byte}: a JSON record after the array's closing ']', which would be "
            "lost: was it appended to the file? move it inside the array, or pass it as a "
            "separate JSON Lines file"
        )


def test_other_text_after_the_closing_bracket_is_refused_naming_its_byte(tmp_path):
    path = tmp_path / "a.json"
    path.write_text('[{"id": "a"}],\n  "oops"\n')
    with pytest.raises(MalformedFileError) as caught:
        read_array(path, chunk_bytes=4)
    assert str(caught.value) == (
        f"{path}: byte 13: 10 characters after the array's closing ']' (starting ',\\n  \"oops\"'): "
        "not JSON this file can hold; remove them"
    )


def test_invalid_bytes_in_an_array_item_are_counted_on_that_item(tmp_path):
    path = tmp_path / "a.json"
    data = b'[{"id": "a", "t": "\xff\xfe"},\n {"id": "b", "t": "\xc3\xa9"},\n {"id": "c", "t": "cut'
    path.write_bytes(data)
    records, report = read_array(path, chunk_bytes=7)
    assert [r.invalid_utf8_bytes for r in records] == [2, 0]
    assert records[1].value["t"] == "é"
    assert [r.position.byte_offset for r in records] == [1, data.index(b'{"id": "b"')]
    assert [r.position.line for r in records] == [1, 2]
    assert report.truncated_at_byte == data.index(b'{"id": "c"')


texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30)


@settings(max_examples=60, deadline=None)
@given(
    items=st.lists(st.fixed_dictionaries({"id": texts, "text": texts}), max_size=8),
    indent=st.sampled_from([None, 2]),
    chunk_bytes=st.integers(1, 40),
    cut_fraction=st.floats(0, 1),
    ensure_ascii=st.booleans(),
)
def test_stream_yields_exactly_the_complete_items_with_exact_positions(
    tmp_path_factory, items, indent, chunk_bytes, cut_fraction, ensure_ascii
):
    """Cut a serialised array anywhere: every item wholly before the cut comes out, at the
    byte offset and line where it starts, and the cut is reported where the next item starts."""
    pieces = [json.dumps(item, indent=indent, ensure_ascii=ensure_ascii) for item in items]
    data = b"["
    starts = []
    for k, piece in enumerate(pieces):
        data += b",\n " if k else b"\n "
        starts.append(len(data))
        data += piece.encode()
    data += b"\n]"
    cut = max(1, round(cut_fraction * len(data)))
    path = tmp_path_factory.mktemp("cut") / "a.json"
    path.write_bytes(data[:cut])
    records, report = read_array(path, chunk_bytes=chunk_bytes)
    complete = [k for k, s in enumerate(starts) if s + len(pieces[k].encode()) <= cut]
    assert [r.value for r in records] == [items[k] for k in complete]
    assert [r.position.byte_offset for r in records] == [starts[k] for k in complete]
    assert [r.position.line for r in records] == [
        data[: starts[k]].count(b"\n") + 1 for k in complete
    ]
    assert all(r.problem is None and r.invalid_utf8_bytes == 0 for r in records)
    if cut == len(data):
        assert not report.truncated
    else:
        assert report.truncated
        following = starts[len(complete)] if len(complete) < len(items) else len(data)
        # the cut is reported where the first incomplete item starts, or where the data
        # ends when it ends between items
        assert report.truncated_at_byte == min(following, cut)


def test_jsonl_complete_last_line_without_newline_is_no_truncation(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text('{"id": "a"}\n{"id": "b"}')
    report = LoadReport(source="x", format="test")
    records = list(iter_jsonl_records(path, report))
    assert [r.value["id"] for r in records] == ["a", "b"]
    assert not report.truncated


def test_jsonl_last_line_broken_in_the_middle_is_malformed_not_truncated(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text('{"id": "a"}\n{"id" "b", "more": 1}')
    report = LoadReport(source="x", format="test")
    records = list(iter_jsonl_records(path, report))
    assert records[1].problem is not None and records[1].position.line == 2
    assert not report.truncated


def test_layout_comes_from_the_content_not_the_name(tmp_path):
    lines = tmp_path / "data.json"
    lines.write_text('{"id": "a"}\n')
    array = tmp_path / "data.jsonl"
    array.write_text('  [{"id": "a"}]')
    assert detect_layout(lines) == "jsonl"
    assert detect_layout(array) == "json_array"
    empty = tmp_path / "empty.json"
    empty.write_text("  \n")
    with pytest.raises(MalformedFileError, match="empty"):
        detect_layout(empty)
    other = tmp_path / "x.csv"
    other.write_text("a,b\n")
    with pytest.raises(MalformedFileError, match="not JSON Lines"):
        detect_layout(other)


@pytest.mark.parametrize("data_format", [None, "sharegpt", "lmsys", "arena", "openai"])
@pytest.mark.parametrize(
    "content",
    [
        b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)) * 4,  # NUL bytes
        bytes(range(128, 256)) * 8 + b"\n" + bytes(range(192, 256)) * 4,  # no NUL, not UTF-8
    ],
    ids=["png", "high-bytes"],
)
def test_a_binary_file_named_jsonl_is_not_json_lines(tmp_path, data_format, content):
    """Not '0 conversations, N records skipped': one error naming the file, for every format."""
    from training.loaders import load_conversations

    path = tmp_path / "picture.jsonl"
    path.write_bytes(content)
    with pytest.raises(MalformedFileError, match=r"picture\.jsonl: not JSON Lines.*binary data"):
        load_conversations(str(path), format=data_format)


def test_a_few_bad_bytes_in_json_lines_are_still_repaired(tmp_path):
    """The binary check leaves real dumps alone: a record with one bad byte is kept."""
    from training.loaders import load_conversations

    record = {"id": "a", "conversations": [{"from": "human", "value": "caf\u00e9 ?"}]}
    line = json.dumps(record, ensure_ascii=False).encode().replace("\u00e9".encode(), b"\xe9")
    path = tmp_path / "dump.jsonl"
    path.write_bytes(line + b"\n")
    result = load_conversations(str(path))
    assert len(result.conversations) == 1
    assert result.report.invalid_utf8_bytes_replaced == 1


def test_json_arrays_joined_with_cat_are_refused_naming_the_second(tmp_path):
    """The JSON-array sibling of request logs joined with `cat`: the second array's records
    were dropped with only a note."""
    from training.loaders import load_conversations

    first = '[{"id": "a", "conversations": [{"from": "human", "value": "hi"}]}]\n'
    second = '[{"id": "b", "conversations": [{"from": "human", "value": "ho"}]}]\n'
    path = tmp_path / "all.json"
    path.write_text(first + second)
    with pytest.raises(MalformedFileError) as caught:
        load_conversations(path)
    assert str(caught.value) == (
        f"{path}: byte {len(first)}: a second JSON array after the first one's closing ']': "
        "were files joined with cat? pass the files separately (a folder of them)"
    )


def test_a_gzip_conversation_file_is_named_as_gzip(tmp_path):
    """The loaders read no compressed input: say so, rather than "binary data"."""
    import gzip

    path = tmp_path / "chats.jsonl.gz"
    path.write_bytes(gzip.compress(b'{"id": "a"}\n'))
    with pytest.raises(MalformedFileError) as caught:
        detect_layout(path)
    assert str(caught.value) == (
        f"{path}: gzip-compressed; conversation files are read uncompressed "
        f"(gzip -dc {path} > {tmp_path / 'chats.jsonl'})"
    )
