"""session-ref: SGLang-style soft session references; a live session's blocks outrank the
unreferenced ones, and a session idle longer than a timeout lets go of them.

SGLang's session-reference-aware radix cache (PRs #27058 and #29173): a session (a
conversation) references the chain of its latest release; free cached blocks are evicted
unreferenced first, then referenced, each in vLLM's LRU order. The timeout is fitted on the
replay's training part (`lpc.replay.fitted_policies`).

The source, the mapping and the structures: docs/design.md, "session-ref's source".
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import ClassVar

from eviction.base import Evictor, FreedBlocks, FreeFlags, Release, dry_run_copy
from eviction.linked_list import BlockList

# Unfitted default (contract tests, the microbenchmark); the replay fits its own.
DEFAULT_TIMEOUT_S = 300.0


class _Session:
    __slots__ = ("chain", "last_s", "release")

    def __init__(self, last_s: float, release: Release) -> None:
        self.last_s = last_s
        self.release = release  # the release that built `chain` (identity)
        self.chain: list[tuple[int, int]] = []  # (block, its content generation)


class SessionRefEvictor(FreeFlags, Evictor):
    """Uncached blocks in a list, then the unreferenced partition, then the referenced one."""

    name: ClassVar[str] = "session-ref"

    def __init__(self, num_blocks: int, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        if num_blocks < 0:
            raise ValueError(f"num_blocks must be >= 0, got {num_blocks}")
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float):
            raise ValueError(f"timeout_s must be a number of seconds, got {timeout_s!r}")
        if math.isnan(timeout_s) or timeout_s < 0:
            raise ValueError(f"timeout_s must be >= 0 seconds, got {timeout_s!r}")
        self._num_blocks = num_blocks
        self.timeout_s = float(timeout_s)
        self._uncached = BlockList(num_blocks)
        self._clear()

    def _clear(self) -> None:
        n = self._num_blocks
        self._free = [False] * n  # cached and evictable
        self._seq = [0] * n  # release sequence of a free block (its LRU position)
        self._refs = [0] * n  # live sessions whose latest chain holds the block's content
        self._generation = [0] * n  # bumped when a block's content goes away
        self._next_seq = 0
        self._num_free = 0
        self._sessions: OrderedDict[str, _Session] = OrderedDict()  # by latest release
        self._unreferenced: list[tuple[int, int]] = []  # (seq, block), lazy
        self._referenced: list[tuple[int, int]] = []
        self._clock_s = 0.0

    # -- references -----------------------------------------------------------------------
    def _reference(self, block_id: int) -> None:
        refs = self._refs
        refs[block_id] += 1
        if refs[block_id] == 1 and self._free[block_id]:
            heapq.heappush(self._referenced, (self._seq[block_id], block_id))

    def _unreference(self, chain: list[tuple[int, int]]) -> None:
        refs, generation, free, seq = self._refs, self._generation, self._free, self._seq
        for block_id, gen in chain:
            if generation[block_id] != gen:
                continue  # the content this entry referenced is gone
            refs[block_id] -= 1
            if refs[block_id] == 0 and free[block_id]:
                heapq.heappush(self._unreferenced, (seq[block_id], block_id))

    def _register(self, block_ids: Sequence[int], release: Release) -> None:
        """The session's reference moves to this release's chain (or the chain grows, on the
        release's second call)."""
        session_id = release.conversation_id
        if session_id is None:
            return
        session = self._sessions.get(session_id)
        if session is None or session.release is not release:
            if session is not None:
                self._unreference(session.chain)
                del self._sessions[session_id]
            session = self._sessions[session_id] = _Session(release.time_s, release)
        chain, generation = session.chain, self._generation
        for block_id in block_ids:
            chain.append((block_id, generation[block_id]))
            self._reference(block_id)

    def _expire(self, now_s: float) -> None:
        """Sessions idle longer than the timeout close, dropping their references."""
        sessions = self._sessions
        deadline = now_s - self.timeout_s
        while sessions:
            session_id, session = next(iter(sessions.items()))
            if not session.last_s < deadline:
                return
            del sessions[session_id]
            self._unreference(session.chain)

    def _forget(self, block_id: int) -> None:
        """The block's content is gone: every session's entry for it is void."""
        self._generation[block_id] += 1
        self._refs[block_id] = 0

    # -- the evictor contract -------------------------------------------------------------
    def reset(self, block_ids: Iterable[int]) -> None:
        self._uncached.clear_to(block_ids)
        self._clear()

    def push_uncached(self, block_ids: Sequence[int]) -> None:
        for block_id in block_ids:
            self._forget(block_id)
        self._uncached.prepend_n(block_ids)

    def push_cached(self, freed: FreedBlocks, release: Release) -> None:
        if release.time_s > self._clock_s:
            self._clock_s = release.time_s
        self._register(freed.block_ids, release)
        free, seqs, refs = self._free, self._seq, self._refs
        seq = self._next_seq
        referenced, unreferenced = self._referenced, self._unreferenced
        for block_id in freed.block_ids:
            free[block_id] = True
            seqs[block_id] = seq
            heapq.heappush(referenced if refs[block_id] else unreferenced, (seq, block_id))
            seq += 1
        self._next_seq = seq
        self._num_free += len(freed.block_ids)

    def note_shared_release(self, freed: FreedBlocks, release: Release) -> None:
        if release.time_s > self._clock_s:
            self._clock_s = release.time_s
        self._register(freed.block_ids, release)

    def remove(self, block_id: int) -> None:
        if not self._free[block_id]:
            self._uncached.remove(block_id)
            return
        self._free[block_id] = False  # its heap entry goes stale
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
            self._expire(now_s)
            for _ in range(n - from_uncached):
                out.append(self._evict())
            if len(self._unreferenced) + len(self._referenced) > 2 * self._num_free + 1024:
                self._rebuild()
        return out

    def _evict(self) -> int:
        free, seqs, refs = self._free, self._seq, self._refs
        heap = self._unreferenced
        while heap:
            seq, block_id = heapq.heappop(heap)
            if free[block_id] and seqs[block_id] == seq and not refs[block_id]:
                return self._take(block_id)
        heap = self._referenced
        while heap:
            seq, block_id = heapq.heappop(heap)
            if free[block_id] and seqs[block_id] == seq and refs[block_id]:
                return self._take(block_id)
        raise AssertionError("session-ref: evict called with no free cached block")

    def _take(self, block_id: int) -> int:
        self._free[block_id] = False
        self._num_free -= 1
        self._forget(block_id)
        return block_id

    def _rebuild(self) -> None:
        """Drop stale heap entries: one entry per free block, in its partition."""
        free, seqs, refs = self._free, self._seq, self._refs
        blocks = [b for b in range(self._num_blocks) if free[b]]
        self._unreferenced = [(seqs[b], b) for b in blocks if not refs[b]]
        self._referenced = [(seqs[b], b) for b in blocks if refs[b]]
        heapq.heapify(self._unreferenced)
        heapq.heapify(self._referenced)

    def free_block_ids(self, now_s: float | None = None) -> list[int]:
        """The pop order at `now_s` (default: the latest time seen): a dry run on a copy."""
        now = self._clock_s if now_s is None else now_s
        dry = dry_run_copy(self)
        dry._expire(now)
        return [*self._uncached, *(dry._evict() for _ in range(self._num_free))]

    def referenced(self, block_id: int) -> bool:
        """Whether a live (not yet expired) session references the block's content."""
        return self._refs[block_id] > 0

    def check_invariants(self) -> None:
        Evictor.check_invariants(self)
        self._uncached.check_invariants()
        free, refs, generation = self._free, self._refs, self._generation
        assert sum(free) == self._num_free, "session-ref: the free count is out of sync"
        expected = [0] * self._num_blocks
        for session_id, session in self._sessions.items():
            held = {b for b, gen in session.chain if generation[b] == gen}
            assert len(held) == sum(1 for b, gen in session.chain if generation[b] == gen), (
                f"session-ref: session {session_id!r} references a block twice"
            )
            for block_id in held:
                expected[block_id] += 1
        assert refs == expected, "session-ref: reference counts disagree with the sessions"
        valid_unreferenced = {
            b for s, b in self._unreferenced if free[b] and self._seq[b] == s and not refs[b]
        }
        valid_referenced = {
            b for s, b in self._referenced if free[b] and self._seq[b] == s and refs[b]
        }
        for block_id in range(self._num_blocks):
            if free[block_id]:
                assert block_id not in self._uncached, f"block {block_id} free and uncached"
                partition = valid_referenced if refs[block_id] else valid_unreferenced
                assert block_id in partition, (
                    f"session-ref: free block {block_id} has no valid entry in its partition"
                )
