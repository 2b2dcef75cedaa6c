"""Shared machinery for policies that order cached blocks by a priority key.

Uncached blocks live in a linked list in front of everything (reused first, in vLLM's order);
cached blocks live in the `RunHeap` this class extends, keyed by the policy's priority, ties
going to the deeper block, then to the older release. A block's last run (or its ghost) is
its metadata (key and tag) while it is in use, so a policy can pool across releases.
Subclasses implement
`push_cached`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from eviction.base import Evictor
from eviction.linked_list import BlockList
from eviction.run_heap import Ghost, RunHeap


class PriorityEvictor(RunHeap, Evictor):
    """A run heap of cached blocks behind a list of uncached ones."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 0:
            raise ValueError(f"num_blocks must be >= 0, got {num_blocks}")
        self._num_blocks = num_blocks
        self._uncached = BlockList(num_blocks)
        RunHeap.__init__(self, num_blocks)

    def reset(self, block_ids: Iterable[int]) -> None:
        self._uncached.clear_to(block_ids)
        self._clear_heap()

    def push_uncached(self, block_ids: Sequence[int]) -> None:
        self._uncached.prepend_n(block_ids)

    def remove(self, block_id: int) -> None:
        # The hot path of every hit: a few stores (RunHeap._dequeue, inlined).
        state = self._state
        run = state[block_id]
        try:
            ghost = run.ghost  # only a queued block's state (a Run) has a ghost slot
        except AttributeError:
            self._uncached.remove(block_id)
            return
        if ghost is None:
            ghost = run.ghost = Ghost(run.key, run.tag)
        state[block_id] = ghost
        run.live -= 1
        self._queued -= 1

    def pop_n(self, n: int, now_s: float = 0.0) -> list[int]:
        uncached = self._uncached
        from_uncached = uncached.size
        if n <= from_uncached:
            return uncached.pop_n(n)
        if n > from_uncached + self._queued:
            raise IndexError(f"cannot pop {n} blocks: only {len(self)} are free")
        out = uncached.pop_n(from_uncached) if from_uncached else []
        if len(self._heap) > 2 * self._queued + 1024:
            self._rebuild()  # hits left more dead runs than live blocks
        self._pop_into(n - from_uncached, out)
        return out

    def __len__(self) -> int:
        return self._uncached.size + self._queued

    def __contains__(self, block_id: object) -> bool:
        if not isinstance(block_id, int) or not 0 <= block_id < self._num_blocks:
            return False
        return self._is_queued(block_id) or block_id in self._uncached

    def free_block_ids(self) -> list[int]:
        return [*self._uncached, *self._ordered()]
