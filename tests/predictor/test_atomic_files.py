"""Atomic writes and the output-folder pre-flight: a failed write leaves no truncated file,
and the error is one line naming the file."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from predictor import atomic_files
from predictor.atomic_files import (
    OutputWriteError,
    atomic_open,
    atomic_path,
    check_output_folder,
    write_bytes_atomically,
    write_folder_atomically,
    write_text_atomically,
)
from predictor.errors import UserError

ENOSPC = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_write_replaces_the_file_whole_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "report.md"
    write_text_atomically(path, "old\n")
    write_text_atomically(path, "new\n")
    write_bytes_atomically(tmp_path / "b.bin", b"\x00\x01")
    assert path.read_text() == "new\n" and (tmp_path / "b.bin").read_bytes() == b"\x00\x01"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.bin", "report.md"]


def test_a_full_disk_keeps_the_old_file_and_names_the_new_one(tmp_path: Path) -> None:
    path = tmp_path / "results.csv"
    path.write_text("old\n")
    with pytest.raises(OutputWriteError) as caught, atomic_open(path) as handle:
        handle.write("half a ro")
        raise ENOSPC
    error = caught.value
    assert str(error) == f"cannot write {path}: No space left on device (errno 28)"
    assert error.errno == errno.ENOSPC and error.path == path
    assert isinstance(error, UserError) and isinstance(error, OSError)
    assert path.read_text() == "old\n", "the old file must survive a failed write"
    assert [p.name for p in tmp_path.iterdir()] == ["results.csv"], "temporary left behind"


def test_a_path_writer_gets_a_temporary_with_the_same_extension(tmp_path: Path) -> None:
    with atomic_path(tmp_path / "plot.png") as temporary:
        assert temporary.parent == tmp_path and temporary.suffix == ".png"
        assert temporary.name.startswith(".plot.png.")
        temporary.write_bytes(b"png")
    assert (tmp_path / "plot.png").read_bytes() == b"png"


def test_atomic_open_writes_whole_files_only(tmp_path: Path) -> None:
    with (
        pytest.raises(ValueError, match="mode 'w' or 'wb', got 'a'"),
        atomic_open(tmp_path / "x", "a"),
    ):
        pass


def test_a_folder_is_written_whole_or_not_at_all(tmp_path: Path, monkeypatch) -> None:
    folder = tmp_path / "model"
    write_folder_atomically(folder, {"a": b"1", "b": b"2"})
    with pytest.raises(FileExistsError):
        write_folder_atomically(folder, {"a": b"3"})
    real = atomic_files._write_synced

    def full_at_b(path: Path, payload: bytes) -> None:
        if path.name == "b":
            raise ENOSPC
        real(path, payload)

    monkeypatch.setattr(atomic_files, "_write_synced", full_at_b)
    with pytest.raises(OutputWriteError, match=r"cannot write .*model/b: No space left"):
        write_folder_atomically(folder, {"a": b"3", "b": b"4"}, overwrite=True)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == {"a": b"1", "b": b"2"}
    assert [p.name for p in tmp_path.iterdir()] == ["model"], "staging folder left behind"
    monkeypatch.setattr(atomic_files, "_write_synced", real)
    write_folder_atomically(folder, {"c": b"5"}, overwrite=True)
    assert [p.name for p in folder.iterdir()] == ["c"]


def test_the_preflight_creates_nothing_it_leaves_behind(tmp_path: Path) -> None:
    check_output_folder(tmp_path / "a" / "b", "--out")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "kept").mkdir()
    check_output_folder(tmp_path / "kept", "--out")
    assert list((tmp_path / "kept").iterdir()) == []


def test_the_preflight_refuses_a_path_below_a_file(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputWriteError) as caught:
        check_output_folder(tmp_path / "file" / "out", "--out")
    assert (
        str(caught.value)
        == f"--out {tmp_path}/file/out: {tmp_path}/file exists and is not a folder"
    )


def read_only_probe(folder: Path) -> None:
    raise OSError(errno.EROFS, os.strerror(errno.EROFS))


def test_the_preflight_refuses_a_read_only_folder(tmp_path: Path, monkeypatch) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        if os.access(folder, os.W_OK):  # root writes anyway: make the probe fail as EROFS would
            monkeypatch.setattr(atomic_files, "_probe", read_only_probe)
        with pytest.raises(OutputWriteError, match=rf"^--registry: cannot write into {folder}: "):
            check_output_folder(folder, "--registry")
    finally:
        folder.chmod(0o755)


def test_the_preflight_refuses_a_full_disk(tmp_path: Path, monkeypatch) -> None:
    usage = atomic_files.shutil.disk_usage(tmp_path)
    monkeypatch.setattr(atomic_files.shutil, "disk_usage", lambda _: usage._replace(free=4096))
    with pytest.raises(OutputWriteError) as caught:
        check_output_folder(tmp_path / "out", "--out")
    assert str(caught.value) == (
        f"--out: no room in {tmp_path}/out: only 4,096 bytes free (at least 1,048,576 needed)"
    )
    assert list(tmp_path.iterdir()) == []
