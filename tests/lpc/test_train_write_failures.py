"""`lpc train-return --out` when the artifact cannot be written (issue 44, case 11), and its
siblings `lpc train --trace --out`, `lpc train --out` and `lpc train --registry`: a read-only
folder is refused before the training; a full disk at the save prints the figures, leaves
no truncated model.safetensors and exits 2 with one line naming the file."""

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


def error_line(err: str, verb: str = "train-return") -> str:
    lines = [line for line in err.splitlines() if line.startswith(f"lpc {verb}: error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def full_disk(path: Path, payload: bytes) -> None:
    with path.open("wb") as handle:  # half the weights reach the disk, then ENOSPC
        handle.write(payload[: len(payload) // 2])
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def read_only(folder: Path, monkeypatch) -> Path:
    """chmod 0o555; as root (who writes anyway) the probe fails as on a read-only mount."""
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o555)
    if os.access(folder, os.W_OK):
        probe = atomic_files._probe

        def refuse(where: Path) -> None:
            if where == folder:
                raise OSError(errno.EROFS, os.strerror(errno.EROFS))
            probe(where)

        monkeypatch.setattr(atomic_files, "_probe", refuse)
    return folder


def test_a_full_disk_at_the_save_keeps_the_figures_and_leaves_no_half_model(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    trace = write_lines(tmp_path / "slice.jsonl", bundled_lines()[:600])
    out = tmp_path / "models" / "return"
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


@pytest.mark.slow  # an access-model fit needs 1,500 requests (about 30 s); the save is the
# same helper as train-return's, which the default suite covers
def test_train_trace_keeps_its_figures_on_a_full_disk(tmp_path: Path, monkeypatch, capsys) -> None:
    trace = write_lines(tmp_path / "slice.jsonl", bundled_lines()[:1500])
    out = tmp_path / "models" / "access"
    monkeypatch.setattr(atomic_files, "_write_synced", full_disk)
    args = ["train", "--trace", str(trace), "--horizon", "60", "--hidden", "4", "--out", str(out)]
    assert main([*args, "--json"]) == 2
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert "out" not in report and report["write_error"].startswith(f"cannot write {out}/")
    assert error_line(captured.err, "train").endswith("(no model written; the figures are above)")
    assert list(out.parent.iterdir()) == [], "a truncated model was left behind"


@pytest.mark.parametrize(
    ("args", "flag", "folder_of"),
    [
        (["train-return", "--trace", "none.jsonl", "--out"], "--out", "parent"),
        (["train", "--trace", "none.jsonl", "--out"], "--out", "parent"),
        (["train", "--dataset", "sharegpt", "--out"], "--out", "parent"),
        (["train", "--dataset", "sharegpt", "--registry"], "--registry", "itself"),
    ],
)
def test_a_read_only_folder_is_refused_before_the_training(
    args: list[str], flag: str, folder_of: str, tmp_path: Path, monkeypatch, capsys
) -> None:
    folder = read_only(tmp_path / "ro", monkeypatch)
    target = folder / "m" if folder_of == "parent" else folder
    try:
        code = main([*args, str(target)])
    finally:
        folder.chmod(0o755)
    assert code == 2
    assert error_line(capsys.readouterr().err, args[0]).endswith(
        f"error: {flag}: cannot write into {folder}: Read-only file system (errno {errno.EROFS})"
    )
