"""A versioned model registry: numbered artifact folders and an atomically switched `current`.

Versions (`v0001/`, …) are never modified once published; `current` is a relative symbolic
link to the version in service, so repointing it is how a model is promoted; `history.jsonl`,
`state.json` and `.lock` hold the runs, the job's memory and its lock. Every write is atomic:
a process killed at any point leaves the previous `current` intact.

The layout and how each write is made atomic: docs/design.md, "The model registry".
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from predictor.artifact import ArtifactMetadata, load_artifact, save_artifact
from predictor.atomic_files import fsync_folder, write_text_atomically
from predictor.errors import UserError
from predictor.model import ContinuationMLP

VERSION_PATTERN = re.compile(r"^v(\d{4,})$")
CURRENT = "current"
HISTORY = "history.jsonl"
STATE = "state.json"
LOCK = ".lock"
STAGING_PREFIX = ".incoming-"


class RegistryError(UserError, RuntimeError):
    """The registry cannot do what was asked (bad folder, unknown version, …)."""


class RegistryLockedError(RegistryError):
    """Another process holds the registry's lock (a daily job is running)."""


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def registry_record(notes: dict[str, Any] | None) -> dict[str, Any]:
    """What a version's `notes.registry` holds: when it was published, and the caller's
    notes (the daily job's decision and why)."""
    return {"published_at": now_iso(), **(notes or {})}


class ModelRegistry:
    """A registry of one kind of artifact. `check` loads a version before `current` may
    point at it (default: a continuation or access predictor, `load_artifact`; the daily
    job's return-time registry passes the return model's loader)."""

    def __init__(self, root: Path | str, check: Callable[[Path], Any] = load_artifact) -> None:
        self.root = Path(root)
        self.check = check

    # --- reading ------------------------------------------------------------------------
    def versions(self) -> list[str]:
        """Published versions, oldest first."""
        if not self.root.is_dir():
            return []
        found = [
            (int(m.group(1)), p.name)
            for p in self.root.iterdir()
            if p.is_dir() and not p.is_symlink() and (m := VERSION_PATTERN.match(p.name))
        ]
        return [name for _, name in sorted(found)]

    def path_of(self, version: str) -> Path:
        if not VERSION_PATTERN.match(version):
            raise RegistryError(f"{version!r} is not a version name (v0001, v0002, …)")
        path = self.root / version
        if not path.is_dir():
            raise RegistryError(f"registry {self.root} has no version {version}")
        return path

    @property
    def current_link(self) -> Path:
        return self.root / CURRENT

    def current_version(self) -> str | None:
        link = self.current_link
        if not link.is_symlink():
            return None
        target = os.readlink(link)
        name = Path(target).name
        return name if VERSION_PATTERN.match(name) else None

    def current_path(self) -> Path | None:
        """The folder `current` points to (None when nothing was promoted yet)."""
        version = self.current_version()
        return self.root / version if version is not None else None

    def history(self) -> list[dict[str, Any]]:
        path = self.root / HISTORY
        if not path.is_file():
            return []
        return [
            json.loads(line)
            for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip()
        ]

    def state(self) -> dict[str, Any]:
        path = self.root / STATE
        if not path.is_file():
            return {}
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as error:
            raise RegistryError(f"{path} is not valid JSON ({error})") from error
        return data if isinstance(data, dict) else {}

    # --- writing ------------------------------------------------------------------------
    def ensure(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)

    def clean_staging(self) -> list[str]:
        """Remove staging folders left by killed runs (call under the lock)."""
        removed = []
        if self.root.is_dir():
            for path in self.root.iterdir():
                # save_artifact's own temporary folders are named ".<staging name>.tmp-*"
                if path.name.startswith(
                    (
                        STAGING_PREFIX,
                        f".{STAGING_PREFIX}",
                        f".{CURRENT}.",
                        f".{HISTORY}.",
                        f".{STATE}.",
                    )
                ):
                    if path.is_dir() and not path.is_symlink():
                        shutil.rmtree(path, ignore_errors=True)
                    else:
                        path.unlink(missing_ok=True)
                    removed.append(path.name)
        return removed

    def next_version(self) -> str:
        versions = self.versions()
        number = int(VERSION_PATTERN.match(versions[-1]).group(1)) + 1 if versions else 1
        return f"v{number:04d}"

    def publish(
        self,
        model: ContinuationMLP,
        metadata: ArtifactMetadata,
        registry_notes: dict[str, Any] | None = None,
    ) -> str:
        """Save a new version (never visible half-written) and return its name."""
        notes = dict(metadata.notes)
        notes["registry"] = registry_record(registry_notes)
        return self.publish_folder(
            lambda staging: save_artifact(staging, model, replace(metadata, notes=notes))
        )

    def publish_folder(self, write: Callable[[Path], Any]) -> str:
        """Publish what `write(folder)` writes (any artifact kind) as a new version: written
        into a hidden staging folder, its files synced, then renamed to the version name in
        one step, so a reader never sees it half-written and a killed run leaves only the
        staging folder (removed by `clean_staging`)."""
        self.ensure()
        staging = self.root / f"{STAGING_PREFIX}{os.getpid()}-{time.time_ns()}"
        write(staging)
        for path in staging.rglob("*"):
            if path.is_file():
                with path.open("rb") as handle:
                    os.fsync(handle.fileno())
        fsync_folder(staging)
        for _ in range(100):
            version = self.next_version()
            try:
                os.rename(staging, self.root / version)  # fails if the name was taken
            except OSError:
                if (self.root / version).exists():
                    continue
                raise
            fsync_folder(self.root)
            return version
        raise RegistryError(f"could not find a free version name in {self.root}")

    def promote(self, version: str) -> None:
        """Point `current` at `version` (atomic: a reader sees the old or the new target)."""
        path = self.path_of(version)
        self.check(path)  # never point at something that does not load
        temporary = self.root / f".{CURRENT}.tmp-{os.getpid()}-{time.time_ns()}"
        os.symlink(version, temporary)
        os.replace(temporary, self.current_link)
        fsync_folder(self.root)

    def append_history(self, entry: dict[str, Any]) -> None:
        self.ensure()
        lines = [json.dumps(e, sort_keys=True) for e in self.history()]
        lines.append(json.dumps({"at": now_iso(), **entry}, sort_keys=True, allow_nan=False))
        write_text_atomically(self.root / HISTORY, "\n".join(lines) + "\n")

    def save_state(self, state: dict[str, Any]) -> None:
        self.ensure()
        write_text_atomically(self.root / STATE, json.dumps(state, indent=2, sort_keys=True) + "\n")

    def prune(self, keep: int) -> list[str]:
        """Delete all but the newest `keep` versions, never the current one."""
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        current = self.current_version()
        versions = self.versions()
        doomed = [v for v in versions[:-keep] if v != current]
        for version in doomed:
            retired = self.root / f"{STAGING_PREFIX}retired-{version}-{time.time_ns()}"
            os.rename(self.root / version, retired)  # disappears atomically, then deleted
            shutil.rmtree(retired, ignore_errors=True)
        return doomed

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Exclusive, non-blocking: raises `RegistryLockedError` when another run holds it.
        The kernel releases the lock when the holder dies, so a killed run never blocks."""
        try:
            self.ensure()
            handle = (self.root / LOCK).open("a+")
        except OSError as error:  # a read-only or foreign folder: one line naming the file
            where = error.filename or self.root / LOCK
            raise RegistryError(
                f"registry {self.root} cannot be locked: cannot write {where}: "
                f"{error.strerror or error} (errno {error.errno})"
            ) from None
        try:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.seek(0)
                holder = handle.read().strip()
                raise RegistryLockedError(
                    f"registry {self.root} is locked by another run ({holder or 'unknown'})"
                ) from None
            handle.seek(0)
            handle.truncate()
            handle.write(f"pid {os.getpid()} since {now_iso()}\n")
            handle.flush()
            yield
        finally:
            handle.close()
