"""S3-FIFO: a small FIFO for new blocks, a main FIFO for reused ones, a ghost FIFO of hashes.

Yang et al., SOSP 2023, Algorithm 1, followed step by step over the block-manager events of
`eviction.resident`: the first release of a block's content is the insert, a hit on a free
cached block is the hit, and each popped cached block is one eviction. S is 10 % of the pool,
M the rest, G as many hashes as M holds blocks.

The algorithm and the readings the paper leaves open: docs/design.md, "S3-FIFO, step by step".
"""

from __future__ import annotations

from collections import OrderedDict
from typing import ClassVar

from eviction.resident import ResidentEvictor

MAX_FREQUENCY = 3
SMALL_SHARE = 0.1


class S3FIFOEvictor(ResidentEvictor):
    """Small, main and ghost FIFO queues; head = last entry of each OrderedDict."""

    name: ClassVar[str] = "s3fifo"

    def __init__(self, num_blocks: int) -> None:
        self._small_capacity = max(1, int(num_blocks * SMALL_SHARE))
        self._main_capacity = max(1, num_blocks - self._small_capacity)
        super().__init__(num_blocks)

    def _clear_policy(self) -> None:
        self._small: OrderedDict[int, None] = OrderedDict()
        self._main: OrderedDict[int, None] = OrderedDict()
        self._ghost: OrderedDict[bytes, None] = OrderedDict()
        self._freq: dict[int, int] = {}
        self._hash_of: dict[int, bytes | None] = {}

    def _insert(self, block_id: int, block_hash: bytes | None) -> None:
        self._freq[block_id] = 0
        self._hash_of[block_id] = block_hash
        if block_hash is not None and block_hash in self._ghost:
            del self._ghost[block_hash]
            self._main[block_id] = None
        else:
            self._small[block_id] = None

    def _hit(self, block_id: int) -> None:
        self._freq[block_id] = min(self._freq[block_id] + 1, MAX_FREQUENCY)

    def _drop(self, block_id: int) -> None:
        self._small.pop(block_id, None)
        self._main.pop(block_id, None)
        del self._freq[block_id]
        del self._hash_of[block_id]

    def _tail(self, queue: OrderedDict[int, None]) -> int | None:
        """The oldest free block of the queue (blocks in use are stepped over)."""
        free = self._free
        return next((block_id for block_id in queue if free[block_id]), None)

    def _evict(self) -> int:
        if len(self._small) >= self._small_capacity:
            order = (self._evict_small, self._evict_main, self._evict_small)
        else:
            order = (self._evict_main, self._evict_small, self._evict_main)
        for evict in order:
            victim = evict()
            if victim is not None:
                return victim
        raise AssertionError("s3fifo: evict() called with no free cached block")

    def _evict_small(self) -> int | None:
        small, main, freq = self._small, self._main, self._freq
        while (t := self._tail(small)) is not None:
            del small[t]
            if freq[t] > 1:
                main[t] = None
                if len(main) >= self._main_capacity:
                    victim = self._evict_main()
                    if victim is not None:
                        return victim
            else:
                self._remember_ghost(self._hash_of[t])
                self._forget(t)
                return t
        return None

    def _evict_main(self) -> int | None:
        main, freq = self._main, self._freq
        while (t := self._tail(main)) is not None:
            if freq[t] > 0:
                main.move_to_end(t)
                freq[t] -= 1
            else:
                del main[t]
                self._forget(t)
                return t
        return None

    def _remember_ghost(self, block_hash: bytes | None) -> None:
        if block_hash is None:
            return
        ghost = self._ghost
        ghost[block_hash] = None
        ghost.move_to_end(block_hash)
        while len(ghost) > self._main_capacity:
            ghost.popitem(last=False)

    def _forget(self, block_id: int) -> None:
        del self._freq[block_id]
        del self._hash_of[block_id]

    def _check_policy(self) -> None:
        small, main, resident = self._small, self._main, self._resident
        members = set(small) | set(main)
        assert not set(small) & set(main), "s3fifo: a block is in both S and M"
        assert members == set(self._freq) == set(self._hash_of), (
            "s3fifo: queue members and per-block metadata disagree"
        )
        assert members == {b for b in range(self._num_blocks) if resident[b]}, (
            "s3fifo: the queues do not hold exactly the resident blocks"
        )
        assert all(0 <= f <= MAX_FREQUENCY for f in self._freq.values()), (
            f"s3fifo: a frequency left [0, {MAX_FREQUENCY}]"
        )
        assert len(self._ghost) <= self._main_capacity, "s3fifo: the ghost queue overflowed"
