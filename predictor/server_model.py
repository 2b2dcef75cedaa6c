"""The model in service: the slot a reload swaps, and how one batch is predicted.

A retraining job promotes a new artifact without a restart: `POST /v1/reload` loads it
beside the running model (requests keep flowing) and swaps it in between two batches. A model
trained with finish features is served only if every one of them can be computed from the
request (`predictor.request_features`); otherwise it is refused when the server starts or the
reload is asked for, never per request.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from predictor.admission import WindowTokenEstimator
from predictor.artifact import load_artifact
from predictor.batching import PredictFn
from predictor.features import ConversationWindow
from predictor.predictor import Predictor
from predictor.request_features import check_servable, windows_without_prompt_tokens


class ModelSlot:
    """The predictor in service (and the estimator of its windows' cost). Reading `current`
    is atomic; `swap` replaces it for the next batch, so the model changes between batches
    and never inside one."""

    def __init__(self, predictor: Predictor, artifact_path: Path | None) -> None:
        self._lock = threading.Lock()
        self._predictor = predictor
        self.estimator = WindowTokenEstimator.for_predictor(predictor)
        self.artifact_path = artifact_path
        self.generation = 1

    @property
    def current(self) -> Predictor:
        return self._predictor

    def swap(self, predictor: Predictor, artifact_path: Path | None) -> int:
        estimator = WindowTokenEstimator.for_predictor(predictor)
        with self._lock:
            self._predictor = predictor
            self.estimator = estimator
            self.artifact_path = artifact_path
            self.generation += 1
            return self.generation

    def describe(self) -> dict[str, Any]:
        predictor = self._predictor
        metadata = predictor.artifact.metadata
        return {
            "generation": self.generation,
            "artifact": str(self.artifact_path) if self.artifact_path else None,
            "embedder_id": predictor.embedder_id,
            "weights_sha256": metadata.weights_sha256,
            "base_rate": metadata.base_rate,
            "feature_fingerprint": metadata.feature_config.fingerprint(),
            "created_at": metadata.created_at,
            "extra_features": list(predictor.extra_features),
            # What prompt_tokens must be counted with, for a model that reads them.
            "serving_tokenizer": metadata.notes.get("serving_tokenizer"),
        }


def batch_predict(predictor: Predictor) -> PredictFn:
    """`predictor.predict` for one batch, tolerant of windows queued for another model.

    Requests are checked against the model in service when they arrive. A model swapped in
    while they wait may need `prompt_tokens` some of them lack; rather than failing the whole
    batch (and every other caller in it), those windows get NaN, which the endpoint answers
    with the same 422 an arriving request gets. Rows are independent (row-wise MLP), so the
    others get exactly what `predict` alone gives."""
    if not predictor.needs_prompt_tokens:
        return predictor.predict

    def predict(windows: Sequence[ConversationWindow]) -> np.ndarray:
        missing = set(windows_without_prompt_tokens(windows))
        if not missing:
            return predictor.predict(windows)
        out = np.full(len(windows), np.nan)
        kept = [i for i in range(len(windows)) if i not in missing]
        if kept:
            out[kept] = predictor.predict([windows[i] for i in kept])
        return out

    return predict


def load_for_reload(path: Path, current: Predictor) -> Predictor:
    """The predictor for a promoted artifact, reusing the running embedder when it matches
    (and refusing an artifact the server cannot serve before loading any embedder for it)."""
    artifact = load_artifact(path)
    check_servable(artifact.metadata.mlp_config.extra_features, f"artifact {path}")
    if artifact.metadata.embedder_id == current.embedder_id:
        return Predictor(artifact, current.embedder, current.embed_batch_size)
    return Predictor.load(path, embed_batch_size=current.embed_batch_size)
