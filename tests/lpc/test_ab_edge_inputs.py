"""`lpc ab` on inputs with an empty part: a one-line trace, a trace whose requests all arrive
at one instant, a data set with no training conversation, a window with no arrival. Each
replays the policies that need no training part, or refuses in one line with exit 2 saying
what to do; none ends in a traceback."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from lpc.cli.main import main
from tests.lpc.traces.helpers import bundled_lines, mooncake_record, write_lines
from training.split import split_of

ROOT = Path(__file__).resolve().parents[2]
ACCESS_MODEL = ROOT / "models" / "mooncake-access"
WORDS = ["cache", "block", "prefix", "token", "user", "reply", "think", "pause"]
# No test here reads a PNG; tests/lpc/test_ab.py compares parallel replays with serial ones.
pytestmark = pytest.mark.usefixtures("no_plots")


def run_ab(args: list[str], capsys) -> tuple[int, str]:
    """Exit status and stderr of `lpc ab ARGS` (an uncaught exception fails the test)."""
    code = main(["ab", "--no-progress", "--workers", "1", "--model", "none", *args])
    return code, capsys.readouterr().err


def one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("lpc ab: error: "), err
    return lines[0]


def workload_of(out: Path) -> dict:
    return json.loads((out / "results.json").read_text())["workload"]


@pytest.fixture
def one_line(tmp_path: Path) -> Path:
    return write_lines(tmp_path / "one.jsonl", bundled_lines()[:1])


@pytest.fixture
def same_instant(tmp_path: Path) -> Path:
    """Six requests at one timestamp, sharing a prefix (so a cache has something to hit)."""
    records = [mooncake_record(5000, [0, 1, 2, 10 + k]) for k in range(6)]
    return write_lines(tmp_path / "same.jsonl", records)


def chat(conversation_id: str, turns: int) -> dict:
    messages = []
    for t in range(turns):
        words = " ".join(WORDS[(t + i) % len(WORDS)] for i in range(40))
        messages += [{"role": "user", "content": words}, {"role": "assistant", "content": words}]
    return {"id": conversation_id, "messages": messages}


def chats_file(path: Path, split: str | None, count: int = 8) -> Path:
    """`count` chats, all in the `split` half (None: whichever half each hashes to)."""
    ids = (f"chat{i}" for i in range(10_000))
    chosen = [c for c in ids if split is None or split_of(c) == split][:count]
    return write_lines(path, [chat(c, 3) for c in chosen])


def test_a_one_line_trace_replays_the_policies_that_need_no_training(
    one_line: Path, tmp_path: Path, capsys
) -> None:
    out = tmp_path / "o"
    args = ["--trace", str(one_line), "--policies", "lru", "--cache-sizes", "60000"]
    code, err = run_ab([*args, "--out", str(out)], capsys)
    assert code == 0, err
    workload = workload_of(out)
    assert workload["requests"] == 1
    assert workload["no_training_part"] == {"reason": "the trace holds one request"}
    assert "No training part (the trace holds one request)" in (out / "report.md").read_text()


def test_a_one_line_trace_with_the_default_policies_leaves_lpc_turns_out(
    one_line: Path, tmp_path: Path, capsys
) -> None:
    # The default trace policies include lpc-turns, which the training part fits: unasked
    # for, it is left out and the report says so; the rest replay.
    out = tmp_path / "o"
    code, err = run_ab(
        ["--trace", str(one_line), "--cache-sizes", "60000", "--out", str(out)], capsys
    )
    assert code == 0, err
    assert "Traceback" not in err
    note = workload_of(out)["no_training_part"]
    assert note["left_out"] == ["lpc-turns"]
    policies = {row["policy"] for row in json.loads((out / "results.json").read_text())["results"]}
    assert "lru" in policies and "lpc-turns" not in policies
    assert "lpc-turns left out (it needs a training part)" in (out / "report.md").read_text()


def test_a_one_line_trace_with_lpc_turns_is_one_line_naming_the_file(
    one_line: Path, tmp_path: Path, capsys
) -> None:
    # Asked for by name, lpc-turns is refused: it cannot be fitted on an empty training part.
    args = ["--trace", str(one_line), "--policies", "lru,lpc-turns"]
    code, err = run_ab([*args, "--out", str(tmp_path / "o")], capsys)
    assert code == 2
    line = one_error_line(err)
    assert f"{one_line}: the trace holds one request" in line
    assert "no training part to fit lpc-turns on; give --split-at 0" in line


def test_split_at_0_fits_lpc_turns_on_the_data_set_instead(
    one_line: Path, tmp_path: Path, capsys
) -> None:
    data = chats_file(tmp_path / "chats.jsonl", None, count=40)
    args = ["--trace", str(one_line), "--split-at", "0", "--dataset", str(data)]
    code, err = run_ab([*args, "--policies", "lru,lpc-turns", "--out", str(tmp_path / "o")], capsys)
    assert code == 0, err
    assert "no_training_part" not in workload_of(tmp_path / "o")


def test_a_trace_at_one_instant_replays_and_says_nothing_was_fitted(
    same_instant: Path, tmp_path: Path, capsys
) -> None:
    out = tmp_path / "o"
    trace = ["--trace", str(same_instant), "--cache-sizes", "60000", "--out", str(out)]
    code, err = run_ab([*trace, "--policies", "lru,lpc-const,oracle,belady"], capsys)
    assert code == 0, err
    workload = workload_of(out)
    assert workload["trace"]["split"]["train_requests"] == 0
    assert workload["no_training_part"] == {"reason": "all 6 requests arrive at the same instant"}
    code, err = run_ab([*trace, "--policies", "lru,lpc-turns"], capsys)
    assert code == 2
    line = one_error_line(err)
    assert f"{same_instant}: all 6 requests arrive at the same instant" in line


@pytest.mark.skipif(not ACCESS_MODEL.is_dir(), reason="the shipped access model is absent")
def test_with_no_training_part_the_fallback_p_is_reported_unfitted(
    same_instant: Path, tmp_path: Path, capsys
) -> None:
    out = tmp_path / "o"
    args = ["--trace", str(same_instant), "--policies", "lru,lpc", "--cache-sizes", "60000"]
    code, err = run_ab([*args, "--model", str(ACCESS_MODEL), "--out", str(out)], capsys)
    assert code == 0, err
    assert workload_of(out)["no_training_part"]["fallback_probability"] == 0.5
    assert "LPC's fallback p is 0.5, not fitted" in (out / "report.md").read_text()


def test_a_data_set_with_no_training_conversation(tmp_path: Path, capsys) -> None:
    data = chats_file(tmp_path / "eval_only.jsonl", "eval")
    common = ["--dataset", str(data), "--cache-sizes", "3000", "--out", str(tmp_path / "o")]
    code, err = run_ab(common, capsys)  # the defaults include lpc-turns: left out
    assert code == 0, err
    assert workload_of(tmp_path / "o")["no_training_part"]["left_out"] == ["lpc-turns"]
    code, err = run_ab([*common, "--policies", "lru,lpc-turns"], capsys)  # asked for: refused
    assert code == 2
    line = one_error_line(err)
    assert "eval_only.jsonl: no conversation falls in the training half" in line
    assert "lpc-turns" in line
    code, err = run_ab([*common, "--policies", "lru,lpc-const,oracle"], capsys)
    assert code == 0, err
    note = workload_of(tmp_path / "o")["no_training_part"]
    assert note == {"reason": "no conversation falls in the training half"}
    assert "No training part" in (tmp_path / "o" / "report.md").read_text()


def test_a_window_with_no_arrival_is_one_line(tmp_path: Path, capsys) -> None:
    data = chats_file(tmp_path / "chats.jsonl", None, count=40)
    args = ["--dataset", str(data), "--duration", "0.001", "--policies", "lru"]
    code, err = run_ab([*args, "--out", str(tmp_path / "o")], capsys)
    assert code == 2
    assert "no request arrives in the 0.001 s window; give a longer --duration" in (
        one_error_line(err)
    )


def replay_every_request(trace: Path, out: Path) -> int:
    """`lpc ab` on `trace` with LRU alone, every request counted (`--split-at 0`).

    With no training part in the trace, the chat data set's training half fits turns and the
    fallback: eight chats of that half do it here, where the bundled ShareGPT (17,000
    conversations, seconds to read) would fit the same fields."""
    chats = chats_file(out.parent / "chats.jsonl", "train")
    args = ["--trace", str(trace), "--split-at", "0", "--policies", "lru", "--dataset", str(chats)]
    return main(
        [
            "ab",
            "--no-progress",
            "--workers",
            "1",
            "--model",
            "none",
            *args,
            "--cache-sizes",
            "600000",
            "--out",
            str(out),
        ]
    )


def test_a_cut_last_line_is_named_in_the_text_output(tmp_path: Path, capsys) -> None:
    trace = write_lines(tmp_path / "cut.jsonl", bundled_lines()[:20])
    with trace.open("a") as f:
        f.write('{"timestamp": 1, "input_len')  # a log cut mid-line
    out = tmp_path / "o"
    assert replay_every_request(trace, out) == 0
    text = capsys.readouterr().out
    assert f"trace: skipped 1 cut last line in {trace}" in text
    assert f"Skipped 1 cut last line in {trace}." in text
    assert f"Skipped 1 cut last line in {trace}." in (out / "report.md").read_text()


def test_a_trace_path_that_is_not_utf8_reaches_the_report(tmp_path: Path, capsys) -> None:
    """A file name holding a byte that is not UTF-8 (Python sees a lone surrogate) is written
    back into report.md as the bytes it was, not a UnicodeEncodeError traceback."""
    folder = tmp_path / os.fsdecode(b"bad\xffname")
    folder.mkdir()
    trace = write_lines(folder / "t.jsonl", bundled_lines()[:20])
    out = tmp_path / "o"
    assert replay_every_request(trace, out) == 0
    assert b"bad\xffname" in (out / "report.md").read_bytes()
    assert "Traceback" not in capsys.readouterr().err
