"""Per-prompt embeddings kept across turns (`window_encoding="prompt_mean"`).

In that mode a prompt's vector depends on the prompt text alone, and each turn of a
conversation repeats the previous turns' prompts, so a small LRU keyed by a digest of the text
turns "embed five prompts" into "embed the new one". Bounded (entries), thread-safe.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np


@dataclass
class PromptCacheStats:
    hits: int = 0
    misses: int = 0
    evictions: int = 0


class PromptEmbeddingCache:
    def __init__(self, max_entries: int = 20_000) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        self.max_entries = max_entries
        self._entries: OrderedDict[bytes, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        self.stats = PromptCacheStats()

    @staticmethod
    def key(text: str) -> bytes:
        return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.stats = PromptCacheStats()

    def get(self, text: str) -> np.ndarray | None:
        key = self.key(text)
        with self._lock:
            vector = self._entries.get(key)
            if vector is None:
                self.stats.misses += 1
                return None
            self._entries.move_to_end(key)
            self.stats.hits += 1
            return vector

    def put(self, text: str, vector: np.ndarray) -> None:
        key = self.key(text)
        with self._lock:
            self._entries[key] = vector
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
                self.stats.evictions += 1
