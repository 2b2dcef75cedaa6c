"""S3-FIFO, SIEVE and ARC written plainly from their papers' pseudo-code, for differential tests.

Plain Python lists, index 0 the tail (the oldest, or LRU, entry) and the end the head; every
step re-scans what it needs, no links, no counters kept on the side. The block-manager events
map onto cache events as `eviction.resident` says: the first release of a block's content
inserts it, a hit on a free cached block is an access and pins it, its release unpins it, a
pop evicts, and blocks in use are stepped over wherever the paper takes a block.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from eviction import Evictor, FreedBlocks, Release


class PlainCache(Evictor):
    """The uncached blocks and the pinned set, shared by the three references."""

    name = "plain-reference"

    def __init__(self, num_blocks: int) -> None:
        self.c = num_blocks
        self.uncached: list[int] = []
        self.pinned: set[int] = set()
        self.clear()

    def clear(self) -> None:
        raise NotImplementedError

    def resident(self) -> list[int]:
        raise NotImplementedError

    def insert(self, block_id: int, block_hash: bytes | None) -> None:
        raise NotImplementedError

    def hit(self, block_id: int) -> None:
        raise NotImplementedError

    def returned(self, block_id: int) -> None:
        """A pinned block is released again; nothing moves unless the policy says so."""

    def drop(self, block_id: int) -> None:
        raise NotImplementedError

    def evict(self) -> int:
        raise NotImplementedError

    def unpinned(self, queue: list[int]) -> list[int]:
        return [b for b in queue if b not in self.pinned]

    def reset(self, block_ids: Iterable[int]) -> None:
        self.uncached = list(block_ids)
        self.pinned = set()
        self.clear()

    def push_uncached(self, block_ids: Sequence[int]) -> None:
        for block_id in block_ids:
            if block_id in self.resident():
                self.drop(block_id)
                self.pinned.discard(block_id)
        self.uncached[0:0] = list(block_ids)

    def push_cached(self, freed: FreedBlocks, release: Release) -> None:
        for block_id, block_hash in zip(freed.block_ids, freed.hashes, strict=True):
            if block_id in self.resident():
                self.pinned.remove(block_id)
                self.returned(block_id)
            else:
                self.insert(block_id, block_hash)

    def remove(self, block_id: int) -> None:
        if block_id in self.uncached:
            self.uncached.remove(block_id)
        else:
            assert block_id not in self.pinned
            self.pinned.add(block_id)
            self.hit(block_id)

    def pop_n(self, n: int, now_s: float = 0.0) -> list[int]:
        out = []
        for _ in range(n):
            out.append(self.uncached.pop(0) if self.uncached else self.evict())
        return out

    def __len__(self) -> int:
        return len(self.uncached) + len(self.resident()) - len(self.pinned)

    def __contains__(self, block_id: object) -> bool:
        return block_id in self.uncached or (
            block_id in self.resident() and block_id not in self.pinned
        )

    def free_block_ids(self) -> list[int]:
        raise NotImplementedError  # the differential tests compare pops, not listings


class PlainS3FIFO(PlainCache):
    """SOSP'23 Algorithm 1."""

    def clear(self) -> None:
        self.small_size = max(1, int(self.c * 0.1))
        self.main_size = max(1, self.c - self.small_size)
        self.S: list[int] = []
        self.M: list[int] = []
        self.G: list[bytes] = []
        self.freq: dict[int, int] = {}
        self.hash: dict[int, bytes | None] = {}

    def resident(self) -> list[int]:
        return self.S + self.M

    def insert(self, x: int, h: bytes | None) -> None:
        self.hash[x] = h
        self.freq[x] = 0
        if h is not None and h in self.G:
            self.G.remove(h)
            self.M.append(x)
        else:
            self.S.append(x)

    def hit(self, x: int) -> None:
        self.freq[x] = min(self.freq[x] + 1, 3)

    def drop(self, x: int) -> None:
        if x in self.S:
            self.S.remove(x)
        else:
            self.M.remove(x)
        del self.freq[x], self.hash[x]

    def evict(self) -> int:
        if len(self.S) >= self.small_size:
            tries = [self.evict_s, self.evict_m, self.evict_s]
        else:
            tries = [self.evict_m, self.evict_s, self.evict_m]
        for attempt in tries:
            victim = attempt()
            if victim is not None:
                return victim
        raise AssertionError("nothing to evict")

    def evict_s(self) -> int | None:
        while self.unpinned(self.S):
            t = self.unpinned(self.S)[0]
            self.S.remove(t)
            if self.freq[t] > 1:
                self.M.append(t)
                if len(self.M) >= self.main_size:
                    victim = self.evict_m()
                    if victim is not None:
                        return victim
            else:
                h = self.hash[t]
                if h is not None:
                    if h in self.G:
                        self.G.remove(h)
                    self.G.append(h)
                    while len(self.G) > self.main_size:
                        self.G.pop(0)
                del self.freq[t], self.hash[t]
                return t
        return None

    def evict_m(self) -> int | None:
        while self.unpinned(self.M):
            t = self.unpinned(self.M)[0]
            self.M.remove(t)
            if self.freq[t] > 0:
                self.M.append(t)
                self.freq[t] -= 1
            else:
                del self.freq[t], self.hash[t]
                return t
        return None


class PlainSieve(PlainCache):
    """NSDI'24: one queue, a visited bit, a hand moving from the tail towards the head."""

    def clear(self) -> None:
        self.Q: list[int] = []
        self.visited: dict[int, bool] = {}
        self.hand: int | None = None

    def resident(self) -> list[int]:
        return self.Q

    def insert(self, x: int, h: bytes | None) -> None:
        self.Q.append(x)
        self.visited[x] = False

    def hit(self, x: int) -> None:
        self.visited[x] = True

    def next_towards_head(self, x: int) -> int | None:
        i = self.Q.index(x)
        return self.Q[i + 1] if i + 1 < len(self.Q) else None

    def drop(self, x: int) -> None:
        if self.hand == x:
            self.hand = self.next_towards_head(x)
        self.Q.remove(x)
        del self.visited[x]

    def evict(self) -> int:
        o = self.hand if self.hand is not None else self.Q[0]
        while o in self.pinned or self.visited[o]:
            if o not in self.pinned:
                self.visited[o] = False
            following = self.next_towards_head(o)
            o = following if following is not None else self.Q[0]
        self.hand = self.next_towards_head(o)
        self.Q.remove(o)
        del self.visited[o]
        return o


class PlainARC(PlainCache):
    """FAST'03 Figure 4, REPLACE run at the pop (the missed object is not known yet)."""

    def clear(self) -> None:
        self.T1: list[int] = []
        self.T2: list[int] = []
        self.B1: list[bytes] = []
        self.B2: list[bytes] = []
        self.p = 0.0
        self.hash: dict[int, bytes | None] = {}

    def resident(self) -> list[int]:
        return self.T1 + self.T2

    def insert(self, x: int, h: bytes | None) -> None:
        self.hash[x] = h
        if h is not None and h in self.B1:
            delta = 1.0 if len(self.B1) >= len(self.B2) else len(self.B2) / len(self.B1)
            self.p = min(self.p + delta, float(self.c))
            self.B1.remove(h)
            self.T2.append(x)
        elif h is not None and h in self.B2:
            delta = 1.0 if len(self.B2) >= len(self.B1) else len(self.B1) / len(self.B2)
            self.p = max(self.p - delta, 0.0)
            self.B2.remove(h)
            self.T2.append(x)
        else:
            l1 = len(self.T1) + len(self.B1)
            l2 = len(self.T2) + len(self.B2)
            if l1 == self.c:
                assert len(self.T1) < self.c
                self.B1.pop(0)
            elif l1 < self.c and l1 + l2 >= self.c and l1 + l2 == 2 * self.c:
                self.B2.pop(0)
            self.T1.append(x)

    def hit(self, x: int) -> None:
        if x in self.T1:
            self.T1.remove(x)
        else:
            self.T2.remove(x)
        self.T2.append(x)

    def returned(self, x: int) -> None:
        self.T2.remove(x)
        self.T2.append(x)

    def drop(self, x: int) -> None:
        if x in self.T1:
            self.T1.remove(x)
        else:
            self.T2.remove(x)
        del self.hash[x]

    def evict(self) -> int:
        t1, t2 = self.unpinned(self.T1), self.unpinned(self.T2)
        if t1 and (len(self.T1) > self.p or not t2):
            victim, ghost = t1[0], self.B1
            self.T1.remove(victim)
        else:
            victim, ghost = t2[0], self.B2
            self.T2.remove(victim)
        h = self.hash.pop(victim)
        if h is not None:
            for old in (self.B1, self.B2):
                if h in old:
                    old.remove(h)
            ghost.append(h)
        return victim


PLAIN_REFERENCES: dict[str, type[PlainCache]] = {
    "s3fifo": PlainS3FIFO,
    "sieve": PlainSieve,
    "arc": PlainARC,
}
