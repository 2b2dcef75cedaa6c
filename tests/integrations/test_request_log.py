"""The request log writer: what a line holds, and that no fault reaches the serving path.

Faults: a process killed mid-write, a full disk, an unwritable folder, a full queue, the
clock going backwards, two processes writing one folder. In each, `append` returns at once
and never raises, and what was written reads back as a trace.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

from lpc.integrations.request_log import (
    FILE_PATTERN,
    KEY_FILE_NAME,
    FinishedRequest,
    RequestLogConfig,
    RequestLogWriter,
    open_append,
)
from lpc.traces.lpc_trace import read_trace

DAY_S = 86_400.0
T0 = 1_795_000_000.0  # 2026-11-18, mid-day UTC


def record(i: int, arrival_s: float = T0, **fields) -> FinishedRequest:
    """Request i of a conversation of three turns; turn k's sequence extends turn k-1's."""
    conversation, turn = divmod(i, 3)
    prefix = [f"conv{conversation}-block{k}".encode() for k in range(3 * (turn + 1))]
    values = {
        "request_id": f"r{i}",
        "arrival_s": arrival_s + i,
        "finish_s": arrival_s + i + 0.5,
        "num_prompt_tokens": 16 * 2 * (turn + 1) + 3,
        "num_cached_tokens": 16 * 2 * turn,
        "num_output_tokens": 13,
        "block_hashes": prefix,
        "conversation_id": f"conv{conversation}",
        "turn_index": turn,
        "probability": 0.25,
        "probability_source": "model",
        "request_type": "text",
        "user_prompts": (f"secret words of prompt {i}",),
    }
    values.update(fields)
    return FinishedRequest(**values)


def written(writer: RequestLogWriter) -> None:
    assert writer.flush(10.0)


def log_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if FILE_PATTERN.match(p.name))


def test_a_line_per_request_that_reads_back_as_a_trace(tmp_path: Path) -> None:
    writer = RequestLogWriter(RequestLogConfig(tmp_path, salt="deployment-1"), pid=4242)
    for i in range(9):
        assert writer.append(record(i))
    written(writer)
    writer.close()
    (path,) = log_files(tmp_path)
    assert path.name == "requests-2026-11-18-pid4242-000.jsonl"
    header, first = (json.loads(line) for line in path.read_text().splitlines()[:2])
    assert header["format"] == "lpc-trace" and header["hash_block_size"] == 16
    assert header["source"] == "request-log" and header["pid"] == 4242
    assert first["input_length"] == 35 and first["output_length"] == 13
    assert first["cached_tokens"] == 0 and first["probability"] == 0.25
    assert first["probability_source"] == "model" and first["request_type"] == "text"
    assert len(first["sequence_hash_ids"]) == 3  # 35 + 13 tokens: three blocks
    counters = writer.counters.snapshot()
    assert counters["records_written"] == 9 and counters["records_dropped"] == 0
    assert counters["bytes_written"] == path.stat().st_size

    trace = read_trace(tmp_path)
    assert [r.request_id for r in trace.requests] == [f"r{i}" for i in range(9)]
    assert trace.logged_cached_tokens == [0, 32, 64] * 3
    assert trace.requests[4].turn.conversation_id == "conv1"
    assert trace.requests[4].turn.turn_index == 1
    # Turn 1's prompt repeats turn 0's prompt and reply (the engine hashed the reply's
    # blocks): equal ids, so equal replayed tokens; another conversation shares none.
    t0, t1, other = (trace.requests[i].turn.token_ids for i in (0, 1, 3))
    assert list(t0) == list(t1[:48]) and list(t1[48:64]) != list(other[48:64])
    assert not set(t0) & set(other)


def test_no_text_unless_asked_and_ids_are_keyed(tmp_path: Path) -> None:
    def run(directory: Path, **options) -> str:
        writer = RequestLogWriter(RequestLogConfig(directory, **options))
        writer.append(record(0))
        written(writer)
        writer.close()
        return "".join(p.read_text() for p in log_files(directory))

    default = run(tmp_path / "default", salt="a")
    assert "secret" not in default and "conv0-block" not in default
    assert "secret words of prompt 0" in run(tmp_path / "text", salt="a", record_text=True)
    ids = {
        name: json.loads(text.splitlines()[1])["sequence_hash_ids"][:2]
        for name, text in {
            "a": default,
            "a again": run(tmp_path / "again", salt="a"),
            "b": run(tmp_path / "b", salt="b"),
            "folder key": run(tmp_path / "nosalt"),
        }.items()
    }
    assert ids["a"] == ids["a again"]
    assert ids["a"] != ids["b"] and ids["a"] != ids["folder key"]
    key_file = tmp_path / "nosalt" / KEY_FILE_NAME
    assert key_file.stat().st_mode & 0o077 == 0  # readable by its owner only


def test_a_cut_last_line_is_skipped_and_nothing_else_lost(tmp_path: Path) -> None:
    writer = RequestLogWriter(RequestLogConfig(tmp_path, salt="s"))
    for i in range(6):
        writer.append(record(i))
    written(writer)
    writer.close()
    (path,) = log_files(tmp_path)
    with path.open("ab") as handle:  # a process killed half way through its next line
        handle.write(b'{"request_id":"r6","arrival_s":17950')
    trace = read_trace(tmp_path)
    assert trace.skipped_last_lines == 1
    assert len(trace.requests) == 6


WRITER_SCRIPT = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from lpc.integrations.request_log import FinishedRequest, RequestLogConfig, RequestLogWriter
    writer = RequestLogWriter(RequestLogConfig(Path(sys.argv[1]), salt="s", max_file_bytes=20000))
    name = sys.argv[2]
    i = 0
    while True:
        writer.append(FinishedRequest(
            f"{name}-{i}", 1.795e9 + i * 1e-3, 1.795e9 + i * 1e-3 + 0.5, 600, 0, 20,
            [f"{name}{i // 4}-{k}".encode() for k in range(38)], conversation_id=f"{name}{i // 4}",
        ))
        i += 1
        if i == 200:
            print("ready", flush=True)
        if i % 50 == 0:
            time.sleep(0.001)
    """
)


def start_writers(directory: Path, names: tuple[str, ...]) -> list[subprocess.Popen]:
    """The writers, started together; returned once each has written its first 200."""
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER_SCRIPT, str(directory), name],
            stdout=subprocess.PIPE,
            cwd=Path(__file__).resolve().parents[2],
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        )
        for name in names
    ]
    for process in processes:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == b"ready"
    return processes


def test_two_processes_killed_mid_write_leave_readable_files(tmp_path: Path) -> None:
    """Two processes share the folder (one file each, one key); SIGKILL cuts them anywhere."""
    processes = start_writers(tmp_path, ("a", "b"))
    time.sleep(0.3)
    for process in processes:
        process.send_signal(signal.SIGKILL)
        process.wait()
    files = log_files(tmp_path)
    pids = {FILE_PATTERN.match(p.name).group(2) for p in files}
    assert pids == {str(p.pid) for p in processes}
    assert len(files) > 2  # rotated at the size cap
    trace = read_trace(tmp_path)
    assert trace.skipped_last_lines <= len(files)
    ids = [r.request_id for r in trace.requests]
    for name in ("a", "b"):
        numbers = sorted(int(i.split("-")[1]) for i in ids if i.startswith(name))
        # Whatever reached the disk is whole: a gap-free run from the first request (a
        # killed writer loses only what was still queued and the line it was writing).
        assert numbers == list(range(len(numbers))) and len(numbers) >= 200
    arrivals = [r.arrival_s for r in trace.requests]
    assert arrivals == sorted(arrivals)  # the files are merged by time


class FullDisk:
    """A file on a disk with `room` bytes left: a write past it stores what fits, then fails
    with ENOSPC (as `write(2)` does)."""

    def __init__(self, path: Path, room: list[int]) -> None:
        self._file = open_append(path)
        self._room = room

    def write(self, data: bytes) -> None:
        fits = data[: self._room[0]]
        self._file.write(fits)
        self._room[0] -= len(fits)
        if len(fits) < len(data):
            raise OSError(errno.ENOSPC, "No space left on device")

    def close(self) -> None:
        self._file.close()


def test_a_full_disk_drops_and_counts_then_recovers(tmp_path: Path, caplog) -> None:
    room = [1500]
    writer = RequestLogWriter(
        RequestLogConfig(tmp_path, salt="s"), open_file=lambda path: FullDisk(path, room)
    )
    with caplog.at_level(logging.WARNING, "vllm.plugins.lpc"):
        for i in range(30):
            assert writer.append(record(i)) in (True, False)
            written(writer)  # one record per batch, so the disk fills mid-record
        room[0] = 10**9  # space freed
        for i in range(30, 33):
            writer.append(record(i))
        written(writer)
    writer.close()
    counters = writer.counters.snapshot()
    assert counters["dropped_write_errors"] > 0
    assert counters["records_written"] + counters["records_dropped"] == 33
    assert sum("No space left" in r.getMessage() for r in caplog.records) == 1  # rate-limited
    trace = read_trace(tmp_path)  # the cut line is the last of its file: skipped
    assert trace.skipped_last_lines == 1
    assert len(trace.requests) == counters["records_written"]
    assert {"r30", "r31", "r32"} <= {r.request_id for r in trace.requests}


def test_an_unwritable_folder_drops_with_one_warning(tmp_path: Path, caplog) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    writer = RequestLogWriter(RequestLogConfig(blocker / "logs", salt="s"))
    with caplog.at_level(logging.WARNING, "vllm.plugins.lpc"):
        for i in range(20):
            writer.append(record(i))
            written(writer)
    writer.close()
    counters = writer.counters.snapshot()
    assert counters["records_dropped"] == counters["dropped_write_errors"] == 20
    assert counters["records_written"] == 0
    assert len([r for r in caplog.records if "cannot write" in r.getMessage()]) == 1


def test_a_full_queue_drops_without_blocking(tmp_path: Path) -> None:
    release = threading.Event()

    def stuck_disk(path: Path):
        release.wait(10)  # the writer thread hangs in open(): a stalled network disk
        return open_append(path)

    writer = RequestLogWriter(
        RequestLogConfig(tmp_path, salt="s", queue_size=8), open_file=stuck_disk
    )
    started = time.perf_counter()
    accepted = [writer.append(record(i)) for i in range(100)]
    elapsed_s = time.perf_counter() - started
    release.set()
    written(writer)
    writer.close()
    counters = writer.counters.snapshot()
    assert accepted.count(False) == counters["dropped_queue_full"] >= 100 - 8 - 1
    assert counters["records_written"] == accepted.count(True)
    assert elapsed_s < 5.0  # far below the 10 s the writer thread was stuck


def test_the_clock_going_backwards(tmp_path: Path) -> None:
    """Finish before arrival is clamped to the arrival (counted); a record stamped with an
    earlier day goes to the current day's file (files never go back a day); reading sorts."""
    writer = RequestLogWriter(RequestLogConfig(tmp_path, salt="s"), pid=1)
    writer.append(record(0, arrival_s=T0 + DAY_S))
    written(writer)
    writer.append(record(1, arrival_s=T0 + DAY_S, finish_s=T0 + DAY_S - 60))  # finish < arrival
    writer.append(record(2, arrival_s=T0 - 30))  # the clock stepped back a day
    written(writer)
    writer.close()
    assert writer.counters.snapshot()["finish_before_arrival"] == 1
    assert [p.name for p in log_files(tmp_path)] == ["requests-2026-11-19-pid1-000.jsonl"]
    trace = read_trace(tmp_path)
    assert [r.request_id for r in trace.requests] == ["r2", "r0", "r1"]
    clamped = trace.requests[2]
    assert clamped.completion_s == clamped.arrival_s


def test_daily_files_and_size_rotation(tmp_path: Path) -> None:
    writer = RequestLogWriter(RequestLogConfig(tmp_path, salt="s", max_file_bytes=1200), pid=7)
    for i in range(6):
        writer.append(record(i))
        written(writer)
    for i in range(6, 9):
        writer.append(record(i, arrival_s=T0 + DAY_S))
        written(writer)
    writer.close()
    names = [p.name for p in log_files(tmp_path)]
    assert all(p.stat().st_size <= 1200 for p in log_files(tmp_path))
    assert {n[9:19] for n in names} == {"2026-11-18", "2026-11-19"}
    assert len(names) > 2 and names[1].endswith("-001.jsonl")
    assert len(read_trace(tmp_path).requests) == 9


def test_files_older_than_the_retention_are_deleted_when_a_new_day_opens(tmp_path: Path) -> None:
    """Retention bounds the folder: another process's old file goes too; a file of a name
    the log does not write, and the files within the retention, stay."""
    old = tmp_path / "requests-2026-10-01-pid99-000.jsonl"  # 48 days before the first record
    kept = tmp_path / "requests-2026-11-17-pid99-000.jsonl"
    foreign = tmp_path / "notes-2026-01-01.jsonl"
    for path in (old, kept, foreign):
        path.write_text("{}\n")
    writer = RequestLogWriter(RequestLogConfig(tmp_path, salt="s", retention_days=30), pid=7)
    writer.append(record(0))
    written(writer)
    assert not old.exists() and kept.exists() and foreign.exists()
    assert writer.counters.snapshot()["files_expired"] == 1
    # 31 days on: the new day's file expires both November files, this writer's own too.
    writer.append(record(1, arrival_s=T0 + 31 * DAY_S))
    written(writer)
    writer.close()
    assert not kept.exists() and writer.counters.snapshot()["files_expired"] == 3
    assert {p.name[9:19] for p in log_files(tmp_path)} == {"2026-12-19"}


def test_a_zero_retention_keeps_every_file(tmp_path: Path) -> None:
    old = tmp_path / "requests-2020-01-01-pid99-000.jsonl"
    old.write_text("{}\n")
    writer = RequestLogWriter(RequestLogConfig(tmp_path, salt="s", retention_days=0), pid=7)
    writer.append(record(0))
    written(writer)
    writer.close()
    assert old.exists() and writer.counters.snapshot()["files_expired"] == 0


def test_ids_holding_lone_surrogates_never_merge_in_the_log(tmp_path: Path, caplog) -> None:
    """Issue 44's sibling: `dup\\ud800` and `dup\\udbff` were both written as `dup\\ufffd`
    and merged with a real `dup\\ufffd`. An id (conversation, request or request type)
    holding half a UTF-16 pair is dropped from the log and counted, its batch kept; a recorded
    prompt holding one is text and keeps its record with U+FFFD (counted)."""
    writer = RequestLogWriter(RequestLogConfig(tmp_path, salt="s", record_text=True), pid=1)
    with caplog.at_level(logging.WARNING, logger="vllm.plugins.lpc"):
        writer.append(record(0, conversation_id="dup\ud800"))
        writer.append(record(1, conversation_id="dup\udbff"))
        writer.append(record(2, conversation_id="dup\ufffd"))  # a real U+FFFD is text
        writer.append(record(3, request_id="r\udc003"))
        writer.append(record(4, request_type="text\ud800"))
        writer.append(record(5, user_prompts=("half a pair \ud83d here",)))
        written(writer)
        writer.close()
    counters = writer.counters.snapshot()
    assert counters["records_written"] == 2 and counters["invalid_unicode"] == 1
    assert counters["records_dropped"] == counters["dropped_invalid_id"] == 4
    trace = read_trace(tmp_path)
    assert [(r.request_id, r.conversation_id) for r in trace.requests] == [
        ("r2", "dup\ufffd"),
        ("r5", "conv1"),
    ]
    (path,) = log_files(tmp_path)
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert lines[2]["user_prompts"] == ["half a pair \ufffd here"]
    assert [r.message for r in caplog.records] == [
        "request log: an id holds a lone surrogate (half a UTF-16 pair), which no log line "
        "can hold without merging it with another id: dropping its record (counted in "
        "records_dropped)"
    ]


def test_a_batch_of_ids_that_cannot_be_written_opens_no_file(tmp_path: Path) -> None:
    writer = RequestLogWriter(RequestLogConfig(tmp_path, salt="s"), pid=1)
    writer.append(record(0, conversation_id="dup\ud800"))
    written(writer)
    writer.close()
    assert writer.counters.snapshot()["dropped_invalid_id"] == 1
    assert log_files(tmp_path) == []
