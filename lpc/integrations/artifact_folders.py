"""Where an in-process model's artifact is, and whether it changed: what both the access model
(`access_runtime`) and the return-time model (`return_runtime`) reload by.

A configured path is an artifact folder or a registry folder whose `current` link is followed
(`training.model_registry` promotes a version by repointing it). A loaded model remembers the
`ArtifactPointer` it was loaded from; a background thread compares it with the folder's now.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, Protocol, TypeVar

from lpc.integrations.config import PluginConfigError
from lpc.integrations.stats import PluginStats
from predictor.access_features import RequestState, feature
from predictor.artifact import METADATA_FILE, WEIGHTS_FILE
from predictor.errors import UserError

logger = logging.getLogger("vllm.plugins.lpc")
Model = TypeVar("Model")


class FeatureReader(Protocol):
    """A model that reads named access features (the access and the return-time model)."""

    @property
    def feature_names(self) -> Sequence[str]: ...


Predictor = TypeVar("Predictor", bound=FeatureReader)

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


@dataclass
class PromotionWatch:
    """The background reload check both in-process models share: has the configured folder
    moved on from the loaded artifact, and does the new one load? A failure keeps the old
    model, is counted (`failures_counter`) and logged once per state of the folder
    (`failed_pointer`), so a broken promotion is not retried until the folder changes."""

    path: Path  # as configured
    what: str  # "access model", "return-time model": the log lines' subject
    failures_counter: str  # the `PluginStats` counter of failed reloads
    failed_pointer: ArtifactPointer | None = None

    def poll(
        self,
        loaded: ArtifactPointer,
        load: Callable[[str], Model],
        stats: PluginStats,
    ) -> tuple[ArtifactPointer, Model] | None:
        """The newly promoted artifact and its model, or None (unchanged, or it failed)."""
        try:
            pointer = artifact_pointer(self.path)
        except Exception as error:  # gone, or a file where the folder was
            pointer = (str(self.path), UNREADABLE_MTIME, UNREADABLE_MTIME)
            if pointer != self.failed_pointer:
                self._failed(pointer, loaded, error, stats)
            return None
        if pointer == loaded or pointer == self.failed_pointer:
            return None
        try:
            model = load(pointer[0])
        except Exception as error:
            self._failed(pointer, loaded, error, stats)
            return None
        self.failed_pointer = None
        return pointer, model

    def _failed(
        self,
        pointer: ArtifactPointer,
        loaded: ArtifactPointer,
        error: BaseException,
        stats: PluginStats,
    ) -> None:
        self.failed_pointer = pointer
        stats.add(**{self.failures_counter: 1})
        logger.warning(
            "%s %s: cannot load %s, keeping %s (%s)",
            self.what,
            self.path,
            pointer[0],
            loaded[0],
            error,
        )


@dataclass(frozen=True)
class LoadedArtifact(Generic[Predictor]):
    """A loaded in-process model and what the release path needs to know about it, published
    to the release path with one assignment."""

    predictor: Predictor
    pointer: ArtifactPointer
    # Whether it reads a feature whose engine-state form needs token ids (the shared prefix).
    needs_tokens: bool

    @classmethod
    def of(cls, predictor: Predictor, pointer: ArtifactPointer) -> LoadedArtifact[Predictor]:
        needs = any(feature(n).needs_token_ids for n in predictor.feature_names)
        return cls(predictor, pointer, needs)


def load_configured(
    value: str, setting: str, what: str, load: Callable[[str], Predictor]
) -> LoadedArtifact[Predictor]:
    """The model a setting names (an artifact or a registry folder), loaded when the plugin
    starts; anything wrong is one `PluginConfigError` naming the setting, its value and the
    cause (`setting`: "LPC_ACCESS_MODEL (access_model)"; `what`: "an access-only model")."""
    try:
        try:
            pointer = artifact_pointer(Path(value))
        except OSError:  # a missing file: the loader names it as `lpc ab` and `lpc models` do
            load(str(resolve_artifact(Path(value))))
            raise
        return LoadedArtifact.of(load(pointer[0]), pointer)
    except (OSError, UserError, ValueError) as error:
        raise PluginConfigError(
            f"{setting} = {value!r}: cannot load {what} there ({error})"
        ) from None
