"""`lpc prequential --out` when its files cannot be written (issue 44, case 11's sibling): a
read-only folder is refused before the first window; a full disk during the run costs no
window's figures (they are printed) and leaves no truncated JSON."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from lpc.access import prequential
from lpc.access.prequential import PrequentialOptions, Window, WindowOutcome, run_prequential
from lpc.cli.main import main
from predictor import atomic_files
from predictor.atomic_files import ResultsNotSavedError

NO_SPACE = f"No space left on device (errno {errno.ENOSPC})"
WINDOWS = (Window(600.0, 900.0), Window(900.0, 1200.0))


def fake_window(options, window: Window, log) -> WindowOutcome:
    """A window's outcome without its hours of training and replay: the files are the test."""
    return WindowOutcome(window, {"rows": 1}, {"c": 0.5}, {"hit_ratio": 0.25}, {"total_s": 1.0})


COMMIT = atomic_files._commit


def second_window_hits_a_full_disk(temporary: Path, path: Path) -> None:
    """The disk fills after the first window's file: the second's and the summary fail."""
    if path.parent.name in (WINDOWS[1].name, "out"):
        with temporary.open("r+b") as handle:  # half the bytes, then ENOSPC
            handle.truncate(temporary.stat().st_size // 2)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    COMMIT(temporary, path)


def test_a_full_disk_costs_no_window(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(prequential, "run_window", fake_window)
    monkeypatch.setattr(atomic_files, "_commit", second_window_hits_a_full_disk)
    out = tmp_path / "out"
    logged: list[str] = []
    options = PrequentialOptions(windows=WINDOWS, out_dir=out, progress=False)
    with pytest.raises(ResultsNotSavedError) as caught:
        run_prequential(options, log=logged.append)
    error = caught.value
    assert [o.window for o in error.results] == list(WINDOWS), "every window ran"
    second = out / "windows" / WINDOWS[1].name / "prequential.json"
    assert f"cannot write {second}: {NO_SPACE}" in str(error)
    assert f"cannot write {out / 'prequential.json'}: {NO_SPACE}" in str(error)
    assert str(error).endswith("(files written: prequential.json)")  # the first window's
    assert any("the run goes on" in line for line in logged)
    first = out / "windows" / WINDOWS[0].name / "prequential.json"
    assert json.loads(first.read_text())["replay"] == {"hit_ratio": 0.25}
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert files == [str(first.relative_to(out))], "a truncated JSON was left behind"


def test_the_command_prints_the_windows_and_exits_2(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(prequential, "run_window", fake_window)
    monkeypatch.setattr(atomic_files, "_commit", second_window_hits_a_full_disk)
    args = ["prequential", "--starts", "600,900", "--width", "300", "--no-progress", "--json"]
    assert main([*args, "--out", str(tmp_path / "out")]) == 2
    captured = capsys.readouterr()
    assert [w["replay"] for w in json.loads(captured.out)] == [{"hit_ratio": 0.25}] * 2
    errors = [line for line in captured.err.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith("lpc prequential: error: cannot write ")


def test_a_read_only_out_is_refused_before_the_first_window(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    if os.access(folder, os.W_OK):  # root writes anyway: the probe fails as on a ro mount

        def read_only(where: Path) -> None:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))

        monkeypatch.setattr(atomic_files, "_probe", read_only)
    ran: list[Window] = []
    monkeypatch.setattr(prequential, "run_window", lambda o, w, log: ran.append(w))
    try:
        assert main(["prequential", "--out", str(folder)]) == 2
    finally:
        folder.chmod(0o755)
    assert capsys.readouterr().err.strip() == (
        f"lpc prequential: error: --out: cannot write into {folder}: Read-only file system "
        f"(errno {errno.EROFS})"
    )
    assert ran == []
