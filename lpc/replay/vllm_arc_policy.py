# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""vLLM's own ARC policy for its CPU offload tier, transcribed so that the two-tier replay runs
it without vLLM installed: the replay's CPU-tier policy `vllm-arc`.

Source: vllm==0.33.0, `vllm/v1/kv_offload/cpu/policies/arc.py` (`ARCCachePolicy`). Copyright
contributors to the vLLM project; licensed under the Apache License, Version 2.0
(https://www.apache.org/licenses/LICENSE-2.0). The methods are vLLM's statement for
statement; `ReplayARCCachePolicy` only adds what the replay's tier reads.

What differs from vLLM's file, the checks, and how it differs from the replay's `arc`:
docs/design.md, "vLLM's ARC, transcribed".
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

OffloadKey = Any  # vLLM's `OffloadKey` (bytes); the replay's block hashes
ChunkStatus = Any  # vLLM's `ChunkStatus`: `ref_cnt` and `is_ready`
ReqContext = Any  # vLLM's `ReqContext`: `get_offload_key_position`


def order_request_keys(
    key_groups: Sequence[Sequence[OffloadKey]], req_context: ReqContext
) -> list[OffloadKey]:
    """Return one head-to-tail order across all KV cache groups."""
    keys = [key for group in key_groups for key in group]
    positions = {
        key: position
        for key in keys
        if (position := req_context.get_offload_key_position(key)) is not None
    }
    if len(positions) == len(keys):
        keys.sort(key=positions.__getitem__)
    return keys


class ARCCachePolicy:
    """ARC (Adaptive Replacement Cache) cache policy.

    Data Structures:
        T1: Recent cache containing chunks accessed once.
        T2: Frequent cache containing chunks accessed multiple times.
        B1/B2: Ghost lists tracking recently evicted chunks from T1/T2.
        target_t1_size: Adaptive target size for the T1 partition.

    Algorithm Flow:
        1. Cache lookup (lookup):
           Searches T1 and T2 for chunk hashes and counts consecutive hits
           until a miss or non-ready chunk is encountered.

        2. Request access - Adaptive Learning:
           - Ready chunks reused by a request move from T1 to T2 once, or
             move to the MRU end of T2.
           - B1/B2 misses adjust target_t1_size once per request before
             insertion removes their ghost entries.

        3. Chunk eviction (evict) - Adaptive Replacement:
           Determines eviction source based on adaptive target:
           - If T1 size >= target_t1_size: Evict from T1, add to B1.
           - Otherwise: Evict from T2, add to B2.
           Finally, bound each ghost list size.

        4. Chunk insertion (insert):
           New chunks are always inserted into T1 and removed from B1/B2 if
           present. A later request reuse may promote them to T2.

    Adaptive Behavior:
        The algorithm self-tunes the recency vs. frequency trade-off:
        - B1 hit: Recent access patterns matter more → increase T1.
        - B2 hit: Frequent access patterns matter more → decrease T1.

    (vLLM 0.33.0's docstring, as the code below.)
    """

    def __init__(self, cache_capacity: int):
        # CachePolicy.__init__
        self.cache_capacity = cache_capacity
        self.target_t1_size: float = 0.0
        self.t1: OrderedDict[OffloadKey, ChunkStatus] = OrderedDict()
        self.t2: OrderedDict[OffloadKey, ChunkStatus] = OrderedDict()
        # key -> None (only care about presence)
        self.b1: OrderedDict[OffloadKey, None] = OrderedDict()
        self.b2: OrderedDict[OffloadKey, None] = OrderedDict()

    def get(self, key: OffloadKey) -> ChunkStatus | None:
        return self.t1.get(key) or self.t2.get(key)

    def insert(self, key: OffloadKey, chunk: ChunkStatus, req_context: ReqContext) -> None:
        self.t1[key] = chunk
        self.b1.pop(key, None)
        self.b2.pop(key, None)

    def remove(self, key: OffloadKey) -> None:
        if self.t1.pop(key, None) is None:
            self.t2.pop(key, None)

    def _adapt_to_ghost_hit(self, key: OffloadKey) -> bool:
        if key in self.b1:
            delta = max(1, len(self.b2) / len(self.b1))
            self.target_t1_size = min(self.target_t1_size + delta, self.cache_capacity)
            self.b1.move_to_end(key)
            return True
        if key in self.b2:
            delta = max(1, len(self.b1) / len(self.b2))
            self.target_t1_size = max(self.target_t1_size - delta, 0)
            self.b2.move_to_end(key)
            return True
        return False

    def on_store_miss(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        for key in reversed(list(keys)):
            self._adapt_to_ghost_hit(key)

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        for key in reversed(list(keys)):
            if key in self.t1:
                chunk = self.t1.pop(key)
                if not chunk.is_ready:
                    # chunk was just prepared to be stored, not really touched
                    # twice — keep it in T1 and mark as most recently used
                    self.t1[key] = chunk
                else:
                    self.t2[key] = chunk

            elif key in self.t2:
                self.t2.move_to_end(key)

            else:
                self._adapt_to_ghost_hit(key)

    def on_request_access(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        """CachePolicy's: nothing (ARC does not override it)."""
        return

    def on_request_finished(
        self,
        key_groups: Sequence[Sequence[OffloadKey]],
        insertion_only_keys: set[OffloadKey],
        reused_keys: set[OffloadKey],
        req_context: ReqContext,
    ) -> None:
        for key in reversed(order_request_keys(key_groups, req_context)):
            if key in insertion_only_keys:
                # A store is not a frequency hit. Preserve T1 membership
                # while still restoring tail-to-head recency.
                if key in self.t1:
                    self.t1.move_to_end(key)
                elif key in self.t2:
                    self.t2.move_to_end(key)
                continue

            # Ready chunks reused by this request count as one access.
            if key in reused_keys and key in self.t1:
                chunk = self.t1.pop(key)
                self.t2[key] = chunk
            elif key in reused_keys and key in self.t2:
                self.t2.move_to_end(key)

    def clear(self) -> None:
        self.t1.clear()
        self.t2.clear()
        self.b1.clear()
        self.b2.clear()
        self.target_t1_size = 0.0

    def evict(
        self, n: int, protected: set[OffloadKey]
    ) -> list[tuple[OffloadKey, ChunkStatus]] | None:
        if n == 0:
            return []

        # Collect candidates atomically: simulate T1 size changes as we select,
        # but do not modify actual data structures until all n are found.
        candidates: list[tuple[OffloadKey, ChunkStatus, bool]] = []  # (key, chunk, from_t1)
        virtual_t1_size = len(self.t1)
        # Keep the scans monotonic: restarting from the LRU end after every
        # selection makes a batch eviction quadratic in the number of chunks.
        t1_iter = iter(self.t1.items())
        t2_iter = iter(self.t2.items())

        def next_candidate(
            entries: Iterator[tuple[OffloadKey, ChunkStatus]],
        ) -> tuple[OffloadKey, ChunkStatus] | None:
            for key, chunk in entries:
                if chunk.ref_cnt == 0 and key not in protected:
                    return key, chunk
            return None

        for _ in range(n):
            candidate: tuple[OffloadKey, ChunkStatus, bool] | None = None

            if virtual_t1_size >= int(self.target_t1_size):
                entry = next_candidate(t1_iter)
                if entry is not None:
                    candidate = (*entry, True)
                    virtual_t1_size -= 1

            if candidate is None:
                entry = next_candidate(t2_iter)
                if entry is not None:
                    candidate = (*entry, False)

            if candidate is None:
                entry = next_candidate(t1_iter)
                if entry is None:
                    return None
                candidate = (*entry, True)
                virtual_t1_size -= 1

            candidates.append(candidate)

        # Apply all evictions now that we know n candidates exist.
        result: list[tuple[OffloadKey, ChunkStatus]] = []
        for key, chunk, from_t1 in candidates:
            if from_t1:
                del self.t1[key]
                self.b1[key] = None
            else:
                del self.t2[key]
                self.b2[key] = None
            result.append((key, chunk))

        # Trim ghost lists to cache_capacity.
        for ghost in (self.b1, self.b2):
            for _ in range(len(ghost) - self.cache_capacity):
                ghost.popitem(last=False)

        return result

    def mark_evictable(self, key: OffloadKey) -> None:
        """CachePolicy's: nothing. Called when a chunk's ref_cnt transitions to 0."""
        return

    def mark_non_evictable(self, key: OffloadKey) -> None:
        """CachePolicy's: nothing. Called when a chunk's ref_cnt transitions from 0."""
        return


class ReplayARCCachePolicy(ARCCachePolicy):
    """vLLM's ARC with what the replay's CPU tier reads besides vLLM's calls (the interface
    of LPC's `EvictorCachePolicy`): the resident keys (T1 then T2, each least recent first),
    their number and the policy's invariants. Decides nothing differently."""

    def __len__(self) -> int:
        return len(self.t1) + len(self.t2)

    def __iter__(self) -> Iterator[OffloadKey]:
        yield from self.t1
        yield from self.t2

    def check_invariants(self) -> None:
        """T1 and T2 hold at most the capacity together and no key twice; each ghost list
        holds at most the capacity, no resident key and no key of the other; the target of
        T1 is within [0, capacity]."""
        capacity = self.cache_capacity
        t1, t2, b1, b2 = self.t1.keys(), self.t2.keys(), self.b1.keys(), self.b2.keys()
        assert len(t1) + len(t2) <= capacity, f"{len(t1)} + {len(t2)} resident > {capacity}"
        assert t1.isdisjoint(t2), "a key in both T1 and T2"
        assert len(b1) <= capacity and len(b2) <= capacity, (
            f"ghost lists of {len(b1)} and {len(b2)} keys > {capacity}"
        )
        assert b1.isdisjoint(b2), "a key in both ghost lists"
        for ghost in (b1, b2):
            assert ghost.isdisjoint(t1) and ghost.isdisjoint(t2), "a resident key in a ghost list"
        assert 0 <= self.target_t1_size <= capacity, f"target of T1 {self.target_t1_size}"
