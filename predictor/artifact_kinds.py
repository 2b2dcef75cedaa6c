"""Which kind of model artifact a folder holds, and its check with that kind's loader.

Three kinds ship in `models/`: a text predictor (`load_artifact`), an access model
(`AccessPredictor.load`) and a return-time model (`ReturnTimePredictor.load`). Each loader
makes every check of `predictor.artifact_checks` for the fields its kind has; `check_artifact`
picks the loader from `metadata.json`, which is what `lpc models check` runs, so it agrees
with the replay and the vLLM plugin on every artifact.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from predictor.artifact import METADATA_FILE, EmbedderMismatchError, load_artifact
from predictor.return_time import PREDICTS

KIND_TEXT = "text predictor"
KIND_ACCESS = "access model"
KIND_RETURN = "return model"
KINDS = (KIND_TEXT, KIND_ACCESS, KIND_RETURN)


def artifact_kind_of(record: Any) -> str:
    """The kind of artifact a parsed `metadata.json` describes (see `KINDS`): a return-time
    model declares what it predicts; an access model declares inputs without a text window;
    anything else is read as a text predictor (whose loader names what it lacks)."""
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
