"""A folder of trace files for `lpc retrain --logs`: a file that is no log at all (empty, or
not JSON Lines) is named with what is wrong with it, not taken for a conversation file."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from lpc.access.log_retrain import MixedLogsError, trace_format_of_files
from lpc.cli.main import main
from lpc.traces.files import json_lines_problem, trace_format_by_content
from tests.lpc.traces.helpers import mooncake_record, write_lines

NOT_AN_OBJECT = "not JSON Lines: its first line is not a JSON object"
PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x10"


def trace_folder(root: Path) -> Path:
    logs = root / "logs"
    logs.mkdir()
    write_lines(logs / "trace-2025-06-01.jsonl", [mooncake_record(t, [t]) for t in range(4)])
    return logs


@pytest.mark.parametrize(
    ("name", "content", "problem"),
    [
        ("empty-2025-06-02.jsonl", b"", "the file is empty"),
        ("blank-2025-06-02.jsonl", b"\n  \n", "the file is empty"),
        ("empty-2025-06-02.jsonl.gz", gzip.compress(b"", mtime=0), "the file is empty"),
        ("plot-2025-06-02.jsonl", PNG, "not JSON Lines: its first line is not JSON"),
        ("list-2025-06-02.jsonl", b"[1, 2]\n", NOT_AN_OBJECT),
        ("text-2025-06-02.jsonl", b'"hello"\n', NOT_AN_OBJECT),
    ],
)
def test_a_file_that_is_no_log_is_named_with_its_problem(
    tmp_path: Path, name: str, content: bytes, problem: str
) -> None:
    logs = trace_folder(tmp_path)
    (logs / name).write_bytes(content)
    assert trace_format_by_content(logs / name) is None
    assert json_lines_problem(logs / name) == problem
    with pytest.raises(MixedLogsError) as raised:
        trace_format_of_files(sorted(logs.iterdir()))
    message = str(raised.value)
    assert message.startswith(f"{logs / name}: {problem}")
    assert "mixes" not in message and "trace-2025-06-01.jsonl, a mooncake trace" in message


def test_conversation_files_among_trace_files_are_still_a_mix(tmp_path: Path) -> None:
    logs = trace_folder(tmp_path)
    conversation = {"conversation_id": "c", "conversation": [{"role": "user", "content": "hi"}]}
    (logs / "chats-2025-06-02.jsonl").write_text(json.dumps(conversation) + "\n")
    assert json_lines_problem(logs / "chats-2025-06-02.jsonl") is None
    with pytest.raises(MixedLogsError, match="mixes conversation files and trace files"):
        trace_format_of_files(sorted(logs.iterdir()))


def test_lpc_retrain_names_the_empty_file_and_exits_2(tmp_path: Path, capsys) -> None:
    logs = trace_folder(tmp_path)
    (logs / "empty-2025-06-02.jsonl").write_bytes(b"")
    code = main(["retrain", "--logs", str(logs), "--registry", str(tmp_path / "registry")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert err[0].startswith(f"lpc retrain: error: {logs / 'empty-2025-06-02.jsonl'}: the file")
