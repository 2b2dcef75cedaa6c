"""`lpc train-return --out` when the artifact cannot be written (issue 44, case 11): a
read-only folder is refused before the training; a full disk at the save prints the figures,
leaves no truncated model.safetensors and exits 2 with one line naming the file."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from lpc.cli.main import main
from predictor import atomic_files
from predictor.return_time import WEIGHTS_FILE
from tests.lpc.traces.helpers import bundled_lines, write_lines

pytest.importorskip("torch")

QUICK = ["--max-epochs", "1", "--no-classifier", "--no-distil", "--intervals", "0"]


def error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("lpc train-return: error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_a_full_disk_at_the_save_keeps_the_figures_and_leaves_no_half_model(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    trace = write_lines(tmp_path / "slice.jsonl", bundled_lines()[:600])
    out = tmp_path / "models" / "return"

    def full_disk(path: Path, payload: bytes) -> None:
        with path.open("wb") as handle:  # half the weights reach the disk, then ENOSPC
            handle.write(payload[: len(payload) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(atomic_files, "_write_synced", full_disk)
    args = ["train-return", "--trace", str(trace), *QUICK, "--out", str(out), "--json"]
    assert main(args) == 2
    captured = capsys.readouterr()
    report = json.loads(captured.out)  # the figures survive, on stdout
    assert "concordance" in report["quality"]["model"] and "out" not in report
    assert error_line(captured.err) == (
        f"lpc train-return: error: cannot write {out / WEIGHTS_FILE}: No space left on device "
        f"(errno {errno.ENOSPC}) (no model written; the figures are above)"
    )
    assert list(out.parent.iterdir()) == [], "a truncated model.safetensors was left behind"


def test_a_read_only_out_folder_is_refused_before_the_training(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    if os.access(folder, os.W_OK):  # root writes anyway: the probe fails as on a ro mount

        def read_only(where: Path) -> None:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))

        monkeypatch.setattr(atomic_files, "_probe", read_only)
    try:
        code = main(
            ["train-return", "--trace", str(tmp_path / "none.jsonl"), "--out", str(folder / "m")]
        )
    finally:
        folder.chmod(0o755)
    assert code == 2
    assert error_line(capsys.readouterr().err) == (
        f"lpc train-return: error: --out: cannot write into {folder}: Read-only file system "
        f"(errno {errno.EROFS})"
    )
