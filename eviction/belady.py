"""Belady: evict the block whose next use lies farthest in the future (an upper bound).

Needs the whole trace: `FutureUses` lists, per block hash, the times at which requests will
look that hash up. A block's next use is fixed while it waits, except when a look-up passes
without hitting it (its parent was evicted first); such entries are refreshed from a second
heap ordered by next use, so the order is exact at every eviction.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import ClassVar

from eviction.base import FreedBlocks, Release
from eviction.priority import PriorityEvictor
from eviction.run_heap import Run


class FutureUses:
    """Sorted look-up times per block hash, built from a trace before it is replayed."""

    def __init__(self, uses: Mapping[bytes, Sequence[float]] | None = None) -> None:
        self._times: dict[bytes, list[float]] = {}
        for block_hash, times in (uses or {}).items():
            self._times[block_hash] = sorted(times)

    def add(self, time_s: float, block_hashes: Iterable[bytes]) -> None:
        """Record one request at `time_s` that looks up `block_hashes` (append in time order)."""
        for block_hash in block_hashes:
            times = self._times.setdefault(block_hash, [])
            if times and times[-1] > time_s:
                bisect.insort(times, time_s)
            else:
                times.append(time_s)

    def next_use(self, block_hash: bytes | None, after_s: float) -> float:
        """The first look-up of `block_hash` at or after `after_s` (inf when none)."""
        times = self._times.get(block_hash) if block_hash is not None else None
        if not times:
            return math.inf
        i = bisect.bisect_left(times, after_s)
        return times[i] if i < len(times) else math.inf

    def __len__(self) -> int:
        return len(self._times)


class BeladyEvictor(PriorityEvictor):
    """Blocks keyed by −(next use); a chain released together usually shares its next use
    (the conversation's next turn), so it forms one run."""

    name: ClassVar[str] = "belady"

    def __init__(self, num_blocks: int, future: FutureUses) -> None:
        self._future = future
        self._hash_of: list[bytes | None] = [None] * num_blocks
        self._due: list[tuple[float, int, Run]] = []  # (next use, run seq, run)
        super().__init__(num_blocks)

    def _queue(self, block_ids: Sequence[int], depths: Sequence[int], now_s: float) -> None:
        next_use = self._future.next_use
        hash_of = self._hash_of
        uses = [next_use(hash_of[b], now_s) for b in block_ids]
        runs = self._push_grouped(block_ids, depths, [-u for u in uses], [None] * len(uses))
        for run in runs:
            if run.key != -math.inf:
                heapq.heappush(self._due, (-run.key, run.seq, run))

    def push_cached(self, freed: FreedBlocks, release: Release) -> None:
        hash_of = self._hash_of
        for block_id, block_hash in zip(freed.block_ids, freed.hashes, strict=True):
            hash_of[block_id] = block_hash
        self._queue(freed.block_ids, freed.depths, release.time_s)

    def _refresh(self, now_s: float) -> None:
        """Re-date blocks whose predicted use passed without a hit."""
        due, state = self._due, self._state
        while due and due[0][0] < now_s:
            _, _, run = heapq.heappop(due)
            stale_ids, stale_depths = [], []
            for j in range(run.cursor, len(run.block_ids)):
                block_id = run.block_ids[j]
                if state[block_id] is run:
                    self.remove(block_id)
                    stale_ids.append(block_id)
                    stale_depths.append(run.depths[j])
            if stale_ids:
                self._queue(stale_ids, stale_depths, now_s)

    def pop_n(self, n: int, now_s: float = 0.0) -> list[int]:
        if n > len(self._uncached):
            self._refresh(now_s)
        return super().pop_n(n, now_s)
