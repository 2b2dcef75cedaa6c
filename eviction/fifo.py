"""FIFO: evict the block that entered the cache first, however often it was hit since.

Dynamo's policy; a baseline that ignores recency. A block's key is the time it was first
released with its current content, kept across later hits (its last run remembers it).
"""

from __future__ import annotations

from typing import ClassVar

from eviction.base import FreedBlocks, Release
from eviction.priority import PriorityEvictor


class FIFOEvictor(PriorityEvictor):
    name: ClassVar[str] = "fifo"

    def push_cached(self, freed: FreedBlocks, release: Release) -> None:
        run_of = self._state
        keys = []
        for block_id in freed.block_ids:
            old = run_of[block_id]
            keys.append(release.time_s if old is None else old.key)
        self._push_grouped(freed.block_ids, freed.depths, keys, [None] * len(keys))
