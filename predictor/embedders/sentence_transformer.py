"""Embedder over any sentence-transformers model: a hub id or a local folder.

This is the engine for the paper's multilingual-e5-small (hub id, or the offline dequantised
import), and for any other sentence-transformers model used in ablations or tests.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from predictor.embedders.base import QUERY_PREFIX, FastTokenizerAdapter, prefix_label

E5_IMPORT_MARKER = "lpc_import.json"
_E5_NAME = re.compile(r"(^|[^a-z0-9])e5([^a-z0-9]|$)")


def _weights_id(model_id_or_path: str) -> str:
    """A machine-independent name for the weights: the import's declared id, the folder name
    for other local folders, the hub id otherwise."""
    path = Path(model_id_or_path).expanduser()
    if path.is_dir():
        marker = path / E5_IMPORT_MARKER
        if marker.is_file():
            declared = json.loads(marker.read_text(encoding="utf-8")).get("weights_id")
            if declared:
                return str(declared)
        return path.resolve().name
    return model_id_or_path


def _default_prefix(model, model_id_or_path: str) -> str:
    """The model's own "query" prompt if it declares one; "query: " for e5 models; else none."""
    prompts = getattr(model, "prompts", None) or {}
    if prompts.get("query"):
        return prompts["query"]
    if _E5_NAME.search(str(model_id_or_path).lower()):
        return QUERY_PREFIX
    return ""


def _embedding_dimension(model) -> int:
    # sentence-transformers 6 renamed the method; older releases only have the long name.
    method = getattr(model, "get_embedding_dimension", None)
    return method() if method else model.get_sentence_embedding_dimension()


class SentenceTransformerEmbedder:
    """Runs a sentence-transformers model with torch; on a GPU when one is available.

    `prefix` defaults to the model's declared "query" prompt, else "query: " for e5 models
    (the e5 convention: a prompt whose continuation we predict is a query), else none. The
    prefix is part of `embedder_id`, since the same weights with another prefix embed
    differently (~0.96 cosine for e5's "passage: ").
    """

    def __init__(
        self,
        model_id_or_path: str | Path,
        device: str | None = None,
        prefix: str | None = None,
        max_seq_length: int | None = None,
    ) -> None:
        from sentence_transformers import SentenceTransformer

        name = str(model_id_or_path)
        self.model = SentenceTransformer(name, device=device)
        self.model.eval()
        if max_seq_length is not None:
            if max_seq_length <= 0:
                raise ValueError(f"max_seq_length must be positive, got {max_seq_length}")
            self.model.max_seq_length = max_seq_length
        self.prefix = _default_prefix(self.model, name) if prefix is None else prefix
        self.dim = int(_embedding_dimension(self.model))
        self.max_input_tokens = int(self.model.max_seq_length)
        self.embedder_id = f"{_weights_id(name)}+{prefix_label(self.prefix)}"
        self._tokenizer = FastTokenizerAdapter(self.model.tokenizer.backend_tokenizer, self.prefix)

    @property
    def tokenizer(self) -> FastTokenizerAdapter:
        return self._tokenizer

    @property
    def device(self) -> str:
        return str(self.model.device)

    def embed(self, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if len(texts) == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        vectors = self.model.encode(
            list(texts),
            prompt=self.prefix or None,
            batch_size=batch_size,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return np.asarray(vectors, dtype=np.float32)
