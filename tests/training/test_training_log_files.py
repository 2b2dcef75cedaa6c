"""Which log files the daily job reads: dates from names or mtimes, new files, the window."""

from __future__ import annotations

import os
from datetime import UTC, datetime

import pytest

from training.log_files import date_from_name, discover_logs, select_logs

NOW = datetime(2025, 6, 30, 3, 0, tzinfo=UTC)


def touch(path, mtime: datetime | None = None, text: str = "{}\n"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if mtime is not None:
        os.utime(path, (mtime.timestamp(), mtime.timestamp()))
    return path


def test_dates_from_names():
    assert date_from_name("chats-2025-06-01.jsonl") == datetime(2025, 6, 1, tzinfo=UTC)
    assert date_from_name("20250601/part-0.parquet") == datetime(2025, 6, 1, tzinfo=UTC)
    assert date_from_name("run-12345678.jsonl") is None
    assert date_from_name("2025-02-30.jsonl") is None


def test_discover_uses_names_then_mtimes_and_skips_other_files(tmp_path):
    touch(tmp_path / "a-2025-06-10.jsonl")
    touch(tmp_path / "nested" / "b.json", mtime=datetime(2025, 6, 20, tzinfo=UTC))
    touch(tmp_path / "trace-2025-06-25.jsonl.gz")  # a gzip trace file
    touch(tmp_path / "notes.txt")
    touch(tmp_path / "old.json.gz")
    touch(tmp_path / ".hidden" / "c-2025-06-01.jsonl")
    logs = discover_logs(tmp_path)
    assert [(f.relative, f.date_from) for f in logs] == [
        ("a-2025-06-10.jsonl", "name"),
        ("nested/b.json", "mtime"),
        ("trace-2025-06-25.jsonl.gz", "name"),
    ]
    with pytest.raises(FileNotFoundError):
        discover_logs(tmp_path / "missing")


def test_selection_is_new_files_plus_the_window(tmp_path):
    touch(tmp_path / "old-2025-01-01.jsonl")
    touch(tmp_path / "recent-2025-06-20.jsonl")
    touch(tmp_path / "today-2025-06-29.jsonl")
    logs = discover_logs(tmp_path)
    first = select_logs(logs, seen=[], now=NOW, window_days=28)
    assert [f.relative for f in first.new_files] == [f.relative for f in logs]
    assert len(first.files) == 3  # everything is new the first time

    seen = [f.identity for f in logs]
    touch(tmp_path / "new-2025-06-30.jsonl")
    logs = discover_logs(tmp_path)
    second = select_logs(logs, seen, NOW, window_days=28)
    assert [f.relative for f in second.new_files] == ["new-2025-06-30.jsonl"]
    assert [f.relative for f in second.files] == [
        "recent-2025-06-20.jsonl",
        "today-2025-06-29.jsonl",
        "new-2025-06-30.jsonl",
    ]
    assert second.skipped_old == 1


def test_a_changed_file_is_new_again(tmp_path):
    path = touch(tmp_path / "log-2025-06-29.jsonl")
    seen = [f.identity for f in discover_logs(tmp_path)]
    touch(path, text="{}\n{}\n")
    assert select_logs(discover_logs(tmp_path), seen, NOW, 28).new_files


def test_window_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match="window_days"):
        select_logs([], [], NOW, 0)
