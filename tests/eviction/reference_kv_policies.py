"""WA, SAE, LHD and session-ref written plainly from their sources, for differential tests.

Plain dicts, lists and sets; every eviction recomputes what it needs over every free block or
every session: no per-category queues (WA), no score heap (SAE), no rank groups (LHD), no
partitions or content generations (session-ref). The block-manager events map onto each
source as the policy's module says (`eviction/wa.py`, `sae.py`, `lhd.py`, `session_ref.py`).
"""

from __future__ import annotations

import math
import operator
import random
from collections.abc import Iterable, Mapping, Sequence
from itertools import accumulate

from eviction import Evictor, FreedBlocks, Release


class PlainBase(Evictor):
    """Uncached blocks in a list, reused first; `free` maps a free cached block to its data."""

    name = "plain-reference"

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.uncached: list[int] = []
        self.free: dict[int, object] = {}
        self.clear()

    def clear(self) -> None:
        """Forget every block and all learned state."""

    def evict(self, now_s: float) -> int:
        raise NotImplementedError

    def dropped(self, block_id: int) -> None:
        """A block's content went away without an eviction (`push_uncached`)."""

    def reset(self, block_ids: Iterable[int]) -> None:
        self.uncached = list(block_ids)
        self.free = {}
        self.clear()

    def push_uncached(self, block_ids: Sequence[int]) -> None:
        for block_id in block_ids:
            self.dropped(block_id)
        self.uncached[0:0] = list(block_ids)

    def remove(self, block_id: int) -> None:
        if block_id in self.free:
            del self.free[block_id]
        else:
            self.uncached.remove(block_id)

    def pop_n(self, n: int, now_s: float = 0.0) -> list[int]:
        return [self.uncached.pop(0) if self.uncached else self.evict(now_s) for _ in range(n)]

    def __len__(self) -> int:
        return len(self.uncached) + len(self.free)

    def __contains__(self, block_id: object) -> bool:
        return block_id in self.uncached or block_id in self.free

    def free_block_ids(self) -> list[int]:
        raise NotImplementedError  # the differential tests compare pops


class PlainWA(PlainBase):
    """PR #22236: evict the free block with the lowest predicted reuse probability in the
    upcoming window (every block scored, not only queue heads); W = the running mean age of
    evicted blocks."""

    def __init__(
        self,
        num_blocks: int,
        categories: Mapping[str, tuple[float, float]] | None = None,
        default: tuple[float, float] = (0.5, 1e-2),
        window_weight: float = 0.01,
    ) -> None:
        self.categories = dict(categories or {})
        self.default = default
        self.weight = window_weight
        super().__init__(num_blocks)

    def clear(self) -> None:
        self.window = math.inf
        self.seq = 0

    def push_cached(self, freed: FreedBlocks, release: Release) -> None:
        for block_id in freed.block_ids:
            self.free[block_id] = (release.category, release.time_s, self.seq)
            self.seq += 1

    def probability(self, block_id: int, now_s: float) -> float:
        category, released_s, _ = self.free[block_id]
        p, rate = self.categories.get(category, self.default)
        t = max(now_s - released_s, 0.0)
        w = self.window
        if p == 0.0:
            return 0.0
        within = 1.0 if w == math.inf else 1.0 - math.exp(-rate * w)
        if p == 1.0:
            return within
        # P(reuse in (t, t + W]) / P(no reuse in (0, t]), reuse time ~ p · Exp(rate)
        return p * math.exp(-rate * t) * within / (1.0 - p + p * math.exp(-rate * t))

    def evict(self, now_s: float) -> int:
        victim = min(
            self.free, key=lambda b: (self.probability(b, now_s), self.free[b][1], self.free[b][2])
        )
        age = max(now_s - self.free[victim][1], 0.0)
        self.window = (
            age
            if self.window == math.inf
            else (1 - self.weight) * self.window + (self.weight * age)
        )
        del self.free[victim]
        return victim


class PlainSessionRef(PlainBase):
    """SGLang's soft session references with an idle timeout: a session references the chain
    of its latest release until it has been idle longer than the timeout; unreferenced free
    blocks go first, each group in release order."""

    def __init__(self, num_blocks: int, timeout_s: float = 300.0) -> None:
        self.timeout = timeout_s
        super().__init__(num_blocks)

    def clear(self) -> None:
        self.seq = 0
        self.content: dict[int, int] = {}  # block -> version of its content
        self.sessions: dict[str, dict] = {}

    def register(self, block_ids: Sequence[int], release: Release) -> None:
        sid = release.conversation_id
        if sid is None:
            return
        session = self.sessions.get(sid)
        if session is None or session["release"] is not release:
            session = self.sessions[sid] = {"last": release.time_s, "release": release}
            session["chain"] = set()  # (block, content version): only ever asked `in`
        session["chain"].update((b, self.content.get(b, 0)) for b in block_ids)

    def push_cached(self, freed: FreedBlocks, release: Release) -> None:
        self.register(freed.block_ids, release)
        for block_id in freed.block_ids:
            self.free[block_id] = self.seq
            self.seq += 1

    def note_shared_release(self, freed: FreedBlocks, release: Release) -> None:
        self.register(freed.block_ids, release)

    def dropped(self, block_id: int) -> None:
        self.content[block_id] = self.content.get(block_id, 0) + 1

    def live_chains(self, now_s: float) -> set[tuple[int, int]]:
        """What the sessions not idle past the timeout reference: (block, content version)."""
        return set().union(
            *(s["chain"] for s in self.sessions.values() if not s["last"] < now_s - self.timeout)
        )

    def referenced(self, block_id: int, now_s: float) -> bool:
        return (block_id, self.content.get(block_id, 0)) in self.live_chains(now_s)

    def evict(self, now_s: float) -> int:
        live = self.live_chains(now_s)  # one eviction asks every free block at one time
        content = self.content
        victim = min(self.free, key=lambda b: ((b, content.get(b, 0)) in live, self.free[b]))
        del self.free[victim]
        self.dropped(victim)
        return victim


class PlainSAE(PlainBase):
    """PR #50422's SAECachePolicy: touch / open_session / insert / evict with plain lists,
    sessions sorted by score at every eviction."""

    TOUCH_WEIGHT = 1500.0
    BONUS = 30000.0
    HALF_LIFE = 8.0

    def __init__(self, num_blocks: int, decay_interval: int = 500) -> None:
        self.decay_interval = decay_interval
        super().__init__(num_blocks)

    def clear(self) -> None:
        self.blocks: dict[int, bytes | None] = {}  # resident block -> hash
        self.session_keys: dict[int, list[int]] = {}
        self.key_to_session: dict[int, int] = {}
        self.stats: dict[int, dict] = {}
        self.ghost: dict[bytes, float] = {}
        self.logical_time = 0
        self.next_session_id = 0
        self.lookups_since_decay = 0
        self.current: Release | None = None

    def score(self, sid: int) -> float:
        s = self.stats[sid]
        return (
            s["last_touch"]
            + s["hits"] * self.TOUCH_WEIGHT
            + self.BONUS / (1.0 + s["prefix_depth"] / self.HALF_LIFE)
        )

    def release(self, freed: FreedBlocks, release: Release, idle: bool) -> None:
        first = release is not self.current
        if first:
            self.current = release
            self.logical_time += 1
            self.touched: set[int] = set()
            self.pointer: tuple[int, int] | None = None
            self.open: int | None = None
            self.merged = False
        keys = sorted(zip(freed.depths, freed.block_ids, freed.hashes, strict=True))
        new = []
        for depth, block_id, block_hash in keys:
            hit = block_id in self.blocks
            if block_hash is not None:
                bump = (12.0 if hit else 1.0) / math.log2(depth + 2.0)
                self.ghost[block_hash] = self.ghost.get(block_hash, 0.0) + bump
            if hit:
                sid = self.key_to_session[block_id]
                if sid not in self.touched:
                    self.touched.add(sid)
                    self.stats[sid]["hits"] += 1
                    self.stats[sid]["last_touch"] = self.logical_time
                if self.pointer is None or depth >= self.pointer[0]:
                    self.pointer = (depth, sid)
            else:
                new.append((depth, block_id, block_hash))
        if first:
            self.lookups_since_decay += 1
            if self.lookups_since_decay % self.decay_interval == 0:
                for s in self.stats.values():
                    s["hits"] *= 0.9
                resident = set(self.blocks.values())  # the resident blocks' hashes
                for key in list(self.ghost):
                    value = self.ghost[key] * 0.9
                    if key not in resident and value < 0.01:
                        del self.ghost[key]
                    else:
                        self.ghost[key] = value
        if new:
            if self.open is None:
                target = self.pointer[1] if self.pointer is not None else None
                if target is not None and target in self.stats:
                    self.open, self.merged = target, True
                    self.stats[target]["last_touch"] = self.logical_time
                else:
                    self.open, self.merged = self.next_session_id, False
                    self.next_session_id += 1
                    self.session_keys[self.open] = []
                    self.stats[self.open] = {
                        "hits": 0.0,
                        "last_touch": self.logical_time,
                        "prefix_depth": new[0][0],
                    }
            for _, block_id, block_hash in new:
                self.session_keys[self.open].append(block_id)
                self.key_to_session[block_id] = self.open
                self.blocks[block_id] = block_hash
                if not self.merged and block_hash is not None:
                    self.stats[self.open]["hits"] += self.ghost.get(block_hash, 0.0) / 12.0
        if idle:
            for block_id in freed.block_ids:
                self.free[block_id] = None

    def push_cached(self, freed: FreedBlocks, release: Release) -> None:
        self.release(freed, release, idle=True)

    def note_shared_release(self, freed: FreedBlocks, release: Release) -> None:
        self.release(freed, release, idle=False)

    def drop(self, block_id: int) -> None:
        sid = self.key_to_session.pop(block_id)
        self.session_keys[sid].remove(block_id)
        if not self.session_keys[sid]:
            del self.session_keys[sid], self.stats[sid]
        del self.blocks[block_id]

    def dropped(self, block_id: int) -> None:
        if block_id in self.blocks:
            self.drop(block_id)

    def evict(self, now_s: float) -> int:
        for sid in sorted(self.stats, key=self.score):
            for block_id in reversed(self.session_keys[sid]):
                if block_id in self.free:
                    del self.free[block_id]
                    self.drop(block_id)
                    return block_id
        raise AssertionError("nothing to evict")


class PlainLHD(PlainBase):
    """libCacheSim's LHD (update / replaced / reconfigure / getHitDensity) with wall-clock
    ages, the victim the minimum rank over every free block."""

    MAX_AGE = 1024
    CLASSES = 16

    def __init__(
        self,
        num_blocks: int,
        age_unit_s: float = 4.0,
        accesses_per_reconfiguration: int = 1 << 14,
        seed: int = 0,
    ) -> None:
        self.unit = age_unit_s
        self.period = accesses_per_reconfiguration
        self.seed = seed
        super().__init__(num_blocks)

    def clear(self) -> None:
        m, c = self.MAX_AGE, self.CLASSES
        self.tags: dict[int, dict] = {}
        self.hits = [[0.0] * m for _ in range(c)]
        self.evictions = [[0.0] * m for _ in range(c)]
        self.densities = [[(k + 1) / (a + 1) for a in range(m)] for k in range(c)]
        self.next_reconfiguration = self.period
        self.reconfigurations = 0
        self.budget = int(self.num_blocks * 0.01)
        self.rng = random.Random(self.seed)
        self.seq = 0

    def hit_age_class(self, age: int) -> int:
        if age == 0:
            return self.CLASSES - 1
        log = 0
        while age < self.MAX_AGE and log < self.CLASSES - 1:
            age <<= 1
            log += 1
        return log

    def klass(self, tag: dict) -> int:
        return self.hit_age_class(tag["last_hit_age"] + tag["last_last_hit_age"])

    def age(self, tag: dict, now_s: float) -> int:
        age = math.floor(now_s / self.unit) - tag["timestamp"]
        return min(max(age, 0), self.MAX_AGE - 1)

    def update(self, block_id: int, now_s: float) -> None:
        tag = self.tags.get(block_id)
        if tag is None:
            tag = self.tags[block_id] = {"last_last_hit_age": self.MAX_AGE, "last_hit_age": 0}
        else:
            age = self.age(tag, now_s)
            self.hits[self.klass(tag)][age] += 1
            if tag["explorer"]:
                self.budget += 1
            tag["last_last_hit_age"] = tag["last_hit_age"]
            tag["last_hit_age"] = age
        tag["timestamp"] = math.floor(now_s / self.unit)
        explore = self.rng.randrange(32) == 0
        tag["explorer"] = explore and self.budget > 0 and self.reconfigurations < 50
        if tag["explorer"]:
            self.budget -= 1
        self.next_reconfiguration -= 1
        if self.next_reconfiguration == 0:
            self.reconfigure()
            self.next_reconfiguration = self.period
            self.reconfigurations += 1

    def reconfigure(self) -> None:
        m = self.MAX_AGE
        for k in range(self.CLASSES):
            if not any(self.hits[k]) and not any(self.evictions[k]):
                # a class with no event yet: its counts stay 0, every density is 0
                self.densities[k][: m - 1] = [0.0] * (m - 1)
                continue
            hits = [h * 0.9 for h in self.hits[k]]
            evictions = [e * 0.9 for e in self.evictions[k]]
            self.hits[k], self.evictions[k] = hits, evictions
            # the running sums from age m − 1 down, one term at a time (as `accumulate` adds)
            totals_hits = list(accumulate(hits[::-1]))
            totals_events = list(accumulate(map(operator.add, hits[::-1], evictions[::-1])))
            lifetimes = list(accumulate(totals_events))
            down = [  # the densities at ages m − 1 (unused) down to 0
                total_hits / lifetime if total_events > 1e-5 else 0.0
                for total_hits, total_events, lifetime in zip(
                    totals_hits, totals_events, lifetimes, strict=True
                )
            ]
            self.densities[k][: m - 1] = down[:0:-1]

    def rank(self, block_id: int, now_s: float) -> float:
        tag = self.tags[block_id]
        age = self.age(tag, now_s)
        if age == self.MAX_AGE - 1:
            return -math.inf
        density = self.densities[self.klass(tag)][age]
        return density + 1.0 if tag["explorer"] else density

    def push_cached(self, freed: FreedBlocks, release: Release) -> None:
        for block_id in freed.block_ids:
            self.update(block_id, release.time_s)
            self.free[block_id] = self.seq
            self.seq += 1

    def note_shared_release(self, freed: FreedBlocks, release: Release) -> None:
        for block_id in freed.block_ids:
            self.update(block_id, release.time_s)

    def replaced(self, block_id: int, now_s: float | None) -> None:
        tag = self.tags.pop(block_id)
        if now_s is not None:
            self.evictions[self.klass(tag)][self.age(tag, now_s)] += 1
        if tag["explorer"]:
            self.budget += 1

    def dropped(self, block_id: int) -> None:
        if block_id in self.tags:
            self.replaced(block_id, None)

    def evict(self, now_s: float) -> int:
        victim = min(
            self.free,
            key=lambda b: (self.rank(b, now_s), self.tags[b]["timestamp"], self.free[b]),
        )
        del self.free[victim]
        self.replaced(victim, now_s)
        return victim
