"""Shared machinery for the queue-based cache policies (S3-FIFO, SIEVE, ARC).

The one place that maps the block manager's events onto an object cache's (insert, hit,
return, evict): queues hold every *resident* block, free or in use, and eviction steps over
the blocks a request holds. Each subclass's docstring says what the paper's events then do.

The mapping: docs/design.md, "Object-cache baselines: S3-FIFO, SIEVE, ARC" and "The events".
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterable, Sequence

from eviction.base import Evictor, FreedBlocks, FreeFlags, Release, dry_run_copy
from eviction.linked_list import BlockList


class ResidentEvictor(FreeFlags, Evictor):
    """Uncached blocks in a list, then cached ones in the policy's own queues."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 0:
            raise ValueError(f"num_blocks must be >= 0, got {num_blocks}")
        self._num_blocks = num_blocks
        self._uncached = BlockList(num_blocks)
        self._resident = [False] * num_blocks  # holds cached content the policy knows of
        self._free = [False] * num_blocks  # resident and evictable (not in use)
        self._num_free = 0  # resident blocks that are free
        self._clear_policy()

    # -- what a policy implements ---------------------------------------------------------
    @abstractmethod
    def _clear_policy(self) -> None:
        """Forget every block, ghost and adaptive parameter."""

    @abstractmethod
    def _insert(self, block_id: int, block_hash: bytes | None) -> None:
        """The paper's insertion of a missed object (the block is free)."""

    @abstractmethod
    def _hit(self, block_id: int) -> None:
        """The paper's hit on a resident object (the block is in use from now on)."""

    def _returned(self, block_id: int) -> None:
        """A block in use is released again and evictable (default: nothing changes)."""
        return None

    @abstractmethod
    def _evict(self) -> int:
        """Choose a free resident block, drop it from the queues (into a ghost if the policy
        keeps one), and return it. Called only when a free resident block exists."""

    @abstractmethod
    def _drop(self, block_id: int) -> None:
        """Take a resident block out of the queues without an eviction (its content is gone)."""

    @abstractmethod
    def _check_policy(self) -> None:
        """Assert the policy's own invariants (sizes, membership, ghosts)."""

    # -- the evictor contract -------------------------------------------------------------
    def reset(self, block_ids: Iterable[int]) -> None:
        self._uncached.clear_to(block_ids)
        self._resident = [False] * self._num_blocks
        self._free = [False] * self._num_blocks
        self._num_free = 0
        self._clear_policy()

    def push_uncached(self, block_ids: Sequence[int]) -> None:
        resident = self._resident
        for block_id in block_ids:
            if resident[block_id]:
                self._drop(block_id)
                resident[block_id] = False
        self._uncached.prepend_n(block_ids)

    def push_cached(self, freed: FreedBlocks, release: Release) -> None:
        resident, free = self._resident, self._free
        for block_id, block_hash in zip(freed.block_ids, freed.hashes, strict=True):
            free[block_id] = True
            if resident[block_id]:
                self._returned(block_id)
            else:
                resident[block_id] = True
                self._insert(block_id, block_hash)
        self._num_free += len(freed.block_ids)

    def remove(self, block_id: int) -> None:
        if not self._free[block_id]:
            self._uncached.remove(block_id)
            return
        self._free[block_id] = False
        self._num_free -= 1
        self._hit(block_id)

    def pop_n(self, n: int, now_s: float = 0.0) -> list[int]:
        uncached = self._uncached
        from_uncached = min(n, uncached.size)
        if n > from_uncached + self._num_free:
            raise IndexError(f"cannot pop {n} blocks: only {len(self)} are free")
        out = uncached.pop_n(from_uncached)
        resident, free = self._resident, self._free
        for _ in range(n - from_uncached):
            victim = self._evict()
            resident[victim] = free[victim] = False
            self._num_free -= 1
            out.append(victim)
        return out

    def free_block_ids(self) -> list[int]:
        """Uncached blocks, then the cached ones in the order evictions would take them.

        Evictions change the queues (S3-FIFO promotes, SIEVE clears bits), so the order is
        that of a dry run on a copy: O(n) per call, for tests and debugging.
        """
        dry = dry_run_copy(self)
        return [*self._uncached, *(dry._evict() for _ in range(self._num_free))]

    def check_invariants(self) -> None:
        super().check_invariants()
        self._uncached.check_invariants()
        free, resident = self._free, self._resident
        assert sum(free) == self._num_free, "the count of free cached blocks is out of sync"
        for block_id in range(self._num_blocks):
            assert not free[block_id] or resident[block_id], f"block {block_id} free, not resident"
            assert not (free[block_id] and block_id in self._uncached), (
                f"block {block_id} is both a free cached block and an uncached one"
            )
        self._check_policy()
