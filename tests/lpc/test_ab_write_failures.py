"""`lpc ab` when its results cannot be written (issue 44, case 11): a read-only --out is
refused before the replay; a full disk after it prints the figures, leaves no truncated file
and exits 2 with one line naming the file; --export-trace likewise."""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from lpc.cli.main import main
from lpc.traces import lpc_trace
from predictor import atomic_files
from tests.lpc.traces.helpers import bundled_lines, write_lines

NO_SPACE = f"No space left on device (errno {errno.ENOSPC})"
READ_ONLY = f"Read-only file system (errno {errno.EROFS})"


def replay(trace: Path, out: Path, *extra: str) -> int:
    """`lpc ab` on `trace` with LRU alone at one size: the smallest full run."""
    args = ["--trace", str(trace), "--policies", "lru"]
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
            *extra,
        ]
    )


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    return write_lines(tmp_path / "trace.jsonl", bundled_lines()[:20])


def error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("lpc ab: error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def full_disk(temporary: Path, path: Path) -> None:
    """The commit of an atomic write on a full disk: half the bytes, then ENOSPC."""
    with temporary.open("r+b") as handle:
        handle.truncate(temporary.stat().st_size // 2)
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def make_read_only(folder: Path, monkeypatch) -> None:
    """chmod 0o555; as root (who writes anyway) the probe of `folder` fails as a read-only
    mount would."""
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o555)
    if os.access(folder, os.W_OK):
        probe = atomic_files._probe

        def read_only(where: Path) -> None:
            if where == folder:
                raise OSError(errno.EROFS, os.strerror(errno.EROFS))
            probe(where)

        monkeypatch.setattr(atomic_files, "_probe", read_only)


def test_a_full_disk_after_the_replay_prints_the_figures_and_exits_2(
    trace: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    out = tmp_path / "out"
    monkeypatch.setattr(atomic_files, "_commit", full_disk)
    assert replay(trace, out, "--json") == 2
    captured = capsys.readouterr()
    figures = json.loads(captured.out)  # the figures survive, on stdout
    assert [r["policy"] for r in figures["results"]] == ["lru"]
    assert 0 < figures["results"][0]["token_hit_ratio"] < 1
    assert figures["files"] == {}
    line = error_line(captured.err)
    assert f"cannot write {out / 'results.csv'}: {NO_SPACE}" in line
    assert f"cannot write {out / 'report.md'}: {NO_SPACE}" in line
    assert line.endswith("(files written: none)")
    assert list(out.iterdir()) == [], "a truncated PNG, CSV or report was left behind"


def test_a_read_only_out_is_refused_before_the_replay(
    trace: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    out = tmp_path / "ro"
    make_read_only(out, monkeypatch)
    try:
        assert replay(trace, out) == 2
    finally:
        out.chmod(0o755)
    captured = capsys.readouterr()
    assert error_line(captured.err) == f"lpc ab: error: --out: cannot write into {out}: {READ_ONLY}"
    assert "workload:" not in captured.out, "the replay ran before the refusal"


def test_an_out_below_a_file_is_refused(trace: Path, tmp_path: Path, capsys) -> None:
    assert replay(trace, trace / "out") == 2
    assert error_line(capsys.readouterr().err) == (
        f"lpc ab: error: --out {trace / 'out'}: {trace} exists and is not a folder"
    )


def test_a_read_only_export_trace_folder_is_refused_before_the_replay(
    trace: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    folder = tmp_path / "exports"
    make_read_only(folder, monkeypatch)
    out = tmp_path / "out"
    try:
        assert replay(trace, out, "--export-trace", str(folder / "t.jsonl")) == 2
    finally:
        folder.chmod(0o755)
    assert error_line(capsys.readouterr().err) == (
        f"lpc ab: error: --export-trace: cannot write into {folder}: {READ_ONLY}"
    )
    assert not out.exists()


def test_a_full_disk_during_the_trace_export_keeps_the_replay(
    trace: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    """The export fails halfway: no half trace is left, the replay goes on, its files and
    table are written, and the run exits 2 naming the trace."""
    exported = tmp_path / "exports" / "t.jsonl"
    lines = lpc_trace.trace_lines

    def disk_fills(*args, **kwargs) -> Iterator[str]:
        for index, line in enumerate(lines(*args, **kwargs)):
            if index == 3:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            yield line

    monkeypatch.setattr(lpc_trace, "trace_lines", disk_fills)
    out = tmp_path / "out"
    assert replay(trace, out, "--export-trace", str(exported)) == 2
    captured = capsys.readouterr()
    assert f"trace: cannot write {exported}: {NO_SPACE}; the replay goes on" in captured.out
    assert "lru" in captured.out and f"files: {out / 'results.csv'}" in captured.out
    line = error_line(captured.err)
    assert line.startswith(f"lpc ab: error: cannot write {exported}: {NO_SPACE}"), line
    assert line.endswith(
        "(files written: results.csv, hit_ratio_vs_cache_size.png, report.md, results.json)"
    ), line
    assert list(exported.parent.iterdir()) == [], "a truncated trace was left behind"
    saved = json.loads((out / "results.json").read_text())
    assert "trace" not in saved["files"] and [r["policy"] for r in saved["results"]] == ["lru"]
