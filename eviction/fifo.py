"""FIFO: evict the block that entered the cache first, however often it was hit since.

Dynamo's policy; a baseline that ignores recency. A block's position is fixed by the time it
was first released with its current content and survives later hits.
"""

from __future__ import annotations

from typing import ClassVar

from eviction.base import FreedBlocks, Release
from eviction.priority import PriorityEvictor


class FIFOEvictor(PriorityEvictor):
    name: ClassVar[str] = "fifo"

    def __init__(self, num_blocks: int) -> None:
        self._cached_since: list[float | None] = [None] * num_blocks
        super().__init__(num_blocks)

    def _forget(self, block_id: int) -> None:
        self._cached_since[block_id] = None

    def push_cached(self, freed: FreedBlocks, release: Release) -> None:
        since = self._cached_since
        for block_id, depth in zip(freed.block_ids, freed.depths, strict=True):
            first = since[block_id]
            if first is None:
                first = since[block_id] = release.time_s
            self._push(block_id, first, depth)
