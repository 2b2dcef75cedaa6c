"""scripts/sample_conversations.py keeps whole conversations and the header."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "sample_conversations.py"


def _write(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_whole_conversations_and_the_header_are_kept(tmp_path: Path) -> None:
    header = {"format": "lpc-trace", "version": 1}
    lines = [{"conversation_id": f"c{i % 10}", "turn": i // 10} for i in range(40)]
    _write(tmp_path / "in.jsonl", [header, *lines])
    argv = [str(SCRIPT), str(tmp_path / "in.jsonl"), str(tmp_path / "out.jsonl"), "--one-in", "3"]
    done = subprocess.run(
        [sys.executable, *argv],
        capture_output=True,
        text=True,
        check=True,
    )
    out = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert out[0] == header
    kept = {r["conversation_id"] for r in out[1:]}
    assert 0 < len(kept) < 10
    # every turn of a kept conversation, none of the others
    assert len(out) - 1 == 4 * len(kept)
    assert f"kept {len(out) - 1} of 40 requests" in done.stdout


def test_a_line_without_a_conversation_is_one_line_and_exit_2(tmp_path: Path) -> None:
    _write(tmp_path / "in.jsonl", [{"conversation_id": "a"}, {"arrival_s": 1}])
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path / "in.jsonl"), str(tmp_path / "out.jsonl")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert (
        done.stderr.strip().count("\n") == 0 and "in.jsonl:2: no 'conversation_id'" in done.stderr
    )
