"""Where generated model files live by default.

In a checkout that is the git-ignored `models/local/` folder of the repository, so everything an
`lpc` user generates stays beside the code; an installed package without a checkout uses
`~/.cache/lpc/models`. `LPC_MODELS_DIR` overrides both.
"""

from __future__ import annotations

import os
from pathlib import Path

MODELS_DIR_ENV = "LPC_MODELS_DIR"
LOCAL_E5_FOLDER = "multilingual-e5-small-q4"


def repository_root() -> Path | None:
    """The checkout this package runs from, if it runs from one."""
    candidate = Path(__file__).resolve().parents[1]
    pyproject = candidate / "pyproject.toml"
    if pyproject.is_file() and 'name = "lpc"' in pyproject.read_text(encoding="utf-8"):
        return candidate
    return None


def default_models_dir() -> Path:
    """`$LPC_MODELS_DIR`, else `<checkout>/models/local`, else `~/.cache/lpc/models`."""
    override = os.environ.get(MODELS_DIR_ENV)
    if override:
        return Path(override).expanduser()
    root = repository_root()
    if root is not None:
        return root / "models" / "local"
    return Path.home() / ".cache" / "lpc" / "models"


def default_e5_dir() -> Path:
    """The dequantised multilingual-e5-small checkpoint written by `lpc models import-e5`."""
    return default_models_dir() / LOCAL_E5_FOLDER
