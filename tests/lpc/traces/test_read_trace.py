"""Reading the project's JSONL traces: which file an error, or a skipped cut last line, names
in a trace of several files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lpc.traces.files import load_trace_files
from lpc.traces.jsonl import TraceError
from lpc.traces.load import TraceOptions, load_trace
from lpc.traces.lpc_trace import read_trace
from tests.lpc.traces.helpers import mooncake_record


def request(arrival_s: float, request_id: str) -> dict:
    return {
        "conversation_id": "c",
        "arrival_s": arrival_s,
        "completion_s": arrival_s + 1,
        "prompt_token_ids": [1, 2],
        "request_id": request_id,
    }


def test_a_repeated_request_id_names_the_file_it_is_in(tmp_path: Path) -> None:
    # The repeat is in a.jsonl; b.jsonl, read last, holds no repeat.
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(request(t, "dup")) + "\n" for t in (0, 1)))
    (tmp_path / "b.jsonl").write_text(json.dumps(request(5, "other")) + "\n")
    with pytest.raises(TraceError, match=r"a\.jsonl:2: request id 'dup' appears twice"):
        read_trace(tmp_path)


def test_the_files_whose_cut_last_line_was_skipped_are_named(tmp_path: Path) -> None:
    for name, t in (("a.jsonl", 0), ("b.jsonl", 5), ("c.jsonl", 9)):
        text = json.dumps(request(t, name)) + "\n"
        cut = '{"conversation_id": "c", "arr' if name != "b.jsonl" else ""
        (tmp_path / name).write_text(text + cut)
    trace = read_trace(tmp_path)
    assert trace.skipped_last_lines == 2
    assert trace.cut_files == (tmp_path / "a.jsonl", tmp_path / "c.jsonl")
    whole = read_trace(tmp_path / "b.jsonl")
    assert (whole.skipped_last_lines, whole.cut_files) == (0, ())


@pytest.mark.parametrize("fmt", ["lpc", "mooncake"])
def test_a_trace_of_several_files_names_the_real_files_with_a_cut_last_line(
    tmp_path: Path, fmt: str
) -> None:
    paths = [tmp_path / f"{day}.jsonl" for day in ("2025-06-01", "2025-06-02")]
    for i, path in enumerate(paths):
        if fmt == "lpc":
            line = json.dumps(request(10 * i, path.name))
        else:
            line = json.dumps(mooncake_record(10 * i, [i]))
        path.write_text(line + "\n" + ('{"cut": ' if i == 0 else ""))
    trace = load_trace_files(paths, fmt, TraceOptions())
    assert trace.info["skipped_last_lines"] == 1
    assert trace.info["cut_last_line_files"] == [str(paths[0])]
    single = load_trace(paths[0], TraceOptions(format=fmt))
    assert single.info["cut_last_line_files"] == [str(paths[0])]
    assert "cut_last_line_files" not in load_trace(paths[1], TraceOptions(format=fmt)).info
