"""`ReturnTimePredictor`: access features in, a `ReturnCurve` per release out, in microseconds.

The model is a discrete-time hazard over a log-spaced grid: a small ReLU MLP (or a linear
map) gives one logit per interval, and S(t_k) = ∏_{j<=k} (1 − h_j). An artifact may hold
several members side by side as one wider network, whose curves are averaged. The artifact is
`metadata.json` and `model.safetensors` (numpy-readable; no torch needed).

The hazard, the members and the artifact: docs/design.md, "The return-time model".
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # pandas is imported where a table is read: the engine path needs none
    import pandas as pd

from predictor.access_features import (
    ConversationState,
    FeatureError,
    RequestState,
    check_names,
    feature_frame,
    known_by,
    state_functions,
)
from predictor.access_predictor import mlp_layers
from predictor.artifact import (
    ArtifactCorruptError,
    ArtifactIncompatibleError,
    ArtifactMissingError,
    check_finite_tensors,
)
from predictor.artifact_checks import (
    check_choice,
    check_grid,
    check_layer_sizes,
    check_standardisation,
    non_finite_tensor,
)
from predictor.atomic_files import write_folder_atomically
from predictor.return_curve import (
    ReturnCurve,
    continued_hazard_exponent,
    continued_hazard_exponents,
)

PREDICTS = "return_time_survival"
RETURN_FORMAT_VERSION = 1
METADATA_FILE = "metadata.json"
WEIGHTS_FILE = "model.safetensors"
# What a curve assumes beyond the grid's last point (`ReturnCurve.tail_exponent`): "flat",
# S stays at its last value (nothing more returns); "log-linear", the last interval's hazard
# per log-second goes on (`predictor.return_curve.continued_hazard_exponent`).
TAILS = ("flat", "log-linear")
DEFAULT_TAIL = "flat"
# The semantics this code implements: durations from the request's completion, the curve used
# at its release. An artifact declaring anything else would be read with the wrong clock.
TIME_ORIGINS = ("completion",)
KNOWN_AT = ("release",)


@dataclass(frozen=True)
class ReturnInput:
    """One input feature and the standardisation the model reads it with."""

    name: str
    mean: float
    std: float

    def __post_init__(self) -> None:
        check_standardisation(self.name, self.mean, self.std)  # the predictor divides by std


@dataclass(frozen=True)
class ReturnModelMetadata:
    """What a return-time artifact declares: its target, grid, inputs and layers."""

    grid_s: tuple[float, ...]  # 0 = t_0 < t_1 < … < t_K: one hazard per interval
    inputs: tuple[ReturnInput, ...]
    hidden_sizes: tuple[int, ...]  # of the whole (merged) network
    members: int = 1  # networks side by side; the curve is their average S
    time_origin: str = "completion"  # durations count from this request's completion
    predicts: str = PREDICTS
    known_at: str = "release"
    format_version: int = RETURN_FORMAT_VERSION
    metrics: dict[str, Any] = field(default_factory=dict)
    notes: dict[str, Any] = field(default_factory=dict)
    created_at: str = ""
    weights_sha256: str = ""

    def __post_init__(self) -> None:
        """The shared checks (`predictor.artifact_checks`): a metadata record that exists is
        one every loader and the trainer's writer can use."""
        check_grid(self.grid_s)
        if not self.inputs:
            raise ValueError("inputs: the model reads no input")
        for item in self.inputs:
            if not isinstance(item, ReturnInput):
                raise ValueError(f"inputs: {item!r} is not an input record")
        check_layer_sizes("hidden_sizes", self.hidden_sizes)
        check_layer_sizes("members", (self.members,))
        check_choice("time_origin", self.time_origin, TIME_ORIGINS)
        check_choice("known_at", self.known_at, KNOWN_AT)

    @property
    def feature_names(self) -> tuple[str, ...]:
        return tuple(i.name for i in self.inputs)

    def to_dict(self) -> dict[str, Any]:
        record = asdict(self)
        record["grid_s"] = list(self.grid_s)
        record["hidden_sizes"] = list(self.hidden_sizes)
        record["inputs"] = [asdict(i) for i in self.inputs]
        return record

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> ReturnModelMetadata:
        return cls(
            grid_s=tuple(float(t) for t in record["grid_s"]),
            inputs=tuple(ReturnInput(**i) for i in record["inputs"]),
            hidden_sizes=tuple(int(h) for h in record["hidden_sizes"]),
            members=int(record.get("members", 1)),
            time_origin=record["time_origin"],
            predicts=record["predicts"],
            known_at=record["known_at"],
            format_version=int(record["format_version"]),
            metrics=record.get("metrics", {}),
            notes=record.get("notes", {}),
            created_at=record.get("created_at", ""),
            weights_sha256=record["weights_sha256"],
        )


def survival_from_logits(logits: np.ndarray, members: int = 1) -> np.ndarray:
    """(n, members · K) hazard logits → (n, K + 1) survival at the grid points, S(t_0) = 1,
    the members' average. log(1 − sigmoid(x)) = −softplus(x), computed without overflow."""
    logits = np.asarray(logits, np.float64)
    n = logits.shape[0]
    log_keep = -np.logaddexp(0.0, logits.reshape(n, members, -1))
    survival = np.exp(np.cumsum(log_keep, axis=2)).mean(axis=1)
    return np.concatenate([np.ones((n, 1)), survival], axis=1)


class ReturnTimePredictor:
    """Batched numpy forward pass of a hazard MLP; `curve_one` at an engine's release."""

    def __init__(
        self,
        metadata: ReturnModelMetadata,
        weights: list[np.ndarray],
        biases: list[np.ndarray],
        path: Path | None = None,
        tail: str = DEFAULT_TAIL,
    ) -> None:
        if tail not in TAILS:
            raise ValueError(f"unknown return-curve tail {tail!r}; known: {', '.join(TAILS)}")
        if metadata.predicts != PREDICTS:
            raise ArtifactIncompatibleError(
                f"artifact {path} predicts {metadata.predicts!r}, not {PREDICTS!r}"
            )
        self.metadata = metadata
        self.path = path
        self.tail = tail
        self.grid_s = np.asarray(metadata.grid_s, np.float64)
        try:  # an input no engine state can compute: refused as the access model's are
            self.feature_names = check_names(metadata.feature_names, f"artifact {path}", "state")
        except FeatureError as error:
            raise ArtifactIncompatibleError(str(error)) from None
        with np.errstate(over="ignore"):  # an overflow is what the check below refuses
            self.mean = np.array([i.mean for i in metadata.inputs], np.float32)
            self.scale = np.array([1.0 / i.std for i in metadata.inputs], np.float32)
        if not (np.isfinite(self.mean).all() and np.isfinite(self.scale).all()):
            raise ArtifactCorruptError(
                f"artifact {path}: {METADATA_FILE} field inputs: a mean or 1/std is beyond "
                "float32 (the arithmetic the model computes in)"
            )
        self.weights, self.biases = weights, biases
        check_finite_tensors(path, WEIGHTS_FILE, _layer_tensors(weights, biases))
        self.members = metadata.members
        outputs = self.members * (len(self.grid_s) - 1)
        expected = [len(self.feature_names), *metadata.hidden_sizes, outputs]
        shapes = [w.shape for w in weights]
        if (
            shapes != list(itertools.pairwise(expected))
            or [b.shape[0] for b in biases] != expected[1:]
        ):
            raise ArtifactCorruptError(
                f"artifact {path}: weight shapes {shapes} do not match {expected}"
            )
        self._state_functions = state_functions(self.feature_names)
        self._hidden_weights, self._hidden_biases = weights[:-1], biases[:-1]

    @property
    def known_at(self) -> str:
        return known_by(self.feature_names)

    def logits(self, features: np.ndarray) -> np.ndarray:
        hidden = (np.asarray(features, np.float32) - self.mean) * self.scale
        last = len(self.weights) - 1
        for layer, (weight, bias) in enumerate(zip(self.weights, self.biases, strict=True)):
            hidden = hidden @ weight + bias
            if layer < last:
                hidden = np.maximum(hidden, 0.0)
        return hidden

    def survival(self, features: np.ndarray) -> np.ndarray:
        """(n, k) raw features → (n, K + 1) S at the grid points."""
        x = np.asarray(features, np.float32)
        if x.ndim != 2 or x.shape[1] != len(self.feature_names):
            raise ValueError(f"expected features (n, {len(self.feature_names)}), got {x.shape}")
        return survival_from_logits(self.logits(x), self.members)

    def tail_exponents(self, survival: np.ndarray) -> np.ndarray:
        """Each curve's `tail_exponent` under this predictor's `tail` (see `TAILS`)."""
        if self.tail == "flat":
            return np.zeros(len(survival))
        return continued_hazard_exponents(self.grid_s, survival)

    def curves_of(self, survival: np.ndarray) -> list[ReturnCurve]:
        """`ReturnCurve`s of an (n, K + 1) table of this predictor's survival values, each
        with its tail. exp(−cumulative hazard) on the artifact's checked grid: valid by
        construction."""
        tails = self.tail_exponents(survival).tolist()
        return [
            ReturnCurve.of_valid(self.grid_s, row, beta)
            for row, beta in zip(survival, tails, strict=True)
        ]

    def curves(self, features: np.ndarray) -> list[ReturnCurve]:
        return self.curves_of(self.survival(features))

    def survival_table(self, table: pd.DataFrame) -> np.ndarray:
        """(n, K + 1) S for every request of a request table (`REQUEST_COLUMNS`, arrival
        order), each from what an engine knows at its release: a replay's curve source."""
        return self.survival(feature_frame(table, self.feature_names).to_numpy())

    def state_row(self, request: RequestState, conversation: ConversationState) -> list[float]:
        """One release's raw feature values from the engine's state (a row of `curves`: the
        releases a scheduler step finishes, in one forward pass)."""
        return [f(request, conversation) for f in self._state_functions]

    def curve_one(self, request: RequestState, conversation: ConversationState) -> ReturnCurve:
        """The curve of one release from the engine's state (what runs at every release)."""
        hidden = np.array(self.state_row(request, conversation), np.float32)
        hidden -= self.mean
        hidden *= self.scale
        for weight, bias in zip(self._hidden_weights, self._hidden_biases, strict=True):
            hidden = np.maximum(hidden @ weight + bias, 0.0)
        logits = (hidden @ self.weights[-1] + self.biases[-1]).astype(np.float64)
        survival = np.empty(len(self.grid_s))
        survival[0] = 1.0
        if self.members == 1:
            np.exp(-np.cumsum(np.logaddexp(0.0, logits)), out=survival[1:])
        else:
            log_keep = -np.logaddexp(0.0, logits.reshape(self.members, -1))
            survival[1:] = np.exp(np.cumsum(log_keep, axis=1)).mean(axis=0)
        beta = 0.0 if self.tail == "flat" else continued_hazard_exponent(self.grid_s, survival)
        return ReturnCurve.of_valid(self.grid_s, survival, beta)  # valid by construction

    @classmethod
    def load(cls, folder: Path | str, tail: str = DEFAULT_TAIL) -> ReturnTimePredictor:
        """Load and check (`predictor.artifact_checks`) a return-time artifact; anything
        wrong is one `ArtifactError` line naming the folder, the file and the field."""
        from safetensors import SafetensorError
        from safetensors.numpy import load as load_numpy

        folder = Path(folder)
        metadata = read_return_metadata(folder)
        weights_path = folder / WEIGHTS_FILE
        if not weights_path.is_file():
            raise ArtifactMissingError(f"artifact {folder}: {WEIGHTS_FILE} is missing")
        payload = weights_path.read_bytes()
        digest = hashlib.sha256(payload).hexdigest()
        if digest != metadata.weights_sha256:
            raise ArtifactCorruptError(
                f"artifact {folder}: {WEIGHTS_FILE} sha256 {digest[:12]}… differs from the "
                f"recorded {metadata.weights_sha256[:12]}…"
            )
        try:
            state = load_numpy(payload)
        except (SafetensorError, ValueError) as error:
            raise ArtifactCorruptError(
                f"artifact {folder}: {WEIGHTS_FILE} cannot be parsed ({error})"
            ) from error
        check_finite_tensors(folder, WEIGHTS_FILE, state)
        weights, biases = mlp_layers(folder, state)
        return cls(metadata, weights, biases, folder, tail)


def _layer_tensors(weights: Sequence[np.ndarray], biases: Sequence[np.ndarray]) -> dict:
    """The layers under the names the artifact stores them by (`layers.<i>.weight|bias`)."""
    return {
        **{f"layers.{i}.weight": w for i, w in enumerate(weights)},
        **{f"layers.{i}.bias": b for i, b in enumerate(biases)},
    }


def read_return_metadata(folder: Path | str) -> ReturnModelMetadata:
    """The checked metadata of a return-time artifact (`ReturnModelMetadata.__post_init__`);
    one `ArtifactError` line naming the folder, the file and the field otherwise."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ArtifactMissingError(f"artifact {folder} does not exist")
    if not (folder / METADATA_FILE).is_file():
        raise ArtifactMissingError(f"artifact {folder}: {METADATA_FILE} is missing")
    try:
        record = json.loads((folder / METADATA_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ArtifactCorruptError(
            f"artifact {folder}: {METADATA_FILE} is unreadable ({error})"
        ) from error
    # Checked before the rest is parsed: another kind of artifact (the 180-s classifier, a
    # text model) is refused for what it is, not for the fields it lacks.
    declared = record.get("predicts") if isinstance(record, dict) else None
    if declared != PREDICTS:
        raise ArtifactIncompatibleError(
            f"artifact {folder} declares predicts: {declared!r}, not {PREDICTS!r}: not a "
            "return-time model (lpc train-return)"
        )
    version = record.get("format_version")
    if version != RETURN_FORMAT_VERSION:
        raise ArtifactIncompatibleError(
            f"artifact {folder}: return-model format {version!r}, this version "
            f"reads {RETURN_FORMAT_VERSION}"
        )
    try:
        return ReturnModelMetadata.from_dict(record)
    except KeyError as error:
        raise ArtifactCorruptError(
            f"artifact {folder}: {METADATA_FILE} lacks field {error.args[0]!r}"
        ) from None
    except (ValueError, TypeError) as error:
        raise ArtifactCorruptError(
            f"artifact {folder}: {METADATA_FILE} is invalid: {error}"
        ) from None


def save_return_model(
    folder: Path | str,
    metadata: ReturnModelMetadata,
    weights: Sequence[np.ndarray],
    biases: Sequence[np.ndarray],
) -> ReturnModelMetadata:
    """Write the artifact; `weights` are (in, out) matrices as the predictor multiplies.

    Both files or neither: the folder is staged and renamed into place, replacing an existing
    one (`write_folder_atomically`), so a full disk never leaves weights without metadata; the
    failure is an `OutputWriteError` naming the file.
    """
    from safetensors.numpy import save as save_numpy

    folder = Path(folder)
    bad = non_finite_tensor(_layer_tensors(weights, biases))
    if bad is not None:  # refused before anything is written
        raise ValueError(f"return model for {folder}: tensor {bad!r} holds NaN or infinity")
    tensors: dict[str, np.ndarray] = {}
    for index, (weight, bias) in enumerate(zip(weights, biases, strict=True)):
        tensors[f"layers.{index}.weight"] = np.ascontiguousarray(np.asarray(weight, np.float32).T)
        tensors[f"layers.{index}.bias"] = np.asarray(bias, np.float32)
    payload = save_numpy(tensors)
    stamped = ReturnModelMetadata(
        **{
            **{k: getattr(metadata, k) for k in metadata.__dataclass_fields__},
            "weights_sha256": hashlib.sha256(payload).hexdigest(),
            "created_at": metadata.created_at or datetime.now(UTC).isoformat(timespec="seconds"),
        }
    )
    text = json.dumps(stamped.to_dict(), indent=2, sort_keys=True)
    write_folder_atomically(
        folder, {WEIGHTS_FILE: payload, METADATA_FILE: text.encode("utf-8")}, overwrite=True
    )
    return stamped
