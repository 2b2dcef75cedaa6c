"""`load_conversations`: recognising formats, sources, the hub path, validation, reports."""

import json
from pathlib import Path

import pytest

from training.loaders import (
    FORMATS,
    DatasetUnavailableError,
    LoadReport,
    UnknownFormatError,
    load_conversations,
    open_conversations,
)
from training.loaders.hub import parse_hub_source

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.mark.parametrize(
    ("fixture", "expected"),
    [
        ("sharegpt_segments.json", "sharegpt"),
        ("lmsys.jsonl", "lmsys"),
        ("arena.json", "arena"),
        ("openai_messages.jsonl", "openai"),
    ],
)
def test_format_is_recognised_from_the_first_record(fixture, expected):
    assert load_conversations(FIXTURES / fixture).report.format == expected


def test_recognition_skips_leading_malformed_lines(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text('not json\n{"messages": [{"role": "user", "content": "hi"}]}\n')
    result = load_conversations(path)
    assert result.report.format == "openai" and len(result) == 1
    assert result.report.skipped["invalid_json"] == 1


def test_unrecognised_keys_name_the_expected_ones(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text('{"text": "hello"}\n')
    with pytest.raises(UnknownFormatError, match=r"keys \['text'\].*lmsys: conversation"):
        load_conversations(path)


def test_explicit_format_wins_and_mismatching_records_are_counted(tmp_path):
    result = load_conversations(FIXTURES / "lmsys.jsonl", format="openai")
    assert len(result) == 0
    assert result.report.skipped["missing_field"] == 7


def test_argument_validation():
    with pytest.raises(ValueError, match="unknown format 'csv'"):
        load_conversations(FIXTURES / "lmsys.jsonl", format="csv")
    with pytest.raises(ValueError, match="limit must be a positive int"):
        load_conversations(FIXTURES / "lmsys.jsonl", limit=0)
    with pytest.raises(ValueError, match="max_message_chars"):
        load_conversations(FIXTURES / "lmsys.jsonl", max_message_chars=0)
    with pytest.raises(ValueError, match="format 'sharegpt', not 'lmsys'"):
        load_conversations("sharegpt", format="lmsys")
    with pytest.raises(FileNotFoundError, match="for the bundled ShareGPT data pass 'sharegpt'"):
        load_conversations(FIXTURES / "missing.jsonl")


def test_empty_folder_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no data files"):
        load_conversations(tmp_path)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("hf:lmsys/lmsys-chat-1m", ("lmsys/lmsys-chat-1m", "train")),
        ("hf:lmsys/arena_conversations:train", ("lmsys/arena_conversations", "train")),
        ("hf:org/data:test", ("org/data", "test")),
    ],
)
def test_hub_source_parsing(source, expected):
    assert parse_hub_source(source) == expected


def test_hub_source_without_owner_is_rejected():
    with pytest.raises(ValueError, match="hf:<owner>/<dataset>"):
        load_conversations("hf:lmsys-chat-1m")


def test_unreachable_hub_gives_a_clear_error(monkeypatch):
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'lmsys/lmsys-chat-1m' on the Hub")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(DatasetUnavailableError) as caught:
        load_conversations("hf:lmsys/lmsys-chat-1m")
    message = str(caught.value)
    assert "'lmsys/lmsys-chat-1m'" in message and "split 'train'" in message
    assert "local file" in message and "ConnectionError" in message


def test_hub_records_go_through_the_same_pipeline(monkeypatch):
    import datasets

    rows = [
        {"conversation_id": "h1", "conversation": [{"role": "user", "content": "hi"}]},
        {"conversation_id": "h2", "conversation": "broken"},
        {"conversation_id": "h3", "conversation": [{"role": "user", "content": "yo"}]},
    ]
    calls = []

    def fake_load_dataset(dataset_id, split, streaming):
        calls.append((dataset_id, split, streaming))
        return rows

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    result = load_conversations("hf:lmsys/lmsys-chat-1m:train")
    assert calls == [("lmsys/lmsys-chat-1m", "train", True)]
    assert [c.conversation_id for c in result.conversations] == ["h1", "h3"]
    assert result.report.format == "lmsys"
    assert result.report.problems[0].startswith("hf:lmsys/lmsys-chat-1m:train: record 1")


def test_a_hub_stream_that_breaks_is_unavailable(monkeypatch):
    import datasets

    def broken_stream():
        yield {"messages": [{"role": "user", "content": "hi"}]}
        raise OSError("connection reset")

    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: broken_stream())
    with pytest.raises(DatasetUnavailableError, match="connection reset"):
        load_conversations("hf:org/chats", format="openai")


def test_open_conversations_streams_and_fills_the_report():
    with open_conversations(FIXTURES / "lmsys.jsonl") as stream:
        first = next(iter(stream))
        assert first.conversation_id == "c1"
        assert stream.report.conversations_produced == 1
        rest = list(stream._iterator)
    assert len(rest) == 2 and stream.report.conversations_produced == 3
    with pytest.raises(RuntimeError, match="only once"):
        iter(stream)


def test_report_is_json_ready_and_summarised():
    report = load_conversations(FIXTURES / "sharegpt_segments.json").report
    data = json.loads(json.dumps(report.to_dict()))
    assert data["skipped"]["duplicate_id"] == 1
    assert data["unknown_roles"] == {"tool": 1}
    assert data["truncated"] is False
    summary = report.summary()
    assert "8 records read, 5 conversations" in summary
    assert "leading assistant messages dropped 2" in summary


def test_every_format_has_a_default_mode_first():
    for fmt in FORMATS.values():
        assert fmt.resolve_mode(None) == fmt.modes[0]


def test_report_counts_start_at_zero():
    report = LoadReport(source="s", format="f")
    assert report.records_skipped == 0 and not report.truncated and report.summary()
