"""How long LRU keeps a released block: the time from a block's release to its eviction.

A continuation predictor for eviction only has to answer "does the conversation come back
while its blocks could still be in the cache?". A block LRU would evict 3 minutes after its
release is worth keeping only if the conversation returns within a few times that; a return
after an hour finds it gone under any policy a cache can afford. This replay measures that
age under LRU at a given cache size, so the label horizon of access-feature training
(`training.access_data`) can be chosen from it (docs/results.md, "Real traffic").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from eviction.base import FreedBlocks, Release
from eviction.lru import LRUEvictor
from lpc.blocks.block_manager import PrefixCacheBlockManager
from lpc.replay.simulator import PreparedWorkload, num_blocks_for
from lpc.workload import ARRIVAL


class AgeRecordingLRU(LRUEvictor):
    """LRU that notes each cached block's release time and, at eviction, its age."""

    def __init__(self, num_blocks: int) -> None:
        super().__init__(num_blocks)
        self.released_at_s: dict[int, float] = {}
        self.ages_s: list[float] = []
        self.evicted_at_s: list[float] = []

    def push_cached(self, freed: FreedBlocks, release: Release) -> None:
        super().push_cached(freed, release)
        for block_id in freed.block_ids:
            self.released_at_s[block_id] = release.time_s

    def remove(self, block_id: int) -> None:
        super().remove(block_id)
        self.released_at_s.pop(block_id, None)

    def pop_n(self, n: int, now_s: float = 0.0) -> list[int]:
        out = super().pop_n(n, now_s)
        for block_id in out:
            released = self.released_at_s.pop(block_id, None)
            if released is not None:  # uncached blocks carry no content to lose
                self.ages_s.append(now_s - released)
                self.evicted_at_s.append(now_s)
        return out

    def pop(self, now_s: float = 0.0) -> int:
        return self.pop_n(1, now_s)[0]


@dataclass(frozen=True)
class EvictionAges:
    cache_tokens: int
    evictions: int  # cached blocks evicted while counting (the evaluation part)
    median_s: float
    p25_s: float
    p75_s: float
    p90_s: float
    mean_s: float

    def to_dict(self) -> dict[str, float | int]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def lru_eviction_ages(
    workload: PreparedWorkload, cache_tokens: int, counted_from_s: float | None = None
) -> EvictionAges:
    """Replay `workload` under LRU; ages of the blocks evicted after `counted_from_s`
    (default: the first counted request's arrival)."""
    num_blocks = num_blocks_for(cache_tokens, workload.block_size)
    evictor = AgeRecordingLRU(num_blocks)
    manager = PrefixCacheBlockManager(num_blocks, workload.block_size, evictor=evictor)
    failed: set[int] = set()
    for time_s, kind, i in workload.events:
        request = workload.cache_requests[i]
        if kind == ARRIVAL:
            prefix = manager.find_computed_prefix(request, request.block_hashes)
            if manager.allocate(request, prefix, time_s) is None:
                failed.add(i)
        elif i in failed:
            failed.discard(i)
        else:
            manager.free(request.request_id, time_s)
    if counted_from_s is None:
        first = min(workload.first_counted, len(workload.requests) - 1)
        counted_from_s = workload.requests[first].arrival_s if workload.requests else 0.0
    ages = np.asarray(evictor.ages_s)[np.asarray(evictor.evicted_at_s) >= counted_from_s]
    return _summary(cache_tokens, ages)


def _summary(cache_tokens: int, ages: Sequence[float] | np.ndarray) -> EvictionAges:
    a = np.asarray(ages, dtype=np.float64)
    if a.size == 0:
        nan = float("nan")
        return EvictionAges(cache_tokens, 0, nan, nan, nan, nan, nan)
    p25, p50, p75, p90 = np.percentile(a, [25, 50, 75, 90])
    return EvictionAges(
        cache_tokens, int(a.size), float(p50), float(p25), float(p75), float(p90), float(a.mean())
    )
