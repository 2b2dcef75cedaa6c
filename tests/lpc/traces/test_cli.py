"""`lpc ab --trace` as a user runs it: bad traces give one line and exit 2, no traceback.

In process (`lpc.cli.main.main`, as the console script calls it): an exception that escaped
the CLI's error handling would fail the test with its traceback.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lpc.cli.main import main
from tests.lpc.traces.helpers import bundled_lines, mooncake_record, write_lines


def one_error_line(capsys, *args: str) -> str:
    assert main(["ab", "--no-progress", *args]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_a_bad_trace_is_one_line_and_exit_2(tmp_path: Path, capsys) -> None:
    # Other bad fields go through the same path; test_import checks their messages.
    path = write_lines(tmp_path / "t.jsonl", [mooncake_record(5, [0]), mooncake_record(2, [0])])
    line = one_error_line(capsys, "--trace", str(path), "--out", str(tmp_path / "o"))
    assert line.startswith("lpc ab: error: ") and "t.jsonl:2: 'timestamp' 2 is before" in line


def test_a_missing_trace_fails_before_any_data_is_loaded(tmp_path: Path, capsys) -> None:
    line = one_error_line(capsys, "--trace", str(tmp_path / "missing.jsonl"))
    assert "missing.jsonl: no such trace file" in line


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--block-size", "24"], "does not divide the trace's block size 512"),
        (["--split-at", "7200"], "--split-at 7200 leaves no request to evaluate"),
        (["--shared-fanout", "1"], "shared_fanout must be >= 2"),
        (["--trace-format", "bailian"], "'chat_id' must be an int or a non-empty string"),
        (["--policies", "lru,lpc", "--model", "none"], "needs a trained predictor model"),
        (
            ["--policies", "lru,lpc-pooled", "--model", "none"],
            "policy 'lpc-pooled' needs a trained predictor model",
        ),
    ],
)
def test_bad_trace_settings_are_one_line(tmp_path: Path, capsys, args, message) -> None:
    path = write_lines(tmp_path / "t.jsonl", bundled_lines()[:50])
    code = main(["ab", "--no-progress", "--trace", str(path), "--out", str(tmp_path / "o"), *args])
    assert code == 2 and message in capsys.readouterr().err
