"""The model in service: the slot a reload swaps, and how one batch is predicted.

A retraining job promotes a new artifact without a restart: `POST /v1/reload` loads it
beside the running model (requests keep flowing) and swaps it in between two batches. A text model
trained with extra features is served only if the feature registry (`predictor.access_features`)
computes every one of them from a request's window; otherwise it is refused when the server
starts or the reload is asked for, never per request.

An access-only model (`predictor.access_predictor.AccessPredictor`, no embedder) is served too:
its items carry access feature values instead of a window (rpc_schema.py), and it is answered
in the event loop (a few small matrix products per request), not through the batcher.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from predictor.access_features import check_servable, window_fields, windows_lacking
from predictor.access_predictor import AccessPredictor
from predictor.artifact import load_artifact, read_metadata
from predictor.batching import PredictFn
from predictor.features import ConversationWindow
from predictor.predictor import Predictor
from predictor.rpc_admission import WindowTokenEstimator

ServedModel = Predictor | AccessPredictor
DEFAULT_EMBED_BATCH_SIZE = 8  # a text model reloaded while an access model is in service


def model_kind(model: ServedModel) -> str:
    """ "access" for an access-only model, "text" for a text-window one."""
    return "access" if isinstance(model, AccessPredictor) else "text"


def _estimator(model: ServedModel) -> WindowTokenEstimator | None:
    return None if isinstance(model, AccessPredictor) else WindowTokenEstimator.for_predictor(model)


class ModelSlot:
    """The predictor in service (and the estimator of its windows' cost). Reading `current`
    is atomic; `swap` replaces it for the next batch, so the model changes between batches
    and never inside one."""

    def __init__(self, predictor: ServedModel, artifact_path: Path | None) -> None:
        self._lock = threading.Lock()
        self._predictor = predictor
        self.estimator = _estimator(predictor)  # None for an access-only model
        self.artifact_path = artifact_path
        self.generation = 1

    @property
    def current(self) -> ServedModel:
        return self._predictor

    def swap(self, predictor: ServedModel, artifact_path: Path | None) -> int:
        estimator = _estimator(predictor)
        with self._lock:
            self._predictor = predictor
            self.estimator = estimator
            self.artifact_path = artifact_path
            self.generation += 1
            return self.generation

    def describe(self) -> dict[str, Any]:
        predictor = self._predictor
        access = isinstance(predictor, AccessPredictor)
        metadata = predictor.metadata if access else predictor.artifact.metadata
        return {
            "generation": self.generation,
            "kind": model_kind(predictor),
            "artifact": str(self.artifact_path) if self.artifact_path else None,
            "embedder_id": metadata.embedder_id,
            "weights_sha256": metadata.weights_sha256,
            "base_rate": metadata.base_rate,
            "feature_fingerprint": metadata.feature_config.fingerprint(),
            "created_at": metadata.created_at,
            "extra_features": list(metadata.mlp_config.extra_features),
            # What an access item's `access_features` must hold (empty for a text model).
            "access_features": list(predictor.feature_names) if access else [],
            "known_at": predictor.known_at if access else None,
            # What prompt_tokens must be counted with, for a model that reads them.
            "serving_tokenizer": metadata.notes.get("serving_tokenizer"),
        }


def batch_predict(predictor: ServedModel) -> PredictFn:
    """`predictor.predict` for one batch, tolerant of windows queued for another model.

    Requests are checked against the model in service when they arrive. A model swapped in
    while they wait may need a window field (`prompt_tokens`) some of them lack; rather than
    failing the whole batch (and every other caller in it), those windows get NaN, which the
    endpoint answers with the same 422 an arriving request gets. Rows are independent
    (row-wise MLP), so the others get exactly what `predict` alone gives. Windows still queued
    when an access-only model was swapped in get NaN likewise (it reads no windows)."""
    if isinstance(predictor, AccessPredictor):
        return lambda windows: np.full(len(windows), np.nan)
    fields = window_fields(predictor.extra_features)
    if not fields:
        return predictor.predict

    def predict(windows: Sequence[ConversationWindow]) -> np.ndarray:
        missing = {i for name in fields for i in windows_lacking(windows, name)}
        if not missing:
            return predictor.predict(windows)
        out = np.full(len(windows), np.nan)
        kept = [i for i in range(len(windows)) if i not in missing]
        if kept:
            out[kept] = predictor.predict([windows[i] for i in kept])
        return out

    return predict


def load_served_model(path: Path) -> AccessPredictor | None:
    """The `AccessPredictor` of an access-only artifact, or None for a text-window one (whose
    embedder the caller loads); raises `ArtifactError` for a missing or corrupt artifact."""
    if read_metadata(path).inputs.text_window:
        return None
    return AccessPredictor.load(path)


def load_for_reload(path: Path, current: ServedModel) -> ServedModel:
    """The model of a promoted artifact: an `AccessPredictor` for an access-only one (no
    embedder), else a text `Predictor` reusing the running embedder when it matches (and
    refusing an artifact the server cannot serve before loading any embedder for it)."""
    access = load_served_model(path)
    if access is not None:
        return access
    artifact = load_artifact(path)
    check_servable(artifact.metadata.mlp_config.extra_features, f"artifact {path}")
    if isinstance(current, AccessPredictor):
        return Predictor.load(path, embed_batch_size=DEFAULT_EMBED_BATCH_SIZE)
    if artifact.metadata.embedder_id == current.embedder_id:
        return Predictor(artifact, current.embedder, current.embed_batch_size)
    return Predictor.load(path, embed_batch_size=current.embed_batch_size)
