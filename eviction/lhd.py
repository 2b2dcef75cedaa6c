"""LHD: Least Hit Density; evict the block with the fewest expected hits per unit of
space-time, given its age and its class.

Beckmann, Chen, Cidon, NSDI'18, as the authors' code in libCacheSim has it. An access is a
release; ages are seconds of the replay's clock in 4-s ticks; the victim is the exact minimum
over all free blocks, so a replay is deterministic.

The source step by step, the choices of this port and the structure: docs/design.md,
"LHD's source".
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Iterable, Sequence
from typing import ClassVar

import numpy as np

from eviction.base import Evictor, FreedBlocks, Release
from eviction.linked_list import BlockList

HIT_AGE_CLASSES = 16
MAX_AGE = 1024
EWMA_DECAY = 0.9
EXPLORER_BUDGET_FRACTION = 0.01
EXPLORE_INVERSE_PROBABILITY = 32
EXPLORATION_RECONFIGURATIONS = 50  # libCacheSim explores only during the first 50
DEFAULT_AGE_UNIT_S = 4.0
DEFAULT_ACCESSES_PER_RECONFIGURATION = 1 << 14
LOWEST = -math.inf

GroupKey = tuple[int, int, bool]  # (class, release tick, explorer)


def hit_age_class(age: int) -> int:
    """libCacheSim's hitAgeClass: about log2(MAX_AGE / age); age 0 is the last class."""
    if age == 0:
        return HIT_AGE_CLASSES - 1
    log = 0
    while age < MAX_AGE and log < HIT_AGE_CLASSES - 1:
        age <<= 1
        log += 1
    return log


# hit_age_class of every sum of two hit ages (each below MAX_AGE, or MAX_AGE for "none"): a
# table look-up instead of a loop on every access
_HIT_AGE_CLASS = tuple(hit_age_class(age) for age in range(2 * MAX_AGE + 1))


# libCacheSim's initial hit densities, (class + 1) / (age + 1): each evictor starts from a copy
_INITIAL_HIT_DENSITIES = tuple(
    [(c + 1) / (a + 1) for a in range(MAX_AGE)] for c in range(HIT_AGE_CLASSES)
)


def model_hit_densities(hits: list[float], evictions: list[float]) -> list[float]:
    """libCacheSim's modelHitDensity for one class (its entry at MAX_AGE − 1 is unused)."""
    return _model_hit_densities(np.array([hits]), np.array([evictions]))[0].tolist()


def _model_hit_densities(hits: np.ndarray, evictions: np.ndarray) -> np.ndarray:
    """`model_hit_densities` of each row (one class a row), its loop as running sums.

    The loop walks the ages down from MAX_AGE − 1, adding one term at a time; running sums
    over the reversed rows (`np.cumsum`, which adds strictly in order, one IEEE addition per
    term, as the loop does) give every partial sum it reaches, so each density is the same
    quotient of the same two doubles, bit for bit."""
    total_hits = np.cumsum(hits[:, ::-1], axis=1)
    total_events = np.cumsum(hits[:, ::-1] + evictions[:, ::-1], axis=1)
    lifetime = np.cumsum(total_events, axis=1)
    reversed_densities = np.zeros_like(total_hits)
    np.divide(total_hits, lifetime, out=reversed_densities, where=total_events > 1e-5)
    densities = np.zeros_like(total_hits)
    densities[:, : MAX_AGE - 1] = reversed_densities[:, :0:-1]  # ages MAX_AGE − 2 .. 0
    return densities


class _GroupTable:
    """The free groups' keys and head push orders in arrays, so that a pop ranks every group
    in one vectorised step instead of a Python loop over thousands of groups (a large pool
    holds one group per class, release tick and explorer flag)."""

    def __init__(self) -> None:
        self._slot: dict[GroupKey, int] = {}
        self._keys: list[GroupKey | None] = []
        self._spare: list[int] = []
        self._cls = np.zeros(0, dtype=np.int64)
        self._tick = np.zeros(0, dtype=np.int64)
        self._explorer = np.zeros(0, dtype=np.float64)  # 1.0 adds the explorers' bonus
        self._head = np.zeros(0, dtype=np.int64)  # push order of the group's first block
        self._alive = np.zeros(0, dtype=bool)

    def add(self, key: GroupKey, head_seq: int) -> None:
        if self._spare:
            slot = self._spare.pop()
            self._keys[slot] = key
        else:
            slot = len(self._keys)
            self._keys.append(key)
            if slot == len(self._alive):
                self._grow(max(64, 2 * slot))
        self._slot[key] = slot
        cls, tick, explorer = key
        self._cls[slot] = cls
        self._tick[slot] = tick
        self._explorer[slot] = 1.0 if explorer else 0.0
        self._head[slot] = head_seq
        self._alive[slot] = True

    def set_head(self, key: GroupKey, head_seq: int) -> None:
        self._head[self._slot[key]] = head_seq

    def drop(self, key: GroupKey) -> None:
        slot = self._slot.pop(key)
        self._alive[slot] = False
        self._keys[slot] = None
        self._spare.append(slot)

    def check_against(self, groups: dict[GroupKey, dict[int, None]], seqs: list[int]) -> None:
        assert set(self._slot) == set(groups), "lhd: the group table lists other groups"
        for key, slot in self._slot.items():
            assert self._alive[slot] and self._keys[slot] == key, f"lhd: table slot of {key}"
            head = next(iter(groups[key]))
            assert self._head[slot] == seqs[head], f"lhd: table head of group {key}"
        assert int(self._alive.sum()) == len(self._slot), "lhd: a dropped table slot is alive"

    def _grow(self, capacity: int) -> None:
        def grown(a: np.ndarray) -> np.ndarray:
            out = np.zeros(capacity, dtype=a.dtype)
            out[: len(a)] = a
            return out

        self._cls, self._tick, self._explorer = map(grown, (self._cls, self._tick, self._explorer))
        self._head, self._alive = grown(self._head), grown(self._alive)

    def first_groups(
        self, n: int, now_tick: int, densities: np.ndarray, groups: dict[GroupKey, dict[int, None]]
    ) -> list[tuple[float, GroupKey]]:
        """(rank, key) of the fewest groups, in pop order (rank, tick, head push order), that
        hold the first `n` blocks of the pop, with every group that ties the last one on
        (rank, tick): a pop merges only those, so it takes exactly the blocks that merging
        every group would. The ranks are `_rank`'s, element for element."""
        live = np.flatnonzero(self._alive[: len(self._keys)])
        tick = self._tick[live]
        age = now_tick - tick
        oldest = MAX_AGE - 1
        lowest = age >= oldest
        np.clip(age, 0, oldest, out=age)
        rank = densities[self._cls[live], age] + self._explorer[live]
        rank[lowest] = LOWEST
        order = np.lexsort((self._head[live], tick, rank))
        out: list[tuple[float, GroupKey]] = []
        keys = self._keys
        total = 0
        last: tuple[float, int] | None = None
        for i in order.tolist():
            r, t = float(rank[i]), int(tick[i])
            if last is not None and (r, t) != last:
                break
            key = keys[live[i]]
            assert key is not None
            out.append((r, key))
            total += len(groups[key])
            if last is None and total >= n:
                last = (r, t)
        return out


class LHDEvictor(Evictor):
    """Uncached blocks in a list, then free cached blocks grouped by rank-sharing key."""

    name: ClassVar[str] = "lhd"

    def __init__(
        self,
        num_blocks: int,
        age_unit_s: float = DEFAULT_AGE_UNIT_S,
        accesses_per_reconfiguration: int = DEFAULT_ACCESSES_PER_RECONFIGURATION,
        seed: int = 0,
    ) -> None:
        if num_blocks < 0:
            raise ValueError(f"num_blocks must be >= 0, got {num_blocks}")
        if not (isinstance(age_unit_s, int | float) and math.isfinite(age_unit_s)) or not (
            age_unit_s > 0
        ):
            raise ValueError(f"age_unit_s must be a finite number > 0, got {age_unit_s!r}")
        if accesses_per_reconfiguration < 1:
            raise ValueError(
                f"accesses_per_reconfiguration must be >= 1, got {accesses_per_reconfiguration}"
            )
        self._num_blocks = num_blocks
        self.age_unit_s = float(age_unit_s)
        self.accesses_per_reconfiguration = accesses_per_reconfiguration
        self.seed = seed
        self._uncached = BlockList(num_blocks)
        self._clear()

    def _clear(self) -> None:
        n = self._num_blocks
        self._resident = [False] * n
        self._tick = [0] * n  # tick of the last access
        self._last_hit_age = [0] * n
        self._last_last_hit_age = [0] * n
        self._explorer = [False] * n
        self._seq = [0] * n  # push order of a free block
        self._group_of: list[GroupKey | None] = [None] * n  # set while free
        self._groups: dict[GroupKey, dict[int, None]] = {}  # free blocks, push order
        self._table = _GroupTable()  # the same groups, for ranking them all at once
        self._density_array: np.ndarray | None = None  # hit_densities as an array
        self._next_seq = 0
        self._num_free = 0
        self.hits = [[0.0] * MAX_AGE for _ in range(HIT_AGE_CLASSES)]
        self.evictions = [[0.0] * MAX_AGE for _ in range(HIT_AGE_CLASSES)]
        self.hit_densities = [row.copy() for row in _INITIAL_HIT_DENSITIES]
        self._until_reconfiguration = self.accesses_per_reconfiguration
        self.reconfigurations = 0
        self.explorer_budget = int(self._num_blocks * EXPLORER_BUDGET_FRACTION)
        self._rng = random.Random(self.seed)
        self._clock_s = 0.0

    def _ticks(self, time_s: float) -> int:
        return math.floor(time_s / self.age_unit_s)

    def _class_of(self, block_id: int) -> int:
        return _HIT_AGE_CLASS[self._last_hit_age[block_id] + self._last_last_hit_age[block_id]]

    def _age(self, block_id: int, now_tick: int) -> int:
        return min(max(now_tick - self._tick[block_id], 0), MAX_AGE - 1)

    def _rank(self, cls: int, age: int, explorer: bool) -> float:
        if age == MAX_AGE - 1:
            return LOWEST
        density = self.hit_densities[cls][age]
        return density + 1.0 if explorer else density

    # -- accesses, evictions, the model ---------------------------------------------------
    def _access(self, block_ids: Sequence[int], time_s: float) -> None:
        if time_s > self._clock_s:
            self._clock_s = time_s
        now_tick = self._ticks(time_s)
        resident, explorer = self._resident, self._explorer
        # `self._rng.randrange(EXPLORE_INVERSE_PROBABILITY)`, inlined as CPython computes it
        # (`_randbelow_with_getrandbits`: draws of n.bit_length() bits until one is below n),
        # so the same stream of draws without two Python frames per access.
        getrandbits, below = self._rng.getrandbits, EXPLORE_INVERSE_PROBABILITY
        bits = below.bit_length()
        tick, last_hit, last_last_hit = self._tick, self._last_hit_age, self._last_last_hit_age
        oldest = MAX_AGE - 1
        for block_id in block_ids:
            if resident[block_id]:
                age = now_tick - tick[block_id]  # `_age`, inlined
                age = 0 if age < 0 else (oldest if age > oldest else age)
                previous = last_hit[block_id]
                self.hits[_HIT_AGE_CLASS[previous + last_last_hit[block_id]]][age] += 1.0
                if explorer[block_id]:
                    self.explorer_budget += 1
                last_last_hit[block_id] = previous
                last_hit[block_id] = age
            else:
                resident[block_id] = True
                last_last_hit[block_id] = MAX_AGE
                last_hit[block_id] = 0
            tick[block_id] = now_tick
            draw = getrandbits(bits)
            while draw >= below:
                draw = getrandbits(bits)
            explore = draw == 0
            if (
                explore
                and self.explorer_budget > 0
                and self.reconfigurations < EXPLORATION_RECONFIGURATIONS
            ):
                explorer[block_id] = True
                self.explorer_budget -= 1
            else:
                explorer[block_id] = False
            self._until_reconfiguration -= 1
            if self._until_reconfiguration == 0:
                self._reconfigure()
                self._until_reconfiguration = self.accesses_per_reconfiguration
                self.reconfigurations += 1

    def _reconfigure(self) -> None:
        # every class at once, in arrays: the same products, sums and quotients as a loop
        # over the classes and ages (`_model_hit_densities`); a class with no event yet
        # stays all zeros (decayed zeros are zeros, and its densities are 0), so only the
        # others are converted and summed
        live = [k for k in range(HIT_AGE_CLASSES) if any(self.hits[k]) or any(self.evictions[k])]
        densities = np.zeros((HIT_AGE_CLASSES, MAX_AGE))
        if live:
            hits = np.array([self.hits[k] for k in live]) * EWMA_DECAY
            evictions = np.array([self.evictions[k] for k in live]) * EWMA_DECAY
            densities[live] = _model_hit_densities(hits, evictions)
            for k, h, e in zip(live, hits.tolist(), evictions.tolist(), strict=True):
                self.hits[k], self.evictions[k] = h, e
        densities[:, MAX_AGE - 1] = [row[MAX_AGE - 1] for row in self.hit_densities]
        self.hit_densities = densities.tolist()
        self._density_array = densities

    def _forget(self, block_id: int, now_tick: int | None) -> None:
        """The block's content leaves: an eviction at `now_tick` is recorded, a drop is not."""
        if now_tick is not None:  # `_age` and `_class_of`, inlined (one call per eviction)
            age = now_tick - self._tick[block_id]
            age = 0 if age < 0 else min(age, MAX_AGE - 1)
            cls = _HIT_AGE_CLASS[self._last_hit_age[block_id] + self._last_last_hit_age[block_id]]
            self.evictions[cls][age] += 1.0
        if self._explorer[block_id]:
            self.explorer_budget += 1
            self._explorer[block_id] = False
        self._resident[block_id] = False

    # -- the evictor contract -------------------------------------------------------------
    def reset(self, block_ids: Iterable[int]) -> None:
        self._uncached.clear_to(block_ids)
        self._clear()

    def push_uncached(self, block_ids: Sequence[int]) -> None:
        for block_id in block_ids:
            if self._resident[block_id]:
                self._forget(block_id, None)
        self._uncached.prepend_n(block_ids)

    def push_cached(self, freed: FreedBlocks, release: Release) -> None:
        self._access(freed.block_ids, release.time_s)
        groups, group_of, seqs, tick, explorer = (
            self._groups,
            self._group_of,
            self._seq,
            self._tick,
            self._explorer,
        )
        last_hit, last_last_hit = self._last_hit_age, self._last_last_hit_age
        seq = self._next_seq
        for block_id in freed.block_ids:
            cls = _HIT_AGE_CLASS[last_hit[block_id] + last_last_hit[block_id]]  # `_class_of`
            key = (cls, tick[block_id], explorer[block_id])
            group = groups.get(key)
            if group is None:
                group = groups[key] = {}
                self._table.add(key, seq)
            group[block_id] = None
            group_of[block_id] = key
            seqs[block_id] = seq
            seq += 1
        self._next_seq = seq
        self._num_free += len(freed.block_ids)

    def note_shared_release(self, freed: FreedBlocks, release: Release) -> None:
        self._access(freed.block_ids, release.time_s)

    def remove(self, block_id: int) -> None:
        key = self._group_of[block_id]
        if key is None:
            self._uncached.remove(block_id)
            return
        group = self._groups[key]
        was_head = next(iter(group)) == block_id
        del group[block_id]
        if not group:
            del self._groups[key]
            self._table.drop(key)
        elif was_head:  # a later block leaves the group's head where it is
            for head in group:
                self._table.set_head(key, self._seq[head])
                break
        self._group_of[block_id] = None
        self._num_free -= 1

    def pop_n(self, n: int, now_s: float = 0.0) -> list[int]:
        uncached = self._uncached
        from_uncached = min(n, uncached.size)
        if n > from_uncached + self._num_free:
            raise IndexError(f"cannot pop {n} blocks: only {len(self)} are free")
        out = uncached.pop_n(from_uncached)
        if now_s > self._clock_s:
            self._clock_s = now_s
        if n > from_uncached:
            out += self._evict_n(n - from_uncached, now_s)
        return out

    def _evict_n(self, n: int, now_s: float) -> list[int]:
        now_tick = self._ticks(now_s)
        groups, seqs, table = self._groups, self._seq, self._table
        if self._density_array is None:
            self._density_array = np.array(self.hit_densities, dtype=np.float64)
        heap = []
        for r, key in table.first_groups(n, now_tick, self._density_array, groups):
            for head in groups[key]:
                heap.append((r, key[1], seqs[head], key))
                break
        heapq.heapify(heap)
        out = []
        group_of = self._group_of
        for _ in range(n):
            r, tick, _, key = heap[0]
            group = groups[key]
            victim = next(iter(group))
            del group[victim]
            if group:
                head_seq = seqs[next(iter(group))]
                heapq.heapreplace(heap, (r, tick, head_seq, key))
                table.set_head(key, head_seq)
            else:
                heapq.heappop(heap)
                del groups[key]
                table.drop(key)
            group_of[victim] = None
            self._num_free -= 1
            self._forget(victim, now_tick)
            out.append(victim)
        return out

    def __len__(self) -> int:
        return self._uncached.size + self._num_free

    def __contains__(self, block_id: object) -> bool:
        if not isinstance(block_id, int) or not 0 <= block_id < self._num_blocks:
            return False
        # `in self._uncached` past the checks just made
        return (
            self._group_of[block_id] is not None or self._uncached._nodes[block_id].prev is not None
        )

    def hit_density(self, block_id: int, now_s: float) -> float:
        """The rank of a free cached block at `now_s` (lower is evicted first)."""
        now_tick = self._ticks(now_s)
        return self._rank(
            self._class_of(block_id), self._age(block_id, now_tick), self._explorer[block_id]
        )

    def free_block_ids(self, now_s: float | None = None) -> list[int]:
        """The pop order at `now_s` (default: the latest time seen). Ranks do not change
        during a pop, so it is the free blocks sorted by (rank, tick, push order). For tests."""
        now_tick = self._ticks(self._clock_s if now_s is None else now_s)
        free = [b for group in self._groups.values() for b in group]
        order = sorted(
            free,
            key=lambda b: (
                self._rank(self._class_of(b), self._age(b, now_tick), self._explorer[b]),
                self._tick[b],
                self._seq[b],
            ),
        )
        return [*self._uncached, *order]

    def check_invariants(self) -> None:
        Evictor.check_invariants(self)
        self._uncached.check_invariants()
        members = 0
        for key, group in self._groups.items():
            assert group, f"lhd: group {key} is empty but kept"
            cls, tick, explorer = key
            previous = -1
            for block_id in group:
                members += 1
                assert self._group_of[block_id] == key, f"lhd: block {block_id}'s group"
                assert self._resident[block_id], f"lhd: free block {block_id} not resident"
                assert self._class_of(block_id) == cls and self._tick[block_id] == tick, (
                    f"lhd: block {block_id} is in the group of another class or tick"
                )
                assert self._explorer[block_id] == explorer, f"lhd: block {block_id} explorer"
                assert self._seq[block_id] > previous, f"lhd: group {key} out of push order"
                previous = self._seq[block_id]
                assert block_id not in self._uncached, f"lhd: block {block_id} also uncached"
        self._table.check_against(self._groups, self._seq)
        assert members == self._num_free == sum(g is not None for g in self._group_of), (
            "lhd: the free count is out of sync with the groups"
        )
        explorers = sum(1 for b in range(self._num_blocks) if self._explorer[b])
        assert self.explorer_budget + explorers == int(
            self._num_blocks * EXPLORER_BUDGET_FRACTION
        ), "lhd: the explorer budget leaks"
        assert all(self._explorer[b] <= self._resident[b] for b in range(self._num_blocks)), (
            "lhd: an explorer that is not resident"
        )
