"""LRU: vLLM v1's free-block queue, block for block.

The queue order is the eviction order: least recently released at the front. Uncached blocks
are prepended (reused first, LIFO for locality) and cached ones appended; since the manager
frees a request's blocks tail-first, a sequence's deepest block is evicted before its parents
when they were released together. This is exactly `FreeKVCacheBlockQueue` driven by
`BlockPool.free_blocks`, which the differential test against vLLM checks.

The evictor *is* the linked list (no wrapper layer), so a hit or an allocation costs one
Python call, as in vLLM.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import ClassVar

from eviction.base import Evictor, FreedBlocks, Release
from eviction.linked_list import BlockList


class LRUEvictor(BlockList, Evictor):
    name: ClassVar[str] = "lru"

    def __init__(self, num_blocks: int) -> None:
        super().__init__(num_blocks)

    def reset(self, block_ids: Iterable[int]) -> None:
        self.clear_to(block_ids)

    def push_uncached(self, block_ids: Sequence[int]) -> None:
        self.prepend_n(block_ids)

    def push_cached(self, freed: FreedBlocks, release: Release) -> None:
        self.append_n(freed.block_ids)

    def pop(self, now_s: float = 0.0) -> int:
        return self.popleft()

    def free_block_ids(self) -> list[int]:
        return list(self)

    def check_invariants(self) -> None:
        Evictor.check_invariants(self)
        BlockList.check_invariants(self)
