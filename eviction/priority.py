"""Shared machinery for policies that order cached blocks by a priority key.

The `RunHeap` this class extends keeps uncached blocks in a linked list in front of everything
(reused first, in vLLM's order) and cached blocks in a heap keyed by the policy's priority,
ties going to the deeper block, then to the older release. A block's last run (or its ghost)
is its metadata (key and tag) while it is in use, so a policy can pool across releases.
Subclasses implement `push_cached`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from eviction.base import Evictor, FreedBlocks
from eviction.run_heap import Run, RunHeap


class PriorityEvictor(RunHeap, Evictor):
    """A run heap of cached blocks behind a list of uncached ones."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 0:
            raise ValueError(f"num_blocks must be >= 0, got {num_blocks}")
        self._num_blocks = num_blocks
        RunHeap.__init__(self, num_blocks)

    def reset(self, block_ids: Iterable[int]) -> None:
        self._uncached.clear_to(block_ids)
        self._clear_heap()

    def push_uncached(self, block_ids: Sequence[int]) -> None:
        self._uncached.prepend_n(block_ids)

    def _push_deepest_first(
        self, freed: FreedBlocks, keys: Sequence[Any], tags: Sequence[Any]
    ) -> None:
        """Queue blocks given in any order with their keys and tags, deepest first; blocks
        of equal depth keep the given order (the sort is stable). With keys and tags that
        depend only on the release and each block's own metadata, this is one single-block
        push per block in the given order: the heap orders blocks by (key, −depth, push), and
        runs pushed in this order keep both (the batched pushes, `push_cached_each`)."""
        depths = freed.depths
        order = sorted(range(len(depths)), key=depths.__getitem__, reverse=True)
        block_ids = freed.block_ids
        self._push_grouped(
            [block_ids[i] for i in order],
            [depths[i] for i in order],
            [keys[i] for i in order],
            [tags[i] for i in order],
        )

    def __len__(self) -> int:
        return self._uncached.size + self._queued

    def __contains__(self, block_id: object) -> bool:
        if not isinstance(block_id, int) or not 0 <= block_id < self._num_blocks:
            return False
        # `_is_queued`, then `in self._uncached` past the checks just made (one call, not three)
        return (
            type(self._state[block_id]) is Run or self._uncached._nodes[block_id].prev is not None
        )

    def free_block_ids(self) -> list[int]:
        return [*self._uncached, *self._ordered()]

    def lru_order(self) -> list[int]:
        """Every free block in the order an LRU list fed the same pushes holds them — vLLM's
        `FreeKVCacheBlockQueue`: uncached blocks first (the same list, so the same order),
        then cached ones by push, oldest first, each push in the order it was freed. A block's
        place is its latest push; which blocks left the queue since changes no one else's."""
        return [*self._uncached, *self._queued_in_push_order()]

    def check_invariants(self) -> None:
        Evictor.check_invariants(self)
        RunHeap.check_invariants(self)
        self._uncached.check_invariants()
        for block_id in self._uncached:
            assert not self._is_queued(block_id), f"block {block_id} is uncached and queued"
