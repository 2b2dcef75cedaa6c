"""Deterministic test doubles: a whitespace tokenizer and a hashing embedder.

The hashing embedder's vector for a text depends on that text alone (no batch effects), which
lets tests demand bit-exact agreement between the server and in-process predictions.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

import numpy as np

WORD = re.compile(r"\S+")


class WhitespaceTokenizer:
    """One token per run of non-space characters; inputs get a prefix token and two specials."""

    def __init__(self, prefix_tokens: int = 1) -> None:
        self.prefix_tokens = prefix_tokens

    def token_spans(self, texts: Sequence[str]) -> list[list[tuple[int, int]]]:
        return [[m.span() for m in WORD.finditer(t)] for t in texts]

    def count_input_tokens(self, texts: Sequence[str]) -> list[int]:
        return [2 + self.prefix_tokens + len(WORD.findall(t)) for t in texts]


class HashingEmbedder:
    """Bag of hashed words, L2-normalised; `embed` calls are counted to check batching."""

    def __init__(
        self, dim: int = 32, max_input_tokens: int = 512, embedder_id: str = "test-hashing-embedder"
    ) -> None:
        self.dim = dim
        self.max_input_tokens = max_input_tokens
        self.embedder_id = embedder_id
        self._tokenizer = WhitespaceTokenizer()
        self.calls: list[int] = []
        self.texts_seen: list[str] = []

    @property
    def tokenizer(self) -> WhitespaceTokenizer:
        return self._tokenizer

    def embed_one(self, text: str) -> np.ndarray:
        vector = np.zeros(self.dim, dtype=np.float64)
        for word in WORD.findall(text) or ["<empty>"]:
            digest = hashlib.blake2b(word.encode("utf-8"), digest_size=8).digest()
            index = int.from_bytes(digest[:4], "little") % self.dim
            vector[index] += 1.0 if digest[4] & 1 else -1.0
        norm = np.linalg.norm(vector)
        return (vector / norm if norm else vector).astype(np.float32)

    def embed(self, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        self.calls.append(len(texts))
        self.texts_seen.extend(texts)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.stack([self.embed_one(t) for t in texts])
