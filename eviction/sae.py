"""SAE: session-aware eviction; blocks grouped by the request that stored them, the worst
session evicted first, each from its tail.

vLLM PR #50422 (open), `vllm/v1/kv_offload/cpu/policies/sae.py`, with the PR's constants; a
request's release is its touch and its store. The ghost table decays lazily, bit for bit as
the eager decay would.

The PR's rules, their mapping onto the block manager and the structures: docs/design.md,
"SAE's source".
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Sequence
from typing import ClassVar

from eviction.base import Evictor, FreedBlocks, FreeFlags, Release, dry_run_copy
from eviction.linked_list import BlockList

NO_SESSION = -1


class _Session:
    __slots__ = ("free", "hits", "in_heap", "keys", "last_touch", "prefix_depth", "version")

    def __init__(self, last_touch: int, prefix_depth: int) -> None:
        self.hits = 0.0
        self.last_touch = last_touch
        self.prefix_depth = prefix_depth
        self.keys: dict[int, None] = {}  # block ids in insertion order; the tail is the end
        self.free = 0  # keys that are idle (evictable)
        self.version = 0
        self.in_heap = False  # an entry with the current version is in the heap


class SAEEvictor(FreeFlags, Evictor):
    """Uncached blocks in a list, then sessions worst first, each from its tail."""

    name: ClassVar[str] = "sae"

    PREFIX_DEPTH_BONUS_SCALE: ClassVar[float] = 30000.0
    PREFIX_DEPTH_HALF_LIFE: ClassVar[float] = 8.0
    TOUCH_WEIGHT: ClassVar[float] = 1500.0
    GHOST_PRUNE_THRESHOLD: ClassVar[float] = 0.01
    GHOST_SWEEP_MIN: ClassVar[int] = 1 << 16  # no sweep while the table is smaller

    def __init__(
        self,
        num_blocks: int,
        decay_interval: int = 500,
        decay_factor: float = 0.9,
        ghost_hit_weight: float = 12.0,
        ghost_miss_weight: float = 1.0,
        ghost_norm: float = 12.0,
    ) -> None:
        if num_blocks < 0:
            raise ValueError(f"num_blocks must be >= 0, got {num_blocks}")
        if isinstance(decay_interval, bool) or not isinstance(decay_interval, int):
            raise ValueError(f"decay_interval must be an int, got {decay_interval!r}")
        if decay_interval < 1:
            raise ValueError(f"decay_interval must be >= 1, got {decay_interval}")
        if not 0.0 < decay_factor <= 1.0:
            raise ValueError(f"decay_factor must be in (0, 1], got {decay_factor!r}")
        if not ghost_norm > 0.0:
            raise ValueError(f"ghost_norm must be > 0, got {ghost_norm!r}")
        self._num_blocks = num_blocks
        self.decay_interval = decay_interval
        self.decay_factor = decay_factor
        self.ghost_hit_weight = ghost_hit_weight
        self.ghost_miss_weight = ghost_miss_weight
        self.ghost_norm = ghost_norm
        self._uncached = BlockList(num_blocks)
        self._clear()

    def _clear(self) -> None:
        n = self._num_blocks
        self._resident = [False] * n  # holds cached content SAE has seen released
        self._free = [False] * n  # resident and idle
        self._hash: list[bytes | None] = [None] * n
        self._session_of = [NO_SESSION] * n
        self._num_free = 0
        self._sessions: dict[int, _Session] = {}
        self._heap: list[tuple[float, int, int]] = []  # (score, session id, version)
        # hash -> [score, decays applied]: current once brought up to `self._decays`
        self._ghost: dict[bytes, list] = {}
        self._decays = 0
        self._ghost_sweep_at = self.GHOST_SWEEP_MIN
        self._resident_hashes: dict[bytes, int] = {}
        self.logical_time = 0
        self._next_session_id = 0
        self._touches = 0
        # The release being processed: its touched sessions, deepest hit, open session.
        self._release: Release | None = None
        self._touched: set[int] = set()
        self._deepest_hit: tuple[int, int] | None = None  # (depth, session id)
        self._open: int | None = None
        self._open_is_merged = False

    def session_score(self, session_id: int) -> float:
        s = self._sessions[session_id]
        return self._score(s)

    def _score(self, s: _Session) -> float:
        bonus = self.PREFIX_DEPTH_BONUS_SCALE / (1.0 + s.prefix_depth / self.PREFIX_DEPTH_HALF_LIFE)
        return s.last_touch + s.hits * self.TOUCH_WEIGHT + bonus

    @staticmethod
    def _position_weight(position: int) -> float:
        return 1.0 / math.log2(position + 2.0)

    def ghost_score(self, block_hash: bytes) -> float:
        """The hash's ghost score now (0.0 when it has none, or a decay pruned it)."""
        entry = self._ghost_current(block_hash)
        return 0.0 if entry is None else entry[0]

    def _ghost_current(self, block_hash: bytes) -> list | None:
        """The hash's ghost entry after the decays it missed (None if one pruned it). Only
        valid while the hash's residency has not changed since the entry was last current."""
        entry = self._ghost.get(block_hash)
        if entry is None or entry[1] == self._decays:
            return entry
        score, factor = entry[0], self.decay_factor
        for _ in range(self._decays - entry[1]):
            score *= factor
        if score < self.GHOST_PRUNE_THRESHOLD and block_hash not in self._resident_hashes:
            del self._ghost[block_hash]
            return None
        entry[0], entry[1] = score, self._decays
        return entry

    # -- a release: touch, then store ---------------------------------------------------
    def _release_blocks(self, freed: FreedBlocks, release: Release, idle: bool) -> None:
        if release is not self._release:
            self._release = release
            self.logical_time += 1
            self._touched = set()
            self._deepest_hit = None
            self._open = None
            self._open_is_merged = False
            first_call = True
        else:
            first_call = False
        ids, depths, hashes = freed.block_ids, freed.depths, freed.hashes
        order = sorted(range(len(ids)), key=depths.__getitem__)
        resident, session_of, sessions = self._resident, self._session_of, self._sessions
        ghost, touched, decays = self._ghost, self._touched, self._decays
        changed: set[int] = set()
        new: list[int] = []
        for i in order:
            block_id, depth, block_hash = ids[i], depths[i], hashes[i]
            hit = resident[block_id]
            if block_hash is not None:
                weight = self.ghost_hit_weight if hit else self.ghost_miss_weight
                bump = self._position_weight(depth) * weight
                entry = ghost.get(block_hash)
                if entry is not None and entry[1] != decays:
                    entry = self._ghost_current(block_hash)
                if entry is None:
                    ghost[block_hash] = [bump, decays]
                else:
                    entry[0] += bump
            if not hit:
                new.append(i)
                continue
            session_id = session_of[block_id]
            if session_id not in touched:
                touched.add(session_id)
                s = sessions[session_id]
                s.hits += 1.0
                s.last_touch = self.logical_time
                changed.add(session_id)
            deepest = self._deepest_hit
            if deepest is None or depth >= deepest[0]:
                self._deepest_hit = (depth, session_id)
        if first_call:
            self._touches += 1
            if self._touches % self.decay_interval == 0:
                self._decay()
        if new:
            self._store([ids[i] for i in new], [hashes[i] for i in new], depths[new[0]], changed)
        if idle:
            free = self._free
            for block_id in ids:
                free[block_id] = True
                sessions[session_of[block_id]].free += 1
                changed.add(session_of[block_id])
            self._num_free += len(ids)
        for session_id in changed:
            self._requeue(session_id)

    def _store(
        self,
        block_ids: list[int],
        hashes: list[bytes | None],
        prefix_depth: int,
        changed: set[int],
    ) -> None:
        sessions = self._sessions
        if self._open is None:
            deepest = self._deepest_hit
            target = deepest[1] if deepest is not None else None
            if target is not None and target in sessions:
                sessions[target].last_touch = self.logical_time
                self._open, self._open_is_merged = target, True
            else:
                session_id = self._next_session_id
                self._next_session_id += 1
                sessions[session_id] = _Session(self.logical_time, prefix_depth)
                self._open, self._open_is_merged = session_id, False
        session_id = self._open
        s = sessions[session_id]
        changed.add(session_id)
        resident, hash_of, session_of = self._resident, self._hash, self._session_of
        resident_hashes, norm = self._resident_hashes, self.ghost_norm
        ghost, decays = self._ghost, self._decays
        for block_id, block_hash in zip(block_ids, hashes, strict=True):
            resident[block_id] = True
            hash_of[block_id] = block_hash
            session_of[block_id] = session_id
            s.keys[block_id] = None
            if block_hash is not None:
                # current before the residency changes (docs/design.md, "SAE's source")
                entry = ghost.get(block_hash)
                if entry is not None and entry[1] != decays:
                    entry = self._ghost_current(block_hash)
                resident_hashes[block_hash] = resident_hashes.get(block_hash, 0) + 1
                if not self._open_is_merged:
                    s.hits += (0.0 if entry is None else entry[0]) / norm

    def _requeue(self, session_id: int) -> None:
        """The session's score (or idle count) changed: queue an entry with a new version."""
        s = self._sessions.get(session_id)
        if s is None:
            return
        s.version += 1
        s.in_heap = s.free > 0
        if s.in_heap:
            heapq.heappush(self._heap, (self._score(s), session_id, s.version))

    def _decay(self) -> None:
        factor = self.decay_factor
        for s in self._sessions.values():
            s.hits *= factor
        self._decays += 1  # the ghost table's entries catch up when read (the docstring)
        if len(self._ghost) >= self._ghost_sweep_at:
            for block_hash in list(self._ghost):
                self._ghost_current(block_hash)
            self._ghost_sweep_at = max(self.GHOST_SWEEP_MIN, 2 * len(self._ghost))
        self._rebuild_heap()

    def _rebuild_heap(self) -> None:
        heap = []
        for session_id, s in self._sessions.items():
            s.in_heap = s.free > 0
            if s.in_heap:
                heap.append((self._score(s), session_id, s.version))
        heapq.heapify(heap)
        self._heap = heap

    def _leave_session(self, block_id: int) -> None:
        """The block's content leaves the cache (an eviction or a drop)."""
        session_id = self._session_of[block_id]
        s = self._sessions[session_id]
        del s.keys[block_id]
        if not s.keys:
            del self._sessions[session_id]  # its heap entries go stale
        self._session_of[block_id] = NO_SESSION
        self._resident[block_id] = False
        block_hash = self._hash[block_id]
        if block_hash is not None:
            count = self._resident_hashes[block_hash] - 1
            if count:
                self._resident_hashes[block_hash] = count
            else:
                entry = self._ghost.get(block_hash)
                if entry is not None and entry[1] != self._decays:
                    self._ghost_current(block_hash)  # current before it stops being resident
                del self._resident_hashes[block_hash]
        self._hash[block_id] = None

    # -- the evictor contract -------------------------------------------------------------
    def reset(self, block_ids: Iterable[int]) -> None:
        self._uncached.clear_to(block_ids)
        self._clear()

    def push_uncached(self, block_ids: Sequence[int]) -> None:
        resident = self._resident
        for block_id in block_ids:
            if resident[block_id]:
                self._leave_session(block_id)
        self._uncached.prepend_n(block_ids)

    def push_cached(self, freed: FreedBlocks, release: Release) -> None:
        self._release_blocks(freed, release, idle=True)

    def note_shared_release(self, freed: FreedBlocks, release: Release) -> None:
        self._release_blocks(freed, release, idle=False)

    def remove(self, block_id: int) -> None:
        if not self._free[block_id]:
            self._uncached.remove(block_id)
            return
        self._free[block_id] = False
        self._num_free -= 1
        self._sessions[self._session_of[block_id]].free -= 1

    def pop_n(self, n: int, now_s: float = 0.0) -> list[int]:
        uncached = self._uncached
        from_uncached = min(n, uncached.size)
        if n > from_uncached + self._num_free:
            raise IndexError(f"cannot pop {n} blocks: only {len(self)} are free")
        out = uncached.pop_n(from_uncached)
        for _ in range(n - from_uncached):
            out.append(self._evict())
        if len(self._heap) > 2 * len(self._sessions) + 1024:
            self._rebuild_heap()
        return out

    def _evict(self) -> int:
        heap, sessions = self._heap, self._sessions
        while True:
            assert heap, "sae: evict called with no idle block"
            _, session_id, version = heap[0]
            s = sessions.get(session_id)
            if s is None or s.version != version:
                heapq.heappop(heap)
                continue
            if not s.free:  # every key of the session is in use: out until one is freed
                heapq.heappop(heap)
                s.in_heap = False
                continue
            break
        free = self._free
        victim = next(block_id for block_id in reversed(s.keys) if free[block_id])
        free[victim] = False
        self._num_free -= 1
        s.free -= 1
        self._leave_session(victim)
        return victim

    def free_block_ids(self) -> list[int]:
        """Uncached blocks, then a dry run of evictions on a copy. O(n), for tests."""
        dry = dry_run_copy(self)
        return [*self._uncached, *(dry._evict() for _ in range(self._num_free))]

    def check_invariants(self) -> None:
        Evictor.check_invariants(self)
        self._uncached.check_invariants()
        resident, free, session_of = self._resident, self._free, self._session_of
        assert sum(free) == self._num_free, "sae: the idle count is out of sync"
        members: set[int] = set()
        hashes: dict[bytes, int] = {}
        valid = {(sid, v) for _, sid, v in self._heap}
        for session_id, s in self._sessions.items():
            assert s.keys, f"sae: session {session_id} is empty but kept"
            assert not members & s.keys.keys(), "sae: a block is in two sessions"
            members |= s.keys.keys()
            for block_id in s.keys:
                assert resident[block_id], f"sae: session key {block_id} is not resident"
                assert session_of[block_id] == session_id, f"sae: block {block_id}'s session"
                block_hash = self._hash[block_id]
                if block_hash is not None:
                    hashes[block_hash] = hashes.get(block_hash, 0) + 1
            assert s.free == sum(free[b] for b in s.keys), f"sae: session {session_id} idle count"
            if s.free:
                assert s.in_heap and (session_id, s.version) in valid, (
                    f"sae: session {session_id} has idle blocks but no current heap entry"
                )
                entry = next(e for e in self._heap if e[1:] == (session_id, s.version))
                assert entry[0] == self._score(s), f"sae: session {session_id}'s entry is stale"
        assert members == {b for b in range(self._num_blocks) if resident[b]}, (
            "sae: the sessions do not hold exactly the resident blocks"
        )
        for block_id in range(self._num_blocks):
            assert not free[block_id] or resident[block_id], f"sae: idle block {block_id}"
            assert not (free[block_id] and block_id in self._uncached), (
                f"sae: block {block_id} is both idle and uncached"
            )
        assert hashes == self._resident_hashes, "sae: resident hash counts are out of sync"
