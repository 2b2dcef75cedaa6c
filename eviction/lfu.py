"""LFU: evict the block released the fewest times since it was cached; ties go to LRU.

A classic baseline: frequency survives the user's think time, recency does not.
"""

from __future__ import annotations

from typing import ClassVar

from eviction.base import FreedBlocks, Release
from eviction.priority import PriorityEvictor


class LFUEvictor(PriorityEvictor):
    name: ClassVar[str] = "lfu"

    def __init__(self, num_blocks: int) -> None:
        self._uses = [0] * num_blocks
        super().__init__(num_blocks)

    def _forget(self, block_id: int) -> None:
        self._uses[block_id] = 0

    def _count(self, freed: FreedBlocks) -> None:
        uses = self._uses
        for block_id in freed.block_ids:
            uses[block_id] += 1

    def push_cached(self, freed: FreedBlocks, release: Release) -> None:
        self._count(freed)
        uses = self._uses
        for block_id, depth in zip(freed.block_ids, freed.depths, strict=True):
            self._push(block_id, (uses[block_id], release.time_s), depth)

    def note_shared_release(self, freed: FreedBlocks, release: Release) -> None:
        self._count(freed)
