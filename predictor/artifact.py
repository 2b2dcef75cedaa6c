"""A trained predictor on disk: a folder with `model.safetensors` and `metadata.json`.

The folder is the unit the daily retraining job promotes and the server loads, so two things
matter: a reader must never see a half-written artifact (we write a temporary sibling folder,
fsync, then rename it into place), and a loader must refuse an artifact it cannot use, saying
exactly why (missing file, truncated or corrupt weights, checksum mismatch, unsupported format
version, other embedder, other embedding size) instead of predicting garbage.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from predictor.access_features import FeatureError, check_names
from predictor.artifact_checks import check_standardisation, non_finite_tensor, number_problem
from predictor.atomic_files import write_folder_atomically
from predictor.errors import UserError
from predictor.features import FeatureConfig, FeatureConfigError
from predictor.mlp_config import MLPConfig

if TYPE_CHECKING:
    from predictor.model import ContinuationMLP

ARTIFACT_FORMAT_VERSION = 1
SUPPORTED_FORMAT_VERSIONS = frozenset({1})
WEIGHTS_FILE = "model.safetensors"
METADATA_FILE = "metadata.json"


class ArtifactError(UserError):
    """Base class: the artifact at `path` cannot be used."""


class ArtifactMissingError(ArtifactError, FileNotFoundError):
    """The folder, its weights or its metadata do not exist."""


class ArtifactCorruptError(ArtifactError):
    """Unreadable metadata, truncated or unparsable weights, weights not matching metadata."""


class ArtifactChecksumError(ArtifactCorruptError):
    """The weights' sha256 differs from the one recorded at save time."""


class ArtifactVersionError(ArtifactError):
    """Written in a format version this code does not read."""


class ArtifactIncompatibleError(ArtifactError):
    """A sound artifact that does not fit the embedder it is to be used with."""


class EmbedderMismatchError(ArtifactIncompatibleError):
    """Trained on another embedder's vectors."""


class DimensionMismatchError(ArtifactIncompatibleError):
    """Expects embeddings of another size."""


def check_finite_tensors(folder: Path | str | None, file: str, tensors: dict[str, Any]) -> None:
    """`ArtifactCorruptError` naming the file and tensor when a weight is NaN or infinite
    (it would turn every prediction into NaN, which the fallbacks then hide)."""
    bad = non_finite_tensor(tensors)
    if bad is not None:
        raise ArtifactCorruptError(
            f"artifact {folder}: {file} tensor {bad!r} holds NaN or infinity"
        )


def check_declared_features(metadata: ArtifactMetadata, folder: Path | str | None) -> None:
    """`ArtifactIncompatibleError` unless the feature registry knows every feature the model
    reads and computes it where this kind of model gets its inputs: an engine's state for an
    access-only model, a training sample for a text one (whose served subset the server checks
    separately: `check_servable`)."""
    path = "sample" if metadata.inputs.text_window else "state"
    try:
        check_names(metadata.feature_names, f"artifact {folder}", path)
    except FeatureError as error:
        raise ArtifactIncompatibleError(str(error)) from None


@dataclass(frozen=True)
class AccessInput:
    """One access feature (`predictor.access_features`) and how it is standardised."""

    name: str
    mean: float
    std: float

    def __post_init__(self) -> None:
        try:
            check_standardisation(self.name, self.mean, self.std)
        except ValueError as error:
            raise ValueError(f"inputs.access_features: {error}") from None


@dataclass(frozen=True)
class ArtifactInputs:
    """What a model reads: the text window (embedder + turn count), access features, or both.

    Artifacts written before inputs were declared read the text window only, which is the
    default. An access-only model needs no embedder; `horizon_s` is its label's horizon.
    """

    text_window: bool = True
    access_features: tuple[AccessInput, ...] = ()
    horizon_s: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "access_features", tuple(self.access_features))
        if not self.text_window and not self.access_features:
            raise ValueError("inputs declare neither a text window nor access features")
        names = [f.name for f in self.access_features]
        if len(set(names)) != len(names):
            raise ValueError(f"inputs list an access feature twice: {names}")
        if self.horizon_s is not None:  # the label's horizon, which the plugin's window reads
            problem = number_problem(self.horizon_s)
            if problem is not None or self.horizon_s <= 0:
                raise ValueError(
                    f"inputs.horizon_s must be a finite number of seconds > 0, got "
                    f"{self.horizon_s!r}"
                )

    @property
    def access_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.access_features)

    @property
    def is_default(self) -> bool:
        return self == ArtifactInputs()

    def to_dict(self) -> dict[str, Any]:
        return {
            "text_window": self.text_window,
            "access_features": [dataclasses.asdict(f) for f in self.access_features],
            "horizon_s": self.horizon_s,
        }

    @classmethod
    def from_dict(cls, data: Any) -> ArtifactInputs:
        if not isinstance(data, dict):
            raise ValueError(f"inputs must be an object, got {data!r}")
        features = data.get("access_features", [])
        if not isinstance(features, list) or not all(isinstance(f, dict) for f in features):
            raise ValueError("inputs.access_features must be a list of objects")
        horizon = data.get("horizon_s")
        return cls(
            bool(data.get("text_window", True)),
            tuple(AccessInput(f.get("name"), f.get("mean"), f.get("std")) for f in features),
            None if horizon is None else float(horizon),
        )


@dataclass(frozen=True)
class ArtifactMetadata:
    embedder_id: str
    feature_config: FeatureConfig
    mlp_config: MLPConfig
    base_rate: float  # share of positive labels in the training data
    metrics: dict[str, Any] = field(default_factory=dict)
    training_data_fingerprint: str = ""
    embedder_spec: str = "e5-small-q4"  # how `load_embedder` finds the embedder again
    created_at: str = ""
    notes: dict[str, Any] = field(default_factory=dict)
    inputs: ArtifactInputs = field(default_factory=ArtifactInputs)
    format_version: int = ARTIFACT_FORMAT_VERSION
    weights_sha256: str = ""  # filled in by save_artifact
    weights_bytes: int = 0  # filled in by save_artifact

    def __post_init__(self) -> None:
        if not isinstance(self.embedder_id, str) or not self.embedder_id:
            raise ValueError(
                f"ArtifactMetadata.embedder_id must be a non-empty string, got {self.embedder_id!r}"
            )
        if (
            not isinstance(self.base_rate, int | float)
            or isinstance(self.base_rate, bool)
            or not 0.0 <= float(self.base_rate) <= 1.0
        ):
            raise ValueError(
                f"ArtifactMetadata.base_rate must be a number in [0, 1], got {self.base_rate!r}"
            )
        if not isinstance(self.metrics, dict):
            raise ValueError(f"ArtifactMetadata.metrics must be a dict, got {self.metrics!r}")
        mlp, inputs = self.mlp_config, self.inputs
        if not inputs.text_window and (mlp.embedding_dim or mlp.turn_column):
            raise ValueError(
                "an access-only model (inputs without a text window) must have "
                f"embedding_dim 0 and no turn column, got {mlp}"
            )
        if inputs.text_window and mlp.embedding_dim < 1:
            raise ValueError("inputs declare a text window but the MLP has no embedding input")
        access = inputs.access_names
        if access and mlp.extra_features[-len(access) :] != access:
            raise ValueError(
                f"inputs.access_features {list(access)} must be the MLP's last extra features, "
                f"got {list(mlp.extra_features)}"
            )

    @property
    def input_dim(self) -> int:
        return self.mlp_config.input_dim

    @property
    def feature_names(self) -> tuple[str, ...]:
        """The registered features (`predictor.access_features`) the model reads, in input
        order after any embedding: stored as the MLP's `extra_features`."""
        return self.mlp_config.extra_features

    @property
    def embedding_dim(self) -> int:
        return self.mlp_config.embedding_dim

    def to_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["feature_config"] = self.feature_config.to_dict()
        data["feature_fingerprint"] = self.feature_config.fingerprint()
        data["mlp_config"] = self.mlp_config.to_dict()
        data["input_dim"] = self.input_dim
        if self.inputs.is_default:  # text artifacts keep their original shape
            del data["inputs"]
        else:
            data["inputs"] = self.inputs.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ArtifactMetadata:
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["feature_config"] = FeatureConfig.from_dict(data["feature_config"])
        values["mlp_config"] = MLPConfig.from_dict(data["mlp_config"])
        if "inputs" in data:
            values["inputs"] = ArtifactInputs.from_dict(data["inputs"])
        return cls(**values)


@dataclass(frozen=True)
class ModelArtifact:
    path: Path | None
    metadata: ArtifactMetadata
    model: ContinuationMLP  # in eval mode


def save_artifact(
    folder: Path | str,
    model: ContinuationMLP,
    metadata: ArtifactMetadata,
    overwrite: bool = False,
) -> ArtifactMetadata:
    """Write `model` and `metadata` (checksum and size filled in) to `folder`, atomically.

    An existing folder is an error unless `overwrite`; then it is moved aside and deleted after
    the new one is in place (a concurrent reader may briefly find no folder, never a partial
    one; `predictor.atomic_files`). A failed write raises `OutputWriteError` naming the
    file and leaves no folder. Returns the metadata as written.
    """
    from safetensors.torch import save as save_tensors

    folder = Path(folder)
    if model.config != metadata.mlp_config:
        raise ValueError(f"model config {model.config} differs from metadata {metadata.mlp_config}")
    if folder.exists() and not overwrite:
        raise FileExistsError(f"{folder} exists; pass overwrite=True to replace it")
    state = {name: t.detach().to("cpu").contiguous() for name, t in model.state_dict().items()}
    weights = save_tensors(state, metadata={"format": "pt"})
    metadata = dataclasses.replace(
        metadata,
        format_version=ARTIFACT_FORMAT_VERSION,
        weights_sha256=hashlib.sha256(weights).hexdigest(),
        weights_bytes=len(weights),
        created_at=metadata.created_at or datetime.now(UTC).isoformat(timespec="seconds"),
    )
    try:
        text = json.dumps(metadata.to_dict(), indent=2, sort_keys=True, allow_nan=False)
    except ValueError as error:
        raise ValueError(
            f"metadata is not strict JSON (NaN or infinity in metrics?): {error}"
        ) from error

    write_folder_atomically(
        folder,
        {WEIGHTS_FILE: weights, METADATA_FILE: (text + "\n").encode("utf-8")},
        overwrite=overwrite,
    )
    return metadata


def _read_metadata(folder: Path) -> ArtifactMetadata:
    path = folder / METADATA_FILE
    if not path.is_file():
        raise ArtifactMissingError(f"artifact {folder}: {METADATA_FILE} is missing")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ArtifactCorruptError(
            f"artifact {folder}: {METADATA_FILE} is not valid JSON ({error})"
        ) from error
    if not isinstance(data, dict):
        raise ArtifactCorruptError(f"artifact {folder}: {METADATA_FILE} is not a JSON object")
    version = data.get("format_version")
    if version not in SUPPORTED_FORMAT_VERSIONS:
        raise ArtifactVersionError(
            f"artifact {folder}: format version {version!r} is not supported "
            f"(this code reads {sorted(SUPPORTED_FORMAT_VERSIONS)})"
        )
    try:
        return ArtifactMetadata.from_dict(data)
    except KeyError as error:
        raise ArtifactCorruptError(
            f"artifact {folder}: {METADATA_FILE} lacks field {error.args[0]!r}"
        ) from error
    except (TypeError, ValueError, FeatureConfigError) as error:
        raise ArtifactCorruptError(
            f"artifact {folder}: {METADATA_FILE} is invalid: {error}"
        ) from error


def _read_weights(folder: Path, metadata: ArtifactMetadata) -> bytes:
    path = folder / WEIGHTS_FILE
    if not path.is_file():
        raise ArtifactMissingError(f"artifact {folder}: {WEIGHTS_FILE} is missing")
    weights = path.read_bytes()
    if len(weights) != metadata.weights_bytes:
        raise ArtifactCorruptError(
            f"artifact {folder}: {WEIGHTS_FILE} has {len(weights)} bytes, metadata records "
            f"{metadata.weights_bytes} (truncated or replaced)"
        )
    digest = hashlib.sha256(weights).hexdigest()
    if digest != metadata.weights_sha256:
        raise ArtifactChecksumError(
            f"artifact {folder}: {WEIGHTS_FILE} sha256 {digest[:12]}… differs from the "
            f"recorded {metadata.weights_sha256[:12]}…"
        )
    return weights


def read_metadata(folder: Path | str) -> ArtifactMetadata:
    """The verified metadata alone (e.g. to tell an access-only artifact from a text one)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ArtifactMissingError(f"artifact {folder} does not exist")
    return _read_metadata(folder)


def read_verified(folder: Path | str) -> tuple[ArtifactMetadata, bytes]:
    """Metadata and checksum-verified weight bytes, without torch (the access predictor's
    millisecond load parses the weights with numpy)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ArtifactMissingError(f"artifact {folder} does not exist")
    metadata = _read_metadata(folder)
    return metadata, _read_weights(folder, metadata)


def load_artifact(
    folder: Path | str,
    expected_embedder_id: str | None = None,
    expected_embedding_dim: int | None = None,
) -> ModelArtifact:
    """Load and verify an artifact; raises a subclass of `ArtifactError` naming the problem."""
    from safetensors import SafetensorError
    from safetensors.torch import load as load_tensors

    from predictor.model import ContinuationMLP

    folder = Path(folder)
    if not folder.is_dir():
        raise ArtifactMissingError(f"artifact {folder} does not exist")
    metadata = _read_metadata(folder)
    weights = _read_weights(folder, metadata)
    try:
        state = load_tensors(weights)
    except (SafetensorError, ValueError, RuntimeError) as error:
        raise ArtifactCorruptError(
            f"artifact {folder}: {WEIGHTS_FILE} cannot be parsed ({error})"
        ) from error
    check_finite_tensors(folder, WEIGHTS_FILE, state)
    model = ContinuationMLP(metadata.mlp_config)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as error:
        raise ArtifactCorruptError(
            f"artifact {folder}: weights do not match the recorded MLP "
            f"config {metadata.mlp_config}: {error}"
        ) from error
    model.eval()
    if expected_embedder_id is not None and metadata.embedder_id != expected_embedder_id:
        raise EmbedderMismatchError(
            f"artifact {folder} was trained on embedder {metadata.embedder_id!r}, "
            f"not {expected_embedder_id!r}"
        )
    if expected_embedding_dim is not None and metadata.embedding_dim != expected_embedding_dim:
        raise DimensionMismatchError(
            f"artifact {folder} expects {metadata.embedding_dim}-dim embeddings, the embedder "
            f"gives {expected_embedding_dim}"
        )
    if not math.isfinite(metadata.base_rate):
        raise ArtifactCorruptError(f"artifact {folder}: base_rate is not finite")
    return ModelArtifact(folder, metadata, model)
