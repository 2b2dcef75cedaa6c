"""Damaged copies of the shipped artifacts, written past the project's writers (which refuse
them): a metadata field replaced, a tensor filled with NaN, the weights file removed. The
checksum and size are re-recorded, so only the damage itself is left for a loader to find."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

REPOSITORY = Path(__file__).resolve().parents[2]
MODELS = REPOSITORY / "models"
SHIPPED_RETURN = MODELS / "mooncake-return"
SHIPPED_ACCESS = MODELS / "mooncake-access"
SHIPPED_TEXT = MODELS / "sharegpt-e5-small-q4"


def damaged_copy(
    source: Path,
    folder: Path,
    record: Callable[[dict[str, Any]], None] | None = None,
    tensor: str | None = None,
    value: float = float("nan"),
    drop_weights: bool = False,
) -> Path:
    """`source` copied to `folder`; `record` edits the parsed metadata.json in place;
    `tensor` (a name, or "last" for the last one in name order) is filled with `value`, the
    weights rewritten and their sha256 and size recorded; `drop_weights` removes them."""
    shutil.copytree(source, folder)
    metadata_path, weights_path = folder / "metadata.json", folder / "model.safetensors"
    data = json.loads(metadata_path.read_text())
    if tensor is not None:
        from safetensors.numpy import load, save

        tensors = dict(load(weights_path.read_bytes()))
        name = sorted(tensors)[-1] if tensor == "last" else tensor
        tensors[name] = np.full_like(tensors[name], value)
        payload = save(tensors)
        weights_path.write_bytes(payload)
        data["weights_sha256"] = hashlib.sha256(payload).hexdigest()
        if "weights_bytes" in data:
            data["weights_bytes"] = len(payload)
    if record is not None:
        record(data)
    metadata_path.write_text(json.dumps(data))
    if drop_weights:
        weights_path.unlink()
    return folder


def setter(*path: Any, value: Any) -> Callable[[dict[str, Any]], None]:
    """A `record` edit that sets the item at `path` (keys and indices) to `value`."""

    def edit(data: dict[str, Any]) -> None:
        target: Any = data
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return edit
