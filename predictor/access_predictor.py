"""`AccessPredictor`: access features in, continuation probabilities out, no embedder.

An access-only artifact (`ArtifactInputs` without a text window) is a few kilobytes of MLP
weights and the mean and standard deviation of each input; the forward pass is a handful of
small numpy matrix products, batched, so a prediction costs microseconds in the caller's own
process and no RPC is needed. The weights are parsed with numpy (safetensors), never torch.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

from predictor.access_features import (
    ConversationState,
    RequestState,
    feature_frame,
    feature_row,
    known_by,
    state_functions,
)
from predictor.artifact import (
    ArtifactCorruptError,
    ArtifactIncompatibleError,
    ArtifactMetadata,
    check_declared_features,
    read_verified,
)

_LAYER_KEY = re.compile(r"^layers\.(\d+)\.(weight|bias)$")


def _layers(
    folder: Path, state: dict[str, np.ndarray]
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(in, out) weight matrices and biases of the MLP's linear layers, in order."""
    by_index: dict[int, dict[str, np.ndarray]] = {}
    for key, value in state.items():
        match = _LAYER_KEY.match(key)
        if match is None:
            raise ArtifactCorruptError(f"artifact {folder}: unexpected tensor {key!r}")
        by_index.setdefault(int(match.group(1)), {})[match.group(2)] = value
    weights, biases = [], []
    for index in sorted(by_index):
        layer = by_index[index]
        if set(layer) != {"weight", "bias"}:
            raise ArtifactCorruptError(f"artifact {folder}: layer {index} lacks weight or bias")
        weights.append(np.ascontiguousarray(layer["weight"].T, dtype=np.float32))
        biases.append(np.asarray(layer["bias"], dtype=np.float32))
    return weights, biases


class AccessPredictor:
    """Batched numpy forward pass of an access-only model (ReLU MLP, one logit).

    The matrices are small (192×192 at most for the shipped ensemble): a process that also
    runs large matrix products should let this one use a single BLAS thread
    (`threadpoolctl.threadpool_limits(1)` or OPENBLAS_NUM_THREADS=1); with several threads on
    a busy machine the threads' hand-offs cost more than the arithmetic (docs/results.md,
    "Real traffic")."""

    def __init__(
        self,
        metadata: ArtifactMetadata,
        weights: list[np.ndarray],
        biases: list[np.ndarray],
        path: Path | None = None,
    ) -> None:
        inputs = metadata.inputs
        self.path = path
        self.metadata = metadata
        self.feature_names = inputs.access_names
        self.mean = np.array([f.mean for f in inputs.access_features], dtype=np.float32)
        self.scale = np.array([1.0 / f.std for f in inputs.access_features], dtype=np.float32)
        self.weights, self.biases = weights, biases
        self._state_functions = state_functions(self.feature_names)
        expected = [len(self.feature_names), *metadata.mlp_config.hidden_sizes, 1]
        shapes = [w.shape for w in weights]
        if (
            shapes != list(itertools.pairwise(expected))
            or [b.shape[0] for b in biases] != expected[1:]
        ):
            raise ArtifactCorruptError(
                f"artifact {path}: weight shapes {shapes} do not match the recorded "
                f"{len(self.feature_names)} inputs and hidden sizes {expected[1:-1]}"
            )

    @classmethod
    def load(cls, folder: Path | str) -> AccessPredictor:
        """Load and verify an access-only artifact (milliseconds: no torch, no embedder)."""
        from safetensors import SafetensorError
        from safetensors.numpy import load as load_numpy

        folder = Path(folder)
        metadata, payload = read_verified(folder)
        inputs = metadata.inputs
        if inputs.text_window:
            raise ArtifactIncompatibleError(
                f"artifact {folder} reads a text window (embedder {metadata.embedder_id!r}): "
                "it is not an access-only model"
            )
        check_declared_features(metadata, folder)
        try:
            state = load_numpy(payload)
        except (SafetensorError, ValueError) as error:
            raise ArtifactCorruptError(
                f"artifact {folder}: weights cannot be parsed ({error})"
            ) from error
        weights, biases = _layers(folder, state)
        return cls(metadata, weights, biases, folder)

    @property
    def known_at(self) -> str:
        """When all of the model's inputs are known to an engine."""
        return known_by(self.feature_names)

    @property
    def horizon_s(self) -> float | None:
        return self.metadata.inputs.horizon_s

    def logits(self, features: np.ndarray) -> np.ndarray:
        """(n, k) raw feature values (columns in `feature_names` order) → (n,) logits."""
        x = np.asarray(features, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != len(self.feature_names):
            raise ValueError(
                f"expected features of shape (n, {len(self.feature_names)}), got {x.shape}"
            )
        return self._forward(x)[:, 0]

    def _forward(self, x: np.ndarray) -> np.ndarray:
        """(n, k) float32 raw features → (n, 1) logits: standardise, then the layers."""
        hidden = (x - self.mean) * self.scale
        last = len(self.weights) - 1
        for layer, (weight, bias) in enumerate(zip(self.weights, self.biases, strict=True)):
            hidden = hidden @ weight
            hidden += bias
            if layer < last:
                np.maximum(hidden, 0.0, out=hidden)
        return hidden

    def predict(self, features: np.ndarray) -> np.ndarray:
        """Probabilities (float64) in float32 arithmetic, like the torch model it was
        trained as."""
        logits = self.logits(features).astype(np.float64)
        return 1.0 / (1.0 + np.exp(-logits))

    def predict_table(self, table: pd.DataFrame) -> np.ndarray:
        """Probabilities for every request of a request table (`REQUEST_COLUMNS`)."""
        return self.predict(feature_frame(table, self.feature_names).to_numpy())

    def predict_one(self, request: RequestState, conversation: ConversationState) -> float:
        """One request from an engine's state (no table): the same arithmetic as `logits`
        and `predict` on one row, without their shape checks and array conversions (this
        runs at every release of a serving engine)."""
        row = np.array([[f(request, conversation) for f in self._state_functions]], np.float32)
        logit = np.float64(self._forward(row)[0, 0])  # the sigmoid of `predict`, bit for bit
        return float(1.0 / (1.0 + np.exp(-logit)))

    def feature_matrix(
        self, states: Sequence[tuple[RequestState, ConversationState]]
    ) -> np.ndarray:
        return np.array([feature_row(self.feature_names, r, c) for r, c in states])
