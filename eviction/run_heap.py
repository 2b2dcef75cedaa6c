"""A min-heap of block *runs*: the blocks one release hands over share a priority key.

A request releases a whole chain of blocks at once, and the policies here give most of them
the same key (LPC: one prediction and one release time for the whole request). So the heap
holds one entry per run — (key, −depth of the run's head, run sequence number, run) — instead
of one per block. A run lists its blocks deepest first, which is also their eviction order
within the run: ties in key evict the deeper block first (a child is useless without its
parent), then the block of the older run.

Each block has one slot in `_state`: the `Run` it is queued in; or, once a hit took it out
of the heap, that run's `Ghost` (the same key and `tag`, the policy's per-block metadata,
which must survive while the block is in use); or None once it is handed out with new
content. A hit therefore costs one store and one count (the run's `live` blocks); the cursor
skips such blocks when it reaches them, and a run with no live block left is dropped when it
reaches the root. An entry's rank goes stale as its head moves on, which only makes it sort
*earlier* than it should, never later; so a root whose key is strictly below its children's
is the true minimum and its blocks are taken by slicing, like a linked list, and only a tie
on the key needs the root re-ranked. Everything is O(log runs) amortised; the heap is rebuilt
when dead entries outnumber queued blocks.

Policies subclass `RunHeap` (through `PriorityEvictor`) so their hot paths touch these lists
directly; the protected methods here are the heap's whole interface.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence
from typing import Any


class Ghost:
    """The metadata of a run a block has left (or of a release that did not free it)."""

    __slots__ = ("key", "tag")

    def __init__(self, key: Any, tag: Any) -> None:
        self.key = key
        self.tag = tag


class Run:
    """Blocks queued together under one key; `tag` is the policy's own metadata."""

    __slots__ = ("block_ids", "cursor", "depths", "ghost", "key", "live", "seq", "tag")

    def __init__(
        self, key: Any, tag: Any, block_ids: Sequence[int], depths: Sequence[int], seq: int
    ) -> None:
        self.key = key
        self.tag = tag
        self.block_ids = block_ids
        self.depths = depths
        self.cursor = 0
        self.seq = seq
        self.live = len(block_ids)  # blocks still queued in this run (not popped, not hit)
        self.ghost: Ghost | None = None

    def left_by(self) -> Ghost:
        """The ghost that blocks leaving this run keep as their metadata."""
        ghost = self.ghost
        if ghost is None:
            ghost = self.ghost = Ghost(self.key, self.tag)
        return ghost


_Entry = tuple[Any, int, int, Run]


class RunHeap:
    """Blocks ordered by (key, −depth, run age), with O(1) membership by block id."""

    def __init__(self, num_blocks: int) -> None:
        self._heap: list[_Entry] = []
        self._state: list[Run | Ghost | None] = [None] * num_blocks
        self._next_seq = 0
        self._queued = 0

    def _clear_heap(self) -> None:
        self._heap.clear()
        self._state = [None] * len(self._state)
        self._queued = 0

    def _is_queued(self, block_id: int) -> bool:
        return type(self._state[block_id]) is Run

    def _head(self, run: Run) -> int:
        """Advance the run's cursor past removed blocks; returns it (== len when exhausted)."""
        i = run.cursor
        ids = run.block_ids
        n = len(ids)
        if run.live == n - i:
            return i  # nothing ahead of the cursor was hit
        if run.live == 0:
            run.cursor = n
            return n
        state = self._state
        while state[ids[i]] is not run:
            i += 1
        run.cursor = i
        return i

    def _push_run(
        self, key: Any, tag: Any, block_ids: Sequence[int], depths: Sequence[int]
    ) -> Run | None:
        """Queue blocks that are not queued now and share `key`, listed deepest first.

        The heap keeps references to both sequences: pass ones nobody mutates afterwards.
        """
        if not block_ids:
            return None
        seq = self._next_seq
        self._next_seq = seq + 1
        run = Run(key, tag, block_ids, depths, seq)
        state = self._state
        for block_id in block_ids:
            state[block_id] = run
        self._queued += len(block_ids)
        heapq.heappush(self._heap, (key, -depths[0], seq, run))
        return run

    def _push_grouped(
        self,
        block_ids: Sequence[int],
        depths: Sequence[int],
        keys: Sequence[Any],
        tags: Sequence[Any],
    ) -> list[Run]:
        """Queue blocks with per-block keys and tags, grouping equal neighbours into runs."""
        runs = []
        start = 0
        n = len(block_ids)
        for i in range(1, n + 1):
            if i == n or keys[i] != keys[start] or tags[i] != tags[start]:
                run = self._push_run(keys[start], tags[start], block_ids[start:i], depths[start:i])
                if run is not None:
                    runs.append(run)
                start = i
        return runs

    def _remember(
        self, key: Any, tag: Any, block_ids: Sequence[int], depths: Sequence[int]
    ) -> None:
        """Attach metadata to blocks that are in use (not queued)."""
        if not block_ids:
            return
        ghost = Ghost(key, tag)
        state = self._state
        for block_id in block_ids:
            state[block_id] = ghost

    def _dequeue(self, block_id: int) -> bool:
        """Dequeue the block if it is queued (its run stays its metadata); returns whether."""
        run = self._state[block_id]
        if type(run) is not Run:
            return False
        self._state[block_id] = run.left_by()
        run.live -= 1
        self._queued -= 1
        if len(self._heap) > 2 * self._queued + 1024:
            self._rebuild()
        return True

    def _pop_into(self, n: int, out: list[int]) -> None:
        """Pop the n smallest blocks into `out`, in order; they forget their runs.

        An entry's rank (its head's depth) only breaks ties between equal keys, and it goes
        stale as the head moves on, always in the direction that sorts the entry earlier.
        So a root whose key is strictly below its children's is the true minimum whatever
        the ranks say, and its blocks are taken at once; only a tie on the key re-ranks the
        root, exactly, before a single block is taken.
        """
        if n > self._queued:
            raise IndexError(f"cannot pop {n} blocks: only {self._queued} are queued")
        heap, state = self._heap, self._state
        need = n
        while need:
            entry = heap[0]
            run = entry[3]
            live = run.live
            if not live:
                heapq.heappop(heap)  # every block of the run was hit since
                continue
            key = entry[0]
            size = len(heap)
            ids = run.block_ids
            m = len(ids)
            i = run.cursor
            if (size < 2 or key < heap[1][0]) and (size < 3 or key < heap[2][0]):
                # Strictly the smallest key: the run's live blocks go first, in order.
                if live == m - i:
                    j = i + need if i + need < m else m
                    take = ids[i:j]
                    out.extend(take)
                    for block_id in take:
                        state[block_id] = None
                    taken = j - i
                else:
                    taken = 0
                    j = i
                    while j < m and taken < need:
                        block_id = ids[j]
                        j += 1
                        if state[block_id] is run:
                            state[block_id] = None
                            out.append(block_id)
                            taken += 1
                need -= taken
                run.live = live = live - taken
                run.cursor = j
                if live:
                    break  # `need` is met
                heapq.heappop(heap)
                continue
            # A tie on the key: rank the root exactly, then take one block.
            if live != m - i:
                i = self._head(run)
            rank = -run.depths[i]
            if rank != entry[1]:
                self._replace_root((key, rank, run.seq, run))
                if heap[0][3] is not run:
                    continue
            block_id = ids[i]
            state[block_id] = None
            out.append(block_id)
            need -= 1
            run.live = live = live - 1
            run.cursor = i + 1
            if not live:
                heapq.heappop(heap)
                continue
            self._replace_root((key, -run.depths[self._head(run)], run.seq, run))
        self._queued -= n

    def _replace_root(self, entry: _Entry) -> None:
        heap = self._heap
        size = len(heap)
        if (size < 2 or entry <= heap[1]) and (size < 3 or entry <= heap[2]):
            heap[0] = entry
        else:
            heapq.heapreplace(heap, entry)

    def _rebuild(self) -> None:
        entries = []
        for _, _, seq, run in self._heap:
            i = self._head(run)
            if i < len(run.block_ids):
                entries.append((run.key, -run.depths[i], seq, run))
        heapq.heapify(entries)
        self._heap = entries

    def _ordered(self) -> Iterator[int]:
        """Queued blocks in pop order, without popping (O(n log n); for tests and debugging)."""
        state = self._state
        items = []
        for _, _, seq, run in self._heap:
            for j in range(run.cursor, len(run.block_ids)):
                block_id = run.block_ids[j]
                if state[block_id] is run:
                    items.append((run.key, -run.depths[j], seq, block_id))
        items.sort()
        return (item[3] for item in items)
