"""Reading the project's JSONL traces: what a file:line error names in a folder of files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lpc.traces.jsonl import TraceError
from lpc.traces.lpc_trace import read_trace


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
