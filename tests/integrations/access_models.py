"""Registry folders for the access-model tests: copies of the shipped access-only artifact,
optionally with a shifted output bias so the copy predicts differently."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np

SHIPPED = Path(__file__).resolve().parents[2] / "models" / "mooncake-access"


def publish(registry: Path, version: str, bias: float | None = None) -> Path:
    """Copy the shipped artifact as a registry version and point `current` at it; with `bias`,
    change its output bias (and its checksum) so it predicts differently."""
    folder = registry / version
    shutil.copytree(SHIPPED, folder)
    if bias is not None:
        from safetensors.numpy import load_file, save_file

        state = load_file(folder / "model.safetensors")
        last = max(k for k in state if k.endswith(".bias"))
        state[last] = state[last] + np.float32(bias)
        save_file(state, folder / "model.safetensors")
        data = (folder / "model.safetensors").read_bytes()
        meta = json.loads((folder / "metadata.json").read_text())
        meta["weights_sha256"] = hashlib.sha256(data).hexdigest()
        meta["weights_bytes"] = len(data)
        (folder / "metadata.json").write_text(json.dumps(meta))
    link = registry / "current.tmp"
    link.symlink_to(version)
    link.replace(registry / "current")
    return folder
