"""Default folders for what training generates: the embedding cache and the model registry.

Both are git-ignored when running from a checkout. The cache folder follows the same rule as
`lpc`'s token cache (`$LPC_CACHE_DIR`, else `<checkout>/.cache/lpc`, else `~/.cache/lpc`), so
one variable moves every cache; the registry lives beside the other generated models
(`predictor.locations.default_models_dir()`, i.e. `models/local/registry`).
"""

from __future__ import annotations

import os
from pathlib import Path

from predictor.locations import default_models_dir, repository_root

CACHE_DIR_ENV = "LPC_CACHE_DIR"
REGISTRY_DIR_ENV = "LPC_REGISTRY_DIR"
RETURN_REGISTRY_DIR_ENV = "LPC_RETURN_REGISTRY_DIR"
SHIPPED_MODEL_NAME = "sharegpt-e5-small-q4"
SHIPPED_ACCESS_MODEL_NAME = "mooncake-access"
SHIPPED_RETURN_MODEL_NAME = "mooncake-return"  # the return-time model (`lpc train-return`)


def default_cache_dir() -> Path:
    """`$LPC_CACHE_DIR`, else the checkout's `.cache/lpc`, else `~/.cache/lpc`."""
    override = os.environ.get(CACHE_DIR_ENV)
    if override:
        return Path(override).expanduser()
    root = repository_root()
    if root is not None:
        return root / ".cache" / "lpc"
    return Path.home() / ".cache" / "lpc"


def default_embedding_cache_dir() -> Path:
    return default_cache_dir() / "embeddings"


def default_registry_dir() -> Path:
    """`$LPC_REGISTRY_DIR`, else `<models dir>/registry` (git-ignored `models/local/registry`)."""
    override = os.environ.get(REGISTRY_DIR_ENV)
    if override:
        return Path(override).expanduser()
    return default_models_dir() / "registry"


def default_return_registry_dir(access_registry: Path) -> Path:
    """`$LPC_RETURN_REGISTRY_DIR`, else the access registry's sibling `<registry>-return`
    (`models/local/registry-return` by default). Derived from the access registry, not fixed,
    so the two registries of one daily job stay side by side: a job run on a scratch
    registry never touches the served return model."""
    override = os.environ.get(RETURN_REGISTRY_DIR_ENV)
    if override:
        return Path(override).expanduser()
    access_registry = Path(access_registry)
    return access_registry.with_name(f"{access_registry.name}-return")


def shipped_model_dir(name: str = SHIPPED_MODEL_NAME) -> Path | None:
    """A predictor committed with the code (default `models/sharegpt-e5-small-q4`; the
    access-only `models/mooncake-access` for traces), if present."""
    root = repository_root()
    if root is None:
        return None
    folder = root / "models" / name
    return folder if (folder / "metadata.json").is_file() else None
