"""Writing results and artifacts so that a failure never leaves a truncated file behind.

Every writer of results or artifacts goes through here: a file (or an artifact's folder) is
written to a hidden temporary sibling, synced, then renamed into place; a failed write removes
its temporary and raises `OutputWriteError`, one line naming the file. `check_output_folder`
is the pre-flight of every command that writes into a folder. It lives in `predictor` (rank 0,
standard library only) so that `training` and every `lpc` package can use the one
implementation. docs/design.md, "Atomic files".
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from predictor.errors import UserError

# Below this much free space a folder is refused before a run: its results would not fit.
MIN_FREE_BYTES = 1 << 20


class OutputWriteError(UserError, OSError):
    """A result or artifact file could not be written; the message names the file and why.

    Still an `OSError`, for callers that catch those around a write."""

    def __init__(self, path: Path | str, error: OSError | str, what: str = "cannot write") -> None:
        code = error.errno if isinstance(error, OSError) else None
        reason = (error.strerror or str(error)) if isinstance(error, OSError) else error
        if code is not None:
            reason += f" (errno {code})"
        super().__init__(f"{what} {Path(path)}: {reason}")
        self.path = Path(path)
        self.errno = code  # OSError's slot: a caller can still tell ENOSPC from EROFS


class ResultsNotSavedError(UserError):
    """A long run finished but some of its files could not be written (a full disk, a
    read-only folder). `results` holds what was computed, so that the command prints it
    instead of losing it; the message names every file that failed and those written."""

    def __init__(
        self, results: Any, failed: Sequence[OutputWriteError], written: Sequence[Path | str]
    ) -> None:
        self.results = results
        self.failed = list(failed)
        self.written = [Path(p) for p in written]
        names = ", ".join(p.name for p in self.written) or "none"
        super().__init__("; ".join(str(e) for e in self.failed) + f" (files written: {names})")


def fsync_folder(folder: Path) -> None:
    """Make a rename in `folder` durable (a crash after it keeps the new name)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _temporary_sibling(path: Path) -> Path:
    """A new empty hidden file beside `path`, keeping its extension (plot writers read it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(
        dir=path.parent, prefix=f".{path.name}.", suffix=f".tmp{path.suffix}"
    )
    os.close(fd)
    return Path(name)


def _commit(temporary: Path, path: Path) -> None:
    """Sync the written temporary, then rename it over `path` (where a full disk shows up
    last: delayed allocation reports ENOSPC at the sync, not at the write)."""
    with temporary.open("rb") as handle:
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    fsync_folder(path.parent)


@contextlib.contextmanager
def atomic_path(path: Path | str) -> Iterator[Path]:
    """A temporary path beside `path` to write to; renamed over `path` when the block ends.

    For writers that take a path (matplotlib, pyarrow, numpy): on any failure the temporary
    is removed and `path` is untouched; an `OSError` becomes `OutputWriteError` naming `path`.
    """
    path = Path(path)
    temporary: Path | None = None
    try:
        temporary = _temporary_sibling(path)
        yield temporary
        _commit(temporary, path)
        temporary = None
    except OutputWriteError:
        raise
    except OSError as error:
        raise OutputWriteError(path, error) from error
    finally:
        if temporary is not None:
            temporary.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_open(path: Path | str, mode: str = "w", **kwargs: Any) -> Iterator[IO[Any]]:
    """`open(path, mode, **kwargs)` written atomically (`mode` "w" or "wb")."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open writes a whole file: mode 'w' or 'wb', got {mode!r}")
    if mode == "w":
        kwargs.setdefault("encoding", "utf-8")
    with atomic_path(path) as temporary, temporary.open(mode, **kwargs) as handle:
        yield handle
        handle.flush()


def write_text_atomically(
    path: Path | str, text: str, encoding: str = "utf-8", errors: str = "strict"
) -> None:
    """Write `text` to `path` whole or not at all."""
    with atomic_open(path, "w", encoding=encoding, errors=errors) as handle:
        handle.write(text)


def write_bytes_atomically(path: Path | str, payload: bytes) -> None:
    """Write `payload` to `path` whole or not at all."""
    with atomic_open(path, "wb") as handle:
        handle.write(payload)


def _write_synced(path: Path, payload: bytes) -> None:
    with path.open("wb") as handle:
        handle.write(payload)
        handle.flush()
        os.fsync(handle.fileno())


def write_folder_atomically(
    folder: Path | str, files: Mapping[str, bytes], overwrite: bool = False
) -> None:
    """Write `files` (name → bytes) as the folder `folder`, all of them or none.

    They are written and synced in a hidden staging folder beside it, which is then renamed
    into place; an existing folder is an error unless `overwrite`, then it is moved aside
    first and deleted after (a concurrent reader may briefly find no folder, never a partial
    one). On failure the staging folder is removed and the old folder is back in place.
    """
    folder = Path(folder)
    if folder.exists() and not overwrite:
        raise FileExistsError(f"{folder} exists; pass overwrite=True to replace it")
    staging: Path | None = None
    retired: Path | None = None
    current = folder
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-", dir=folder.parent))
        for name, payload in files.items():
            current = staging / name
            _write_synced(current, payload)
        current = folder
        staging.chmod(0o755)
        fsync_folder(staging)
        if folder.exists():
            retired = folder.parent / f".{folder.name}.old-{os.getpid()}-{time.time_ns()}"
            folder.rename(retired)
        staging.rename(folder)
        staging = None
        fsync_folder(folder.parent)
    except OSError as error:
        if retired is not None and not folder.exists():
            retired.rename(folder)  # the old version back: nothing is lost
            retired = None
        name = folder / current.name if current != folder else folder
        raise OutputWriteError(name, error) from error
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        if retired is not None:
            shutil.rmtree(retired, ignore_errors=True)


def _probe(folder: Path) -> None:
    """Write, sync and remove a small file in `folder` (OSError when it cannot be written)."""
    fd, probe = tempfile.mkstemp(dir=folder, prefix=".lpc-write-probe-")
    try:
        os.write(fd, b"probe\n")
        os.fsync(fd)
    finally:
        os.close(fd)
        os.unlink(probe)


def check_output_folder(
    folder: Path | str, flag: str, min_free_bytes: int = MIN_FREE_BYTES
) -> None:
    """Refuse, before any long work, a folder the command could not write its output into.

    `flag` names where the folder came from (`--out`, `--registry`). The folder may not exist
    yet: it is created to write a probe file, and whatever this created is removed again, so a
    refused or failed run leaves nothing behind. Raises `OutputWriteError` (one line) for a
    path below a file, a folder that cannot be created or written, or one with less than
    `min_free_bytes` free.
    """
    folder = Path(folder)
    existing = next((p for p in (folder, *folder.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise OutputWriteError(folder, f"{existing} exists and is not a folder", f"{flag}")
    created = [p for p in (folder, *folder.parents) if not p.exists()]
    try:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            _probe(folder)
        except OSError as error:
            raise OutputWriteError(folder, error, f"{flag}: cannot write into") from None
        free = shutil.disk_usage(folder).free
        if free < min_free_bytes:
            raise OutputWriteError(
                folder,
                f"only {free:,} bytes free (at least {min_free_bytes:,} needed)",
                f"{flag}: no room in",
            )
    finally:
        for path in created:  # deepest first
            with contextlib.suppress(OSError):
                path.rmdir()
