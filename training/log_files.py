"""Which logged conversations the daily job trains on: new files plus a window of older ones.

Logs are files in one folder (searched recursively), conversation logs or trace files. The job
remembers which files it has trained on; each run trains on every new or changed file plus
every file dated within the last `window_days` days, so the model follows the traffic and
forgets what is old.

Formats, dates and conversations spanning files: docs/design.md, "Which logs a run reads".
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

DATA_SUFFIXES = (".json", ".jsonl", ".ndjson", ".parquet")
GZIP_SUFFIXES = (".jsonl.gz",)  # trace files (Mooncake ships gzip); recognised by content
DATE_IN_NAME = re.compile(r"(?<!\d)(20\d{2}|19\d{2})-?(0[1-9]|1[0-2])-?(0[1-9]|[12]\d|3[01])(?!\d)")


@dataclass(frozen=True)
class LogFile:
    path: Path
    relative: str  # path under the logs folder, the file's identity
    date: datetime  # UTC
    date_from: str  # "name" or "mtime"
    size: int
    mtime_ns: int

    @property
    def identity(self) -> str:
        """What `state.json` remembers: a changed file is a new file."""
        return f"{self.relative}|{self.size}|{self.mtime_ns}"


def is_log_file(name: str) -> bool:
    """A conversation file's suffix, or a gzip-compressed JSON lines file (a trace)."""
    name = name.lower()
    return Path(name).suffix in DATA_SUFFIXES or name.endswith(GZIP_SUFFIXES)


def date_from_name(relative: str) -> datetime | None:
    match = DATE_IN_NAME.search(relative)
    if match is None:
        return None
    try:
        return datetime(int(match.group(1)), int(match.group(2)), int(match.group(3)), tzinfo=UTC)
    except ValueError:  # 2025-02-30
        return None


def discover_logs(folder: Path) -> list[LogFile]:
    """Every data file under `folder`, oldest first (then by path). Hidden files are skipped."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"logs folder {folder} does not exist")
    found = []
    for path in folder.rglob("*"):
        relative = path.relative_to(folder).as_posix()
        if (
            not path.is_file()
            or not is_log_file(path.name)
            or any(part.startswith(".") for part in Path(relative).parts)
        ):
            continue
        stat = path.stat()
        named = date_from_name(relative)
        date = named or datetime.fromtimestamp(stat.st_mtime, UTC)
        found.append(
            LogFile(
                path, relative, date, "name" if named else "mtime", stat.st_size, stat.st_mtime_ns
            )
        )
    return sorted(found, key=lambda f: (f.date, f.relative))


@dataclass(frozen=True)
class LogSelection:
    files: list[LogFile]  # what to train on, oldest first
    new_files: list[LogFile]
    window_start: datetime
    skipped_old: int  # seen before and older than the window

    def describe(self) -> dict:
        return {
            "files": [f.relative for f in self.files],
            "new_files": [f.relative for f in self.new_files],
            "window_start": self.window_start.isoformat(timespec="seconds"),
            "skipped_old_files": self.skipped_old,
        }


def select_logs(
    logs: Sequence[LogFile], seen: Iterable[str], now: datetime, window_days: float
) -> LogSelection:
    """New files (not in `seen`) plus files dated within `window_days` before `now`."""
    if not window_days > 0:
        raise ValueError(f"window_days must be > 0, got {window_days!r}")
    seen = set(seen)
    start = now - timedelta(days=window_days)
    files, new, old = [], [], 0
    for log in logs:
        is_new = log.identity not in seen
        if is_new:
            new.append(log)
        if is_new or log.date >= start:
            files.append(log)
        else:
            old += 1
    return LogSelection(files, new, start, old)
