"""A brute-force return-window evictor written from the definition, for differential tests.

Per free cached block it keeps the claims (curve, release time) of its conversations — the
newest per conversation, at most `max_claims` — and at every eviction call scores every block
by the largest P(return within W | silent a) of its claims (or, `pooling="or"`, the chance
that any of them returns, 1 − ∏(1 − P)), at least `shared_floor` when two or more named
conversations claim it (ties: deeper block first, or with `ties="age"` older release
first), W the running estimate (times the multiplier) at the call's start (the
eviction-age rule, or the turnover rule updated as the call starts); no keys kept, no heap.
With `claim_memory_s`, each release remembers every block content's claims after it (newest
write last, at most `max_entries` contents, writes older than the window forgotten), and a
block that holds no claims starts from its content's remembered, unprotected claims released
within the window. With `shared_floor="online"` the floor is, at each eviction call, (the
shared releases whose deadline, release time + W then, is before the last release's time,
and whose content was released again by the deadline, + 0.5) / (those shared releases + 1),
counted from the whole history of releases.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence

from eviction import Evictor, FreedBlocks, Release
from eviction.return_window import (
    DEFAULT_WINDOW_MULTIPLIER,
    Claim,
    EvictionAgeEstimate,
    TurnoverEstimate,
    claim_score,
)


class BruteForceReturnWindow(Evictor):
    name = "lpc-return-reference"

    def __init__(
        self,
        num_blocks: int,
        max_claims: int = 4,
        fallback_score: float = 0.5,
        window: EvictionAgeEstimate | TurnoverEstimate | None = None,
        window_multiplier: float = DEFAULT_WINDOW_MULTIPLIER,
        pooling: str = "max",
        shared_floor: float | str | None = None,
        ties: str = "depth",
        claim_memory_s: float | None = None,
        max_entries: int = 1 << 30,
    ) -> None:
        self.claim_memory_s = claim_memory_s
        # every block release in order: (content, time); the shared ones: (index, deadline)
        self.history: list[tuple[bytes | None, float]] = []
        self.shared_history: list[tuple[int, float]] = []
        # the same releases by content: content -> ([history index], [time]), in order (an
        # index of `history`, so the floor scans a content's own releases, not all of them)
        self.history_of: dict[bytes, tuple[list[int], list[float]]] = {}
        self.last_release_s = -math.inf
        self.max_entries = max_entries
        self.memory: dict[bytes, tuple[float, list[Claim]]] = {}  # content -> (time, claims)
        self.ties = ties
        self.pooling = pooling
        self.shared_floor = shared_floor
        self.window_multiplier = window_multiplier
        self.max_claims = max_claims
        self.fallback = fallback_score
        self.window = EvictionAgeEstimate() if window is None else window
        self.window_since_s = -math.inf  # the turnover rule's interval: its start
        self.evicted_since = 0  # and the cached blocks evicted in it
        self.uncached: list[int] = []
        self.claims: dict[int, list[Claim]] = {}  # cached block (free or in use) -> claims
        self.released_at: dict[int, float] = {}
        self.free: dict[int, tuple[int, int]] = {}  # free cached block -> (depth, push order)
        self.order = 0

    def reset(self, block_ids: Iterable[int]) -> None:
        self.uncached = list(block_ids)
        self.claims.clear()
        self.free.clear()

    def push_uncached(self, block_ids: Sequence[int]) -> None:
        self.uncached[0:0] = list(block_ids)

    def _held(self, block_id: int, block_hash: bytes | None, now_s: float) -> list[Claim]:
        if block_id in self.claims:
            return self.claims[block_id]
        if self.claim_memory_s is None or block_hash is None or block_hash not in self.memory:
            return []
        cutoff = now_s - self.claim_memory_s
        return [
            c
            for c in self.memory[block_hash][1]
            if c.protected_score is None and c.release_s >= cutoff
        ]

    def _record_all(self, freed: FreedBlocks, release: Release) -> None:
        now = release.time_s
        if self.claim_memory_s is not None:
            cutoff = now - self.claim_memory_s
            self.memory = {h: e for h, e in self.memory.items() if e[0] >= cutoff}
        conv = release.conversation_id
        claim = Claim(conv, release.return_curve, now)
        new = {}
        for block_id, block_hash in zip(freed.block_ids, freed.hashes, strict=True):
            old = self._held(block_id, block_hash, now)
            others = [c for c in old if conv is None or c.conversation_id != conv]
            new[block_id] = [claim, *others[: self.max_claims - 1]]
        self.last_release_s = now
        w = self.window.value_s * self.window_multiplier
        for block_id, block_hash in zip(freed.block_ids, freed.hashes, strict=True):
            if block_hash is not None:
                if len({c.conversation_id for c in new[block_id]} - {None}) >= 2:
                    self.shared_history.append((len(self.history), now + w))
                indices, times = self.history_of.setdefault(block_hash, ([], []))
                indices.append(len(self.history))
                times.append(now)
                self.history.append((block_hash, now))
        for block_id, block_hash in zip(freed.block_ids, freed.hashes, strict=True):
            self.claims[block_id] = new[block_id]
            if self.claim_memory_s is not None and block_hash is not None:
                self.memory.pop(block_hash, None)
                self.memory[block_hash] = (now, new[block_id])
        while len(self.memory) > self.max_entries:
            del self.memory[next(iter(self.memory))]

    def push_cached(self, freed: FreedBlocks, release: Release) -> None:
        self._record_all(freed, release)
        for block_id, depth in zip(freed.block_ids, freed.depths, strict=True):
            self.released_at[block_id] = release.time_s
            self.free[block_id] = (depth, self.order)
            self.order += 1

    def note_shared_release(self, freed: FreedBlocks, release: Release) -> None:
        self._record_all(freed, release)

    def remove(self, block_id: int) -> None:
        if block_id in self.free:
            del self.free[block_id]
        else:
            self.uncached.remove(block_id)

    def floor(self) -> float | None:
        if self.shared_floor != "online":
            return self.shared_floor  # type: ignore[return-value]
        judged = reused = 0
        for index, deadline in self.shared_history:
            if deadline >= self.last_release_s:
                continue
            judged += 1
            indices, times = self.history_of[self.history[index][0]]
            # the content's releases after this one (history[index + 1:] holding it)
            later = times[bisect.bisect_right(indices, index) :]
            if any(t <= deadline for t in later):
                reused += 1
        return (reused + 0.5) / (judged + 1)

    def value(self, block_id: int, now_s: float, window_s: float) -> float:
        pooled = self.pooled(block_id, now_s, window_s)
        named = {c.conversation_id for c in self.claims[block_id]} - {None}
        floor = self.floor_now
        if floor is not None and len(named) >= 2:
            return max(pooled, floor)
        return pooled

    def pooled(self, block_id: int, now_s: float, window_s: float) -> float:
        scores = [claim_score(c, now_s, window_s, self.fallback) for c in self.claims[block_id]]
        if self.pooling == "max":
            return max(scores)
        chances = [p for p in scores if p > 0.0]  # a 0 leaves the product as it is
        if len(chances) <= 1:
            return max(scores)
        return 1.0 - math.prod(1.0 - p for p in chances)  # any of them returns within W

    def rank(self, block_id: int, score: float) -> tuple[float, ...]:
        """Eviction order: the score, then the deeper block, then the older push; with
        `ties="age"`, the score, then the older release (the newest claim), then the deeper
        block, then the older push."""
        depth, order = self.free[block_id]
        if self.ties == "age":
            newest = max(c.release_s for c in self.claims[block_id])
            return (score, newest, -depth, order)
        return (score, -depth, order)

    def pop_n(self, n: int, now_s: float = 0.0) -> list[int]:
        if n > len(self.uncached):  # the turnover rule: one interval ends at each eviction
            elapsed = now_s - self.window_since_s
            if elapsed > 0 or self.window_since_s == -math.inf:
                if isinstance(self.window, TurnoverEstimate):
                    self.window.observe_interval(len(self.free), elapsed, self.evicted_since)
                self.evicted_since = 0
                self.window_since_s = now_s
        w = self.window.value_s * self.window_multiplier
        self.floor_now = self.floor()
        # every block's rank at the call's start (a victim's leaving changes no other's)
        rank = {b: self.rank(b, self.value(b, now_s, w)) for b in self.free}
        out = []
        for _ in range(n):
            if self.uncached:
                out.append(self.uncached.pop(0))
                continue
            victim = min(self.free, key=rank.__getitem__)
            del self.free[victim]
            del self.claims[victim]
            out.append(victim)
        for victim in out:
            released = self.released_at.pop(victim, None)
            if released is not None and victim not in self.claims:
                self.evicted_since += 1
                if isinstance(self.window, EvictionAgeEstimate):
                    self.window.observe(now_s - released)
        return out

    def __len__(self) -> int:
        return len(self.uncached) + len(self.free)

    def __contains__(self, block_id: object) -> bool:
        return block_id in self.free or block_id in self.uncached

    def free_block_ids(self) -> list[int]:
        return [*self.uncached, *self.free]
