"""Where an in-process model's artifact is, and whether it changed: what both the access model
(`access_runtime`) and the return-time model (`return_runtime`) reload by.

A configured path is an artifact folder or a registry folder whose `current` link is followed
(`training.registry` promotes a version by repointing it). A loaded model remembers the
`ArtifactPointer` it was loaded from; a background thread compares it with the folder's now.
"""

from __future__ import annotations

from pathlib import Path

from predictor.access_features import RequestState
from predictor.artifact import METADATA_FILE, WEIGHTS_FILE

# (resolved folder, metadata mtime in ns, weights mtime in ns): a change of either file, e.g.
# a folder overwritten in place, is looked at (and a half-copied one retried once complete).
ArtifactPointer = tuple[str, int, int]
UNREADABLE_MTIME = -1  # an ArtifactPointer's mtimes when the configured path cannot be read
# A request and conversation every model must give a sound answer for (a probability, a
# survival curve), probed when a model is loaded.
PROBE_REQUEST = RequestState(0.0, 1000, 0, 100, 10.0)


def resolve_artifact(path: Path) -> Path:
    """The artifact folder `path` names: a registry's `current`, or `path` itself."""
    current = path / "current"
    if current.is_symlink() or (current.is_dir() and not (path / METADATA_FILE).exists()):
        return current.resolve()
    return path.resolve()


def artifact_pointer(path: Path) -> ArtifactPointer:
    folder = resolve_artifact(path)
    metadata_ns = (folder / METADATA_FILE).stat().st_mtime_ns
    return str(folder), metadata_ns, (folder / WEIGHTS_FILE).stat().st_mtime_ns
