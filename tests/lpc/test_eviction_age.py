"""The LRU eviction-age recorder: ages of evicted cached blocks only."""

from __future__ import annotations

from eviction.base import FreedBlocks, Release
from lpc.replay.eviction_age import AgeRecordingLRU, _summary


def test_ages_are_release_to_eviction_of_cached_blocks() -> None:
    lru = AgeRecordingLRU(5)
    lru.reset(range(5))
    lru.pop_n(5, now_s=1.0)  # uncached blocks: nothing recorded
    lru.push_cached(FreedBlocks([3, 2], [1, 0], [b"b", b"a"]), Release(10.0))
    lru.push_cached(FreedBlocks([4], [0], [b"c"]), Release(12.0))
    lru.remove(4)  # a hit takes it back: its release no longer counts
    assert lru.pop_n(2, now_s=25.0) == [3, 2]
    assert lru.ages_s == [15.0, 15.0] and lru.evicted_at_s == [25.0, 25.0]
    summary = _summary(1000, lru.ages_s)
    assert summary.evictions == 2 and summary.median_s == 15.0
