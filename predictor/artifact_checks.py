"""The checks every model artifact passes before anything predicts with it, in one place.

Three kinds of artifact ship in `models/` (a text predictor, an access model, a return-time
model) and four places load them: the replay (`lpc ab`), the vLLM plugin, the prediction
server and `lpc models check`. Each loader calls the checks below for the fields its kind
has, so the places agree: an artifact one refuses, all refuse, with the same one line naming
the file and the field. The checks catch what a sha256 cannot (it only proves the weights are
the ones recorded): NaN or infinite statistics and weights, a zero or negative standard
deviation (a division by zero at load), a return grid that does not start at 0 and increase
(NaN compares False, so `diff <= 0` lets a NaN through), and semantics this code does not
implement (`time_origin`, `known_at`).

`check_artifact` tells the kind from `metadata.json` and loads the folder with that kind's
loader, which is what `lpc models check` prints.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

KIND_TEXT = "text predictor"
KIND_ACCESS = "access model"
KIND_RETURN = "return model"
KINDS = (KIND_TEXT, KIND_ACCESS, KIND_RETURN)


def number_problem(value: Any) -> str | None:
    """Why `value` is not a finite number (None: it is). bool is refused: JSON `true` is no
    mean or standard deviation."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"is not a number ({value!r})"
    if not math.isfinite(value):
        return f"is not finite ({value!r})"
    return None


def check_standardisation(name: Any, mean: Any, std: Any) -> None:
    """ValueError naming the input and field unless `mean` is finite and `std` finite and
    > 0 (the loaders divide by it)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"input name must be a non-empty string, got {name!r}")
    for field, value in (("mean", mean), ("std", std)):
        problem = number_problem(value)
        if problem is not None:
            raise ValueError(f"input {name!r}: {field} {problem}")
    if std <= 0:
        raise ValueError(f"input {name!r}: std must be > 0, got {std!r}")


def check_grid(grid_s: Sequence[Any]) -> None:
    """ValueError unless `grid_s` is at least two finite numbers, starting at 0, strictly
    increasing: the points a return curve's survival is given at."""
    values = list(grid_s)
    if len(values) < 2:
        raise ValueError(f"grid_s needs at least 2 points, got {len(values)}")
    for index, value in enumerate(values):
        problem = number_problem(value)
        if problem is not None:
            raise ValueError(f"grid_s[{index}] {problem}")
    if values[0] != 0:
        raise ValueError(f"grid_s must start at 0, got {values[0]!r}")
    for index in range(1, len(values)):
        if not values[index] > values[index - 1]:
            raise ValueError(
                f"grid_s must increase: grid_s[{index}] = {values[index]!r} after "
                f"{values[index - 1]!r}"
            )


def check_choice(field: str, value: Any, supported: Sequence[str]) -> None:
    """ValueError unless `value` is one of the `supported` values of `field`."""
    if value not in supported:
        raise ValueError(
            f"{field} {value!r} is not supported (this code implements "
            f"{', '.join(map(repr, supported))})"
        )


def check_layer_sizes(field: str, sizes: Sequence[Any]) -> None:
    """ValueError unless every entry of `sizes` is a positive integer."""
    for index, size in enumerate(sizes):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"{field}[{index}] must be a positive integer, got {size!r}")


def non_finite_tensor(tensors: dict[str, Any]) -> str | None:
    """The name of the first tensor (numpy array or torch tensor) holding NaN or infinity,
    in name order; None when all are finite."""
    for name in sorted(tensors):
        if not np.isfinite(np.asarray(tensors[name], dtype=np.float64)).all():
            return name
    return None


def check_finite_tensors(folder: Path | str | None, file: str, tensors: dict[str, Any]) -> None:
    """`ArtifactCorruptError` naming the file and tensor when a weight is NaN or infinite
    (it would turn every prediction into NaN, which the fallbacks then hide)."""
    from predictor.artifact import ArtifactCorruptError

    bad = non_finite_tensor(tensors)
    if bad is not None:
        raise ArtifactCorruptError(
            f"artifact {folder}: {file} tensor {bad!r} holds NaN or infinity"
        )


def artifact_kind_of(record: Any) -> str:
    """The kind of artifact a parsed `metadata.json` describes (see `KINDS`): a return-time
    model declares what it predicts; an access model declares inputs without a text window;
    anything else is read as a text predictor (whose loader names what it lacks)."""
    from predictor.return_time import PREDICTS

    if not isinstance(record, dict):
        return KIND_TEXT
    if record.get("predicts") == PREDICTS:
        return KIND_RETURN
    inputs = record.get("inputs")
    if isinstance(inputs, dict) and inputs.get("text_window") is False:
        return KIND_ACCESS
    return KIND_TEXT


def artifact_kind(folder: Path | str) -> str:
    """`artifact_kind_of` the folder's `metadata.json`; the loaders refuse a missing or
    unreadable one, so this reads it leniently (a text predictor by default)."""
    from predictor.artifact import METADATA_FILE

    try:
        record = json.loads((Path(folder) / METADATA_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return KIND_TEXT
    return artifact_kind_of(record)


@dataclass(frozen=True)
class CheckedArtifact:
    """An artifact that passed its kind's loader: what `lpc models check` prints."""

    path: Path
    kind: str
    metadata: dict[str, Any]


def check_artifact(folder: Path | str, expected_embedder_id: str | None = None) -> CheckedArtifact:
    """Load `folder` with its kind's loader (every check that loader makes) and return its
    metadata; raises that loader's one-line `ArtifactError`. A text predictor needs torch;
    the other two kinds load with numpy."""
    from predictor.artifact import EmbedderMismatchError, load_artifact

    folder = Path(folder)
    kind = artifact_kind(folder)
    if kind == KIND_RETURN:
        from predictor.return_time import ReturnTimePredictor

        metadata = ReturnTimePredictor.load(folder).metadata.to_dict()
    elif kind == KIND_ACCESS:
        from predictor.access_predictor import AccessPredictor

        metadata = AccessPredictor.load(folder).metadata.to_dict()
    else:
        metadata = load_artifact(folder, expected_embedder_id).metadata.to_dict()
    if expected_embedder_id is not None:
        declared = metadata.get("embedder_id")
        if declared != expected_embedder_id:
            raise EmbedderMismatchError(
                f"artifact {folder} ({kind}) was trained on embedder {declared!r}, "
                f"not {expected_embedder_id!r}"
            )
    return CheckedArtifact(folder, kind, metadata)
