"""LMSys-Chat-1M format from JSON Lines, JSON arrays and Parquet."""

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from training.conversation import Message
from training.loaders import MalformedFileError, MalformedRecordError, load_conversations

FIXTURES = Path(__file__).parent / "fixtures"

GOOD_RECORDS = [
    {
        "conversation_id": "c1",
        "model": "vicuna-13b",
        "conversation": [
            {"role": "user", "content": "Hello"},
            {"role": "assistant", "content": "Hi!"},
        ],
        "openai_moderation": [{"flagged": False}],
    },
    {
        "conversation_id": "c2",
        "model": "koala-13b",
        "conversation": [{"role": "user", "content": "Only a question"}],
        "openai_moderation": [{"flagged": True}],
    },
]


def test_jsonl_with_malformed_lines_and_a_cut_last_line():
    path = FIXTURES / "lmsys.jsonl"
    data = path.read_bytes()
    result = load_conversations(path)
    report = result.report
    assert report.format == "lmsys"
    assert [c.conversation_id for c in result.conversations] == ["c1", "c2", "c9"]
    c2 = result.conversations[1]
    assert [m.content for m in c2.messages] == ["Q1", "A1", "Q2", "A2"]
    assert c2.split_key == "c2" and c2.group_id is None
    # a null reply is an empty message: dropped and counted
    assert result.conversations[2].messages == (Message("user", "last good"),)
    assert report.empty_messages_dropped == 1
    assert dict(report.skipped) == {
        "invalid_json": 1,
        "missing_field": 1,
        "wrong_type": 2,
        "not_an_object": 1,
        "empty_conversation": 1,
    }
    assert report.records_read == 9  # the blank line is no record, the cut line neither
    assert report.truncated_at_byte == data.index(b'{"conversation_id": "c10"')
    assert any("line 3" in p and "invalid_json" in p for p in report.problems)


def test_strict_raises_on_the_first_malformed_line():
    with pytest.raises(MalformedRecordError, match=r"record 2, line 3, byte \d+: invalid_json"):
        load_conversations(FIXTURES / "lmsys.jsonl", strict=True)


def test_json_array_of_lmsys_records(tmp_path):
    path = tmp_path / "lmsys.json"
    path.write_text(json.dumps(GOOD_RECORDS))
    result = load_conversations(path)
    assert result.report.format == "lmsys"
    assert [c.conversation_id for c in result.conversations] == ["c1", "c2"]


def test_parquet_reads_only_the_needed_columns(tmp_path):
    path = tmp_path / "train-00000-of-00001.parquet"
    pq.write_table(pa.Table.from_pylist(GOOD_RECORDS), path)
    result = load_conversations(path)
    assert result.report.format == "lmsys"
    assert [len(c.messages) for c in result.conversations] == [2, 1]
    assert result.conversations[0].messages[1] == Message("assistant", "Hi!")


def test_folder_of_parquet_shards_is_read_in_name_order(tmp_path):
    pq.write_table(pa.Table.from_pylist(GOOD_RECORDS[1:]), tmp_path / "part-1.parquet")
    pq.write_table(pa.Table.from_pylist(GOOD_RECORDS[:1]), tmp_path / "part-0.parquet")
    (tmp_path / "README.md").write_text("not data")
    result = load_conversations(tmp_path)
    assert [c.conversation_id for c in result.conversations] == ["c1", "c2"]


def test_parquet_without_the_format_columns_is_a_clear_error(tmp_path):
    path = tmp_path / "other.parquet"
    pq.write_table(pa.Table.from_pylist([{"text": "x"}]), path)
    with pytest.raises(MalformedFileError, match="no column"):
        load_conversations(path, format="lmsys")


def test_corrupt_parquet_is_a_clear_error(tmp_path):
    path = tmp_path / "broken.parquet"
    path.write_bytes(b"PAR1" + b"\0" * 64)
    with pytest.raises(MalformedFileError, match=r"broken\.parquet"):
        load_conversations(path, format="lmsys")


def test_non_utf8_bytes_are_replaced_and_counted():
    result = load_conversations(FIXTURES / "invalid_utf8.jsonl")
    assert [c.conversation_id for c in result.conversations] == ["u1", "u2"]
    assert result.conversations[0].messages[0].content == "caf\ufffd ok"
    assert result.report.invalid_utf8_bytes_replaced == 1
    assert result.report.records_with_invalid_utf8 == 1
    assert "invalid UTF-8 bytes replaced 1" in result.report.summary()


def test_non_utf8_bytes_are_an_error_in_strict_mode():
    with pytest.raises(MalformedRecordError, match=r"line 1, byte 0: 1 byte\(s\) are not valid"):
        load_conversations(FIXTURES / "invalid_utf8.jsonl", strict=True)


def test_a_huge_message_skips_its_conversation_by_default(tmp_path):
    huge = "word " * 300_000  # 1.5 M characters
    lines = [
        {"conversation_id": "before", "conversation": [{"role": "user", "content": "a"}]},
        {"conversation_id": "huge", "conversation": [{"role": "user", "content": huge}]},
        {"conversation_id": "after", "conversation": [{"role": "user", "content": "b"}]},
    ]
    path = tmp_path / "huge.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    result = load_conversations(path)
    assert [c.conversation_id for c in result.conversations] == ["before", "after"]
    assert result.report.skipped["message_too_long"] == 1
    assert "1500000 characters" in result.report.problems[0]
    kept = load_conversations(path, max_message_chars=None)
    assert len(kept) == 3 and kept.conversations[1].messages[0].content == huge
