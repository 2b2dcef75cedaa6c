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
    WEIGHTS_FILE,
    ArtifactCorruptError,
    ArtifactIncompatibleError,
    ArtifactMetadata,
    check_declared_features,
    check_finite_tensors,
    read_verified,
)

_LAYER_KEY = re.compile(r"^layers\.(\d+)\.(weight|bias)$")


def mlp_layers(
    folder: Path, state: dict[str, np.ndarray]
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(in, out) weight matrices and biases of the MLP's linear layers, in order (the access
    and return-time artifacts store their MLPs alike)."""
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
        if not all(np.isfinite(a).all() for a in [self.mean, self.scale, *weights, *biases]):
            raise ArtifactCorruptError(
                f"artifact {path}: a weight, an input mean or an input 1/std is not a finite "
                "float32 (the arithmetic the model computes in)"
            )
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
        check_finite_tensors(folder, WEIGHTS_FILE, state)
        weights, biases = mlp_layers(folder, state)
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
        return self._forward(self._matrix(features))[:, 0]

    def _matrix(self, features: np.ndarray) -> np.ndarray:
        x = np.asarray(features, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != len(self.feature_names):
            raise ValueError(
                f"expected features of shape (n, {len(self.feature_names)}), got {x.shape}"
            )
        return x

    def _forward(self, x: np.ndarray, in_range: np.ndarray | None = None) -> np.ndarray:
        """(n, k) float32 raw features → (n, 1) logits: standardise, then the layers. With
        `in_range` ((n,) bool), clear the rows whose arithmetic leaves float32's range at any
        step: the standardised input or a layer's output, checked before its ReLU (which
        would turn a -inf into 0). inf and NaN propagate through the products, so a row that
        passes every check never overflowed."""
        hidden = (x - self.mean) * self.scale
        if in_range is not None:
            in_range &= np.isfinite(hidden).all(axis=1)
        last = len(self.weights) - 1
        for layer, (weight, bias) in enumerate(zip(self.weights, self.biases, strict=True)):
            hidden = hidden @ weight
            hidden += bias
            if in_range is not None:
                in_range &= np.isfinite(hidden).all(axis=1)
            if layer < last:
                np.maximum(hidden, 0.0, out=hidden)
        return hidden

    def predict(self, features: np.ndarray) -> np.ndarray:
        """Probabilities (float64) in float32 arithmetic, like the torch model it was
        trained as."""
        logits = self.logits(features).astype(np.float64)
        return 1.0 / (1.0 + np.exp(-logits))

    def predict_checked(self, features: np.ndarray) -> np.ndarray:
        """`predict`, bit for bit, except that a row the float32 arithmetic overflows on (a
        raw value beyond float32, or one so far out that its standardised value or a layer's
        output is) gets NaN, where `predict` gives NaN or, when the infinities happen not to
        meet, a 0 or 1 computed from them. No warning is issued for the overflow."""
        with np.errstate(over="ignore", invalid="ignore"):
            x = self._matrix(features)
            in_range = np.ones(x.shape[0], dtype=bool)
            logits = self._forward(x, in_range)[:, 0].astype(np.float64)
            probabilities = 1.0 / (1.0 + np.exp(-logits))  # exp(1e38) = inf: saturates to 0
        probabilities[~in_range] = np.nan
        return probabilities

    def standardised(self, features: np.ndarray) -> np.ndarray:
        """(n, k) raw feature values → the model's float32 standardised inputs (inf where a
        value, or its distance from the training mean in standard deviations, is beyond
        float32)."""
        with np.errstate(over="ignore", invalid="ignore"):
            return (self._matrix(features) - self.mean) * self.scale

    def predict_table(self, table: pd.DataFrame) -> np.ndarray:
        """Probabilities for every request of a request table (`REQUEST_COLUMNS`)."""
        return self.predict(feature_frame(table, self.feature_names).to_numpy())

    def predict_one(self, request: RequestState, conversation: ConversationState) -> float:
        """One request from an engine's state (no table): the same arithmetic as `logits`
        and `predict` on one row, without their shape checks and array conversions (a
        serving engine's release scored alone)."""
        row = np.array([self.state_row(request, conversation)], np.float32)
        logit = np.float64(self._forward(row)[0, 0])  # the sigmoid of `predict`, bit for bit
        return float(1.0 / (1.0 + np.exp(-logit)))

    def state_row(self, request: RequestState, conversation: ConversationState) -> list[float]:
        """One request's raw feature values from an engine's state (`predict_rows`' input)."""
        return [f(request, conversation) for f in self._state_functions]

    def predict_rows(self, rows: Sequence[Sequence[float]]) -> list[float]:
        """p of several requests' `state_row`s in one forward pass (the requests a scheduler
        step finishes). One row gives `predict_one`'s p bit for bit; with more, each p may
        differ from its `predict_one` in float32 rounding (the matrix product's summation
        order), as `predict` on a table does."""
        logits = self._forward(np.array(rows, np.float32))[:, 0].astype(np.float64)
        return [float(1.0 / (1.0 + np.exp(-logit))) for logit in logits]

    def feature_matrix(
        self, states: Sequence[tuple[RequestState, ConversationState]]
    ) -> np.ndarray:
        return np.array([feature_row(self.feature_names, r, c) for r, c in states])
