"""LFU: evict the block released the fewest times since it was cached; ties go to LRU.

A classic baseline: frequency survives the user's think time, recency does not. A block's key
is (releases since its content was cached, last release time); its last run remembers the
count across hits.
"""

from __future__ import annotations

from typing import ClassVar

from eviction.base import FreedBlocks, Release
from eviction.priority import PriorityEvictor


class LFUEvictor(PriorityEvictor):
    name: ClassVar[str] = "lfu"

    def _counted(self, freed: FreedBlocks, release: Release) -> list[tuple[int, float]]:
        run_of = self._state
        return [
            (1 if run_of[b] is None else run_of[b].key[0] + 1, release.time_s)
            for b in freed.block_ids
        ]

    def push_cached(self, freed: FreedBlocks, release: Release) -> None:
        keys = self._counted(freed, release)
        self._push_grouped(freed.block_ids, freed.depths, keys, [None] * len(keys))

    def note_shared_release(self, freed: FreedBlocks, release: Release) -> None:
        for key, block_id, depth in zip(
            self._counted(freed, release), freed.block_ids, freed.depths, strict=True
        ):
            self._remember(key, None, [block_id], [depth])
