"""Shared machinery for policies that order cached blocks by a priority key.

Uncached blocks live in a linked list in front of everything (reused first, like vLLM); cached
blocks live in a binary heap of (priority, -depth, sequence number, block id) entries, so ties
in priority evict the deeper block first (a child is useless without its parent), then the one
inserted earlier. Removal is lazy: an entry is valid only while its sequence number is the
block's live one, and the heap is rebuilt when stale entries outnumber live ones, which keeps
every operation O(log n) amortised.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from typing import Any

from eviction.base import Evictor
from eviction.linked_list import BlockList

_NOT_IN_HEAP = -1


class PriorityEvictor(Evictor):
    """Base class: subclasses compute priorities and call `_push` for cached blocks."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 0:
            raise ValueError(f"num_blocks must be >= 0, got {num_blocks}")
        self._num_blocks = num_blocks
        self._uncached = BlockList(num_blocks)
        self._heap: list[tuple[Any, int, int, int]] = []
        self._live_seq = [_NOT_IN_HEAP] * num_blocks
        self._next_seq = 0
        self._num_cached = 0

    # -- hooks --------------------------------------------------------------------------
    def _forget(self, block_id: int) -> None:
        """The block was handed out and lost its content: drop per-block metadata."""

    # -- interface ----------------------------------------------------------------------
    def reset(self, block_ids: Iterable[int]) -> None:
        self._uncached.clear_to(block_ids)
        self._heap.clear()
        self._live_seq = [_NOT_IN_HEAP] * self._num_blocks
        self._num_cached = 0
        for block_id in range(self._num_blocks):
            self._forget(block_id)

    def push_uncached(self, block_ids: Sequence[int]) -> None:
        self._uncached.prepend_n(block_ids)

    def _push(self, block_id: int, priority: Any, depth: int) -> None:
        seq = self._next_seq
        self._next_seq = seq + 1
        if self._live_seq[block_id] == _NOT_IN_HEAP:
            self._num_cached += 1
        self._live_seq[block_id] = seq
        heapq.heappush(self._heap, (priority, -depth, seq, block_id))

    def remove(self, block_id: int) -> None:
        if self._live_seq[block_id] != _NOT_IN_HEAP:
            self._live_seq[block_id] = _NOT_IN_HEAP
            self._num_cached -= 1
            if len(self._heap) > 2 * self._num_cached + 1024:
                self._compact()
        else:
            self._uncached.remove(block_id)

    def _compact(self) -> None:
        live = self._live_seq
        self._heap = [entry for entry in self._heap if live[entry[3]] == entry[2]]
        heapq.heapify(self._heap)

    def _pop_cached(self, now_s: float) -> int:
        heap, live = self._heap, self._live_seq
        while True:
            entry = heapq.heappop(heap)
            block_id = entry[3]
            if live[block_id] == entry[2]:
                live[block_id] = _NOT_IN_HEAP
                self._num_cached -= 1
                self._forget(block_id)
                return block_id

    def pop_n(self, n: int, now_s: float = 0.0) -> list[int]:
        if n > len(self):
            raise IndexError(f"cannot pop {n} blocks: only {len(self)} are free")
        from_uncached = min(n, len(self._uncached))
        out = self._uncached.popleft_n(from_uncached)
        for _ in range(n - from_uncached):
            out.append(self._pop_cached(now_s))
        return out

    def __len__(self) -> int:
        return len(self._uncached) + self._num_cached

    def __contains__(self, block_id: object) -> bool:
        if block_id in self._uncached:
            return True
        return (
            isinstance(block_id, int)
            and 0 <= block_id < self._num_blocks
            and self._live_seq[block_id] != _NOT_IN_HEAP
        )

    def free_block_ids(self) -> list[int]:
        live = self._live_seq
        cached = sorted(entry for entry in self._heap if live[entry[3]] == entry[2])
        return list(self._uncached) + [entry[3] for entry in cached]
