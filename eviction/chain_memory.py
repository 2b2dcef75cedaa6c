"""The last release under each top block's hash: `lpc-pooled`'s memory kept by chain.

A release's blocks are one chain's contiguous tail, and a block's hash is chained (it covers
every block above it), so two releases with the same top hash share a prefix above it, and
their common prefix from the top is found by bisection: equal hashes at a depth mean equal
contents at every shallower one. One map operation per release (a lookup, a write and, later,
an expiry), however long it is; the hash list is kept as given, not copied. Design:
docs/design.md, "`lpc-pooled`'s details (`eviction/lpc_pooled.py`)".
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class ChainEntry:
    """One release: its conversation, time, hash list (tail first, so its top block's hash
    last) and how many of its top blocks it released as shared. Never changed once written
    (not frozen: a frozen dataclass costs 0.36 µs to build against 0.10, once a release)."""

    conversation_id: Any
    time_s: float
    hashes: Sequence[Hashable | None]
    shared: int


def common_top(a: Sequence[Hashable | None], b: Sequence[Hashable | None]) -> int:
    """How many blocks two tail-first hash lists share from their top (0 if their tops
    differ): O(log n) comparisons, no pass over the lists. A None hash matches nothing."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        x = a[-mid]
        if x is not None and x == b[-mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class ChainMemory:
    """top block's hash → the last release under it, forgotten oldest write first."""

    def __init__(self) -> None:
        self._map: dict[Hashable, ChainEntry] = {}
        self._writes: deque[ChainEntry] = deque()  # in write order, those rewritten since too
        self.held = 0  # hashes the live entries keep (the size bound's measure)

    def __len__(self) -> int:
        return len(self._map)

    def __bool__(self) -> bool:
        return bool(self._map)

    def get(self, top: Hashable | None) -> ChainEntry | None:
        return None if top is None else self._map.get(top)

    def write(self, entry: ChainEntry) -> None:
        """Keep `entry` under its top hash (a list whose top hash is None is not kept)."""
        hashes = entry.hashes
        top = hashes[-1] if hashes else None
        if top is None:
            return
        old = self._map.get(top)
        if old is not None:
            self.held -= len(old.hashes)
        self._map[top] = entry
        self.held += len(hashes)
        self._writes.append(entry)

    def _drop(self, entry: ChainEntry) -> None:
        top = entry.hashes[-1]
        if self._map.get(top) is entry:  # not written again since
            del self._map[top]
            self.held -= len(entry.hashes)

    def forget_before(self, cutoff_s: float) -> None:
        """Forget every entry written before `cutoff_s` (writes come in time order)."""
        writes = self._writes
        while writes and writes[0].time_s < cutoff_s:
            self._drop(writes.popleft())

    def forget_oldest(self, max_held: int) -> None:
        """Forget the oldest entries until they keep at most `max_held` hashes."""
        writes = self._writes
        while self.held > max_held and writes:
            self._drop(writes.popleft())

    def clear(self) -> None:
        self._map.clear()
        self._writes.clear()
        self.held = 0
