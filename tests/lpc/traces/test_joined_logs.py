"""Logs joined or compressed the ways operators join them (issue 44, cases 1, 8 and 13):
every request is read, or the reader refuses in one line naming the file and where."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from lpc.cli.main import main
from lpc.traces.files import load_trace_files
from lpc.traces.jsonl import TraceError, read_json_lines
from lpc.traces.load import TraceOptions, load_trace
from tests.lpc.traces.helpers import bundled_lines

DAY_UTC = "2026-11-27"
# No test here reads a PNG: `lpc ab` writes placeholders for its plots (tests/lpc/conftest.py)
pytestmark = pytest.mark.usefixtures("no_plots")


def request_log(pid: int, key: str, count: int, start_s: float = 1_795_000_000.0) -> str:
    """A request log file's text as the serving plugin writes it: its header, then one
    block-hash line per finished request."""
    header = {
        "format": "lpc-trace",
        "version": 1,
        "source": "request-log",
        "hash_block_size": 16,
        "key_fingerprint": key,
        "pid": pid,
        "day_utc": DAY_UTC,
        "text_recorded": False,
    }
    lines = [header]
    for i in range(count):
        t = start_s + 10.0 * i
        lines.append(
            {
                "request_id": f"p{pid}-r{i}",
                "conversation_id": f"p{pid}-c{i % 5}",
                "arrival_s": t,
                "completion_s": t + 2.0,
                "input_length": 40,
                "output_length": 8,
                "cached_tokens": 0,
                "sequence_hash_ids": [pid * 1000 + i % 5, pid * 1000 + 100 + i, 9_000 + i],
            }
        )
    return "".join(json.dumps(line) + "\n" for line in lines)


def ab(path: Path, tmp_path: Path, capsys) -> tuple[int, str]:
    args = ["--trace", str(path), "--out", str(tmp_path / "out")]
    code = main(["ab", "--no-progress", "--workers", "1", *args])
    return code, capsys.readouterr().err.strip()


# Case 1: `(gzip -c a.jsonl; gzip -c b.jsonl) > all.jsonl.gz`, `gzip -c b.jsonl >> all.jsonl.gz`


def mooncake_halves() -> tuple[str, str]:
    lines = bundled_lines()[:120]
    return "\n".join(lines[:70]) + "\n", "\n".join(lines[70:]) + "\n"


def test_every_member_of_a_multi_member_gzip_is_read(tmp_path: Path) -> None:
    first, second = mooncake_halves()
    path = tmp_path / "all.jsonl.gz"
    path.write_bytes(gzip.compress(first.encode()) + gzip.compress(second.encode()))
    with path.open("ab") as handle:  # gzip -c c.jsonl >> all.jsonl.gz: a third member
        handle.write(gzip.compress(b""))
    lines = read_json_lines(path)
    assert (len(lines.records), lines.skipped_last_lines) == (120, 0)
    assert lines.records[70][0] == 71  # line numbers run on across members
    trace = load_trace(path, TraceOptions())  # what `lpc ab --trace` replays
    assert len(trace.requests) == 120 and trace.info["skipped_last_lines"] == 0
    joined = load_trace_files([path], "mooncake", TraceOptions())  # what `lpc retrain` reads
    assert len(joined.requests) == 120


def test_a_cut_last_member_keeps_the_earlier_ones_and_counts_the_cut_line(tmp_path: Path):
    first, second = mooncake_halves()
    cut = gzip.compress(second.encode())
    path = tmp_path / "all.jsonl.gz"
    path.write_bytes(gzip.compress(first.encode()) + cut[: len(cut) // 2])
    lines = read_json_lines(path)
    assert len(lines.records) >= 70 and lines.skipped_last_lines == 1


def test_zero_padding_after_the_last_member_is_ignored_as_gzip_ignores_it(tmp_path: Path):
    first, _ = mooncake_halves()
    path = tmp_path / "padded.jsonl.gz"
    path.write_bytes(gzip.compress(first.encode()) + b"\0" * 512)
    assert len(read_json_lines(path).records) == 70


def test_trailing_garbage_after_a_member_is_an_error_naming_its_byte(tmp_path: Path, capsys):
    first, _ = mooncake_halves()
    member = gzip.compress(first.encode())
    path = tmp_path / "all.jsonl.gz"
    path.write_bytes(member + b"garbage\n")
    code, err = ab(path, tmp_path, capsys)
    assert code == 2 and len(err.splitlines()) == 1
    assert err == (
        f"lpc ab: error: {path}: byte {len(member)}: 8 bytes after the end of gzip member 1 "
        "are not gzip data (trailing garbage, which `gzip -dc` would drop with a warning); "
        "cut the file at that byte or recompress it"
    )


def test_a_corrupt_second_member_is_an_error_naming_it(tmp_path: Path) -> None:
    first, second = mooncake_halves()
    member = gzip.compress(first.encode())
    broken = bytearray(gzip.compress(second.encode()))
    broken[-8] ^= 0xFF  # the CRC: the data no longer matches its check
    path = tmp_path / "all.jsonl.gz"
    path.write_bytes(member + bytes(broken))
    with pytest.raises(
        TraceError, match=rf"not a readable gzip file \(member 2 at byte {len(member)}"
    ):
        read_json_lines(path)


# Case 13: request logs joined with `cat a.jsonl b.jsonl > all.jsonl`


def test_a_second_header_is_named_as_logs_joined_with_cat(tmp_path: Path, capsys) -> None:
    path = tmp_path / "all.jsonl"
    path.write_text(request_log(1, "k1", 1203) + request_log(2, "k1", 1204))
    code, err = ab(path, tmp_path, capsys)
    assert code == 2
    assert err == (
        f"lpc ab: error: {path}:1205: a second header (the first is line 1): were logs joined "
        "with cat? pass the files separately (one folder holding each file as written, given "
        "as the trace or --logs)"
    )


def test_the_same_logs_as_a_folder_are_read_whole(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text(request_log(1, "k1", 1203))
    (tmp_path / "b.jsonl").write_text(request_log(2, "k1", 1204))
    trace = load_trace(tmp_path, TraceOptions())
    assert len(trace.requests) == 2407 and trace.info["skipped_last_lines"] == 0


def test_gzip_members_of_two_logs_are_refused_like_cat(tmp_path: Path) -> None:
    path = tmp_path / "all.jsonl.gz"
    path.write_bytes(
        gzip.compress(request_log(1, "k1", 3).encode())
        + gzip.compress(request_log(2, "k1", 3).encode())
    )
    with pytest.raises(TraceError, match=r"all.jsonl.gz:5: a second header"):
        load_trace(path, TraceOptions())


def test_a_header_after_request_lines_is_named_too(tmp_path: Path) -> None:
    text = request_log(1, "k1", 2)
    body = "".join(text.splitlines(keepends=True)[1:])
    path = tmp_path / "all.jsonl"
    path.write_text(body + text)
    with pytest.raises(TraceError, match=r"all.jsonl:3: a second header \(after request lines"):
        load_trace(path, TraceOptions(format="lpc"))


# Case 8: request logs written with different keys


def test_logs_with_different_keys_are_refused_naming_both_files(tmp_path: Path, capsys):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "requests-2026-11-27-pid1-0.jsonl").write_text(request_log(1, "aaaa1111", 4))
    (logs / "requests-2026-11-27-pid2-0.jsonl").write_text(request_log(2, "bbbb2222", 4))
    code, err = ab(logs, tmp_path, capsys)
    assert code == 2 and len(err.splitlines()) == 1
    assert err == (
        f"lpc ab: error: {logs}/requests-2026-11-27-pid2-0.jsonl:1: 'key_fingerprint' "
        f"'bbbb2222' differs from 'aaaa1111' in {logs}/requests-2026-11-27-pid1-0.jsonl: logs "
        "hashed with different keys share no block ids, so their common prefixes would "
        "vanish; replay each key's logs as a trace of its own"
    )
    with pytest.raises(TraceError, match="'key_fingerprint' 'bbbb2222' differs"):
        load_trace_files(sorted(logs.iterdir()), "lpc", TraceOptions())  # `lpc retrain`'s way


def test_a_log_without_a_header_beside_keyed_logs_is_refused(tmp_path: Path) -> None:
    """The sibling of mixed keys: a file that starts without its header has no key to
    compare."""
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "a.jsonl").write_text(request_log(1, "aaaa1111", 4))
    text = request_log(2, "aaaa1111", 4)
    (logs / "b.jsonl").write_text("".join(text.splitlines(keepends=True)[1:]))
    with pytest.raises(TraceError) as caught:
        load_trace(logs, TraceOptions())
    assert str(caught.value) == (
        f"{logs}/b.jsonl:1: no header, while {logs}/a.jsonl's names 'key_fingerprint' "
        "'aaaa1111': the key of this file's ids cannot be checked (a request log starts with "
        "its header; was it cut or joined by hand?)"
    )


def test_mooncake_traces_joined_with_cat_are_named_so(tmp_path: Path) -> None:
    lines = bundled_lines()[:50]
    path = tmp_path / "all.jsonl"
    path.write_text("\n".join(lines + lines) + "\n")
    with pytest.raises(TraceError, match=r"all.jsonl:51: 'timestamp' .* traces joined with cat\?"):
        load_trace(path, TraceOptions())
