"""A min-heap of block *runs*: the blocks one release hands over share a priority key.

A request releases a whole chain of blocks at once, and the policies here give most of them
the same key (LPC: one prediction and one release time for the whole request). So the heap
orders runs, not blocks. A run lists its blocks deepest first, which is also their eviction
order within the run: ties in key evict the deeper block first (a child is useless without
its parent), then the block of the older run.

The heap holds bare keys, each once, and `_at` maps a key to what is queued under it: one
`Run` (the common case), or a `Tie` of runs that share the key. Keys compare in one step,
where (key, rank, seq) tuples took two comparisons and a tuple walk at every level of every
pop. A key at the root is strictly below every other key, so a lone run there hands out its
blocks by slicing, like a linked list. Inside a `Tie`, runs are ordered by (−depth of the
run's head, run sequence number); a rank goes stale as its head moves past hit blocks, which
only makes it sort *earlier* than it should, never later, so the tie's root is re-ranked
exactly before each block it gives.

Each block has one slot in `_state`: the `Run` it is queued in; or, once a hit took it out
of the heap, that run's `Ghost` (the same key and `tag`, the policy's per-block metadata,
which must survive while the block is in use); or None once it is handed out with new
content. A hit therefore costs one store and one count (the run's `live` blocks); the cursor
skips such blocks when it reaches them, and a run with no live block left is dropped when it
reaches the root. Everything is O(log runs) amortised; `pop_n` rebuilds the heap when its
keys exceed twice the queued blocks plus 1,024 (runs whose every block was hit piled up; hits
add no keys, so between pops the excess grows only by the releases since).

Policies subclass `RunHeap` (through `PriorityEvictor`) so their hot paths touch these lists
directly; the protected methods here are the heap's whole interface.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence
from typing import Any, TypeAlias

from eviction.linked_list import BlockList

heappop = heapq.heappop  # one global load on the pop path, per used-up run


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


Key: TypeAlias = Any  # hashable and totally ordered: a float, or a tuple of them


class Tie(list):
    """Runs queued under one key, a min-heap of (−depth of head, run sequence number, run)."""

    __slots__ = ()


class RunHeap:
    """Uncached blocks, then cached ones by (key, −depth, run age); O(1) membership by id."""

    def __init__(self, num_blocks: int) -> None:
        self._uncached = BlockList(num_blocks)  # reused before any run, in vLLM's order
        self._heap: list[Key] = []
        self._at: dict[Key, Run | Tie] = {}
        self._state: list[Run | Ghost | None] = [None] * num_blocks
        self._next_seq = 0
        self._queued = 0

    def _clear_heap(self) -> None:
        self._heap.clear()
        self._at.clear()
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

    def _new_run(self, key: Key, tag: Any, block_ids: Sequence[int], depths: Sequence[int]) -> Run:
        """A run with the next sequence number, not queued yet: point its blocks' slots at
        it, then `_enqueue` it (a policy may build one before it knows it will queue it)."""
        seq = self._next_seq
        self._next_seq = seq + 1
        return Run(key, tag, block_ids, depths, seq)

    def _enqueue(self, run: Run) -> None:
        """Queue a new run under its key (the caller has pointed its blocks' slots at it)."""
        self._queued += run.live
        key = run.key
        queued = self._at.setdefault(key, run)
        if queued is run:
            heapq.heappush(self._heap, key)
        else:
            self._tie(key, queued, run)

    def _tie(self, key: Key, queued: Run | Tie, run: Run) -> None:
        """A new run joins the runs already queued under its key."""
        if type(queued) is Run:
            queued = self._at[key] = Tie([(self._rank(queued), queued.seq, queued)])
        heapq.heappush(queued, (-run.depths[0], run.seq, run))

    def _rank(self, run: Run) -> int:
        """The run's exact rank in a tie: −depth of its head (0 once it has no live block)."""
        i = self._head(run)
        return -run.depths[i] if i < len(run.block_ids) else 0

    def _push_run(
        self, key: Key, tag: Any, block_ids: Sequence[int], depths: Sequence[int]
    ) -> Run | None:
        """Queue blocks that are not queued now and share `key`, listed deepest first.

        The heap keeps references to both sequences: pass ones nobody mutates afterwards.
        """
        if not block_ids:
            return None
        run = self._new_run(key, tag, block_ids, depths)
        state = self._state
        for block_id in block_ids:
            state[block_id] = run
        self._enqueue(run)
        return run

    def _push_grouped(
        self,
        block_ids: Sequence[int],
        depths: Sequence[int],
        keys: Sequence[Key],
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
        self, key: Key, tag: Any, block_ids: Sequence[int], depths: Sequence[int]
    ) -> None:
        """Attach metadata to blocks that are in use (not queued)."""
        if not block_ids:
            return
        ghost = Ghost(key, tag)
        state = self._state
        for block_id in block_ids:
            state[block_id] = ghost

    def remove(self, block_id: int) -> None:
        """Take a free block out: a queued one leaves its run, whose ghost (same key and tag)
        becomes its metadata; an uncached one leaves the list.

        The one dequeue, for hits and for any policy that re-queues a block. It does not check
        for a rebuild: a hit adds no key to the heap, so `pop_n`'s check bounds the dead keys
        (on `lpc bench evictor` a check here cost a quarter of the block operation, callgrind).
        """
        state = self._state
        run = state[block_id]
        if type(run) is not Run:  # a ghost or None: the block is not queued, so uncached
            self._uncached.remove(block_id)
            return
        ghost = run.ghost
        if ghost is None:  # the run's first hit
            ghost = run.ghost = Ghost(run.key, run.tag)
        state[block_id] = ghost
        run.live -= 1
        self._queued -= 1

    def pop_n(self, n: int, now_s: float = 0.0) -> list[int]:
        """The next n blocks to reuse: uncached ones first, then the smallest keys in order.

        Popped cached blocks forget their runs. One frame for the whole call: this is the
        allocation path of every request.
        """
        uncached = self._uncached
        from_uncached = uncached.size
        if n <= from_uncached:
            return uncached.pop_n(n)
        if n > from_uncached + self._queued:
            raise IndexError(f"cannot pop {n} blocks: only {from_uncached + self._queued} are free")
        out = uncached.pop_n(from_uncached) if from_uncached else []
        if len(self._heap) > 2 * self._queued + 1024:
            self._rebuild()  # hits left more dead runs than live blocks
        heap, at, state = self._heap, self._at, self._state
        need = n - from_uncached
        self._queued -= need
        while need:
            run = at[heap[0]]
            if type(run) is Tie:
                need -= self._pop_tied(run, need, out)
                continue
            # The only run under the smallest key: its live blocks go first, in order.
            live = run.live
            if not live:  # every block of the run was hit since
                del at[heappop(heap)]
                continue
            ids = run.block_ids
            m = len(ids)
            i = run.cursor
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
            del at[heappop(heap)]  # the run is used up: its key leaves the heap
        return out

    def _pop_tied(self, tie: Tie, need: int, out: list[int]) -> int:
        """Take up to `need` blocks from the runs tied at the root key; returns how many.

        Each block goes to the run with the deepest head, then the oldest run: the tie's root
        is re-ranked exactly (its rank may be stale, never late) before it gives a block.
        """
        state = self._state
        taken = 0
        while taken < need:
            rank, seq, run = tie[0]
            if not run.live:
                heapq.heappop(tie)
                if len(tie) == 1:  # a lone run again: back to the slicing path
                    self._at[self._heap[0]] = tie[0][2]
                    break
                continue
            i = self._head(run)
            exact = -run.depths[i]
            if exact != rank:
                heapq.heapreplace(tie, (exact, seq, run))
                continue
            block_id = run.block_ids[i]
            state[block_id] = None
            out.append(block_id)
            taken += 1
            run.live -= 1
            run.cursor = i + 1
            if run.live:
                heapq.heapreplace(tie, (self._rank(run), seq, run))
        return taken

    def _rebuild(self) -> None:
        """Drop the runs every block of which was hit, and the keys left with none."""
        at: dict[Key, Run | Tie] = {}
        for key, queued in self._at.items():
            runs = [queued] if type(queued) is Run else [entry[2] for entry in queued]
            live = [run for run in runs if self._head(run) < len(run.block_ids)]
            if len(live) == 1:
                at[key] = live[0]
            elif live:
                tie = Tie((self._rank(run), run.seq, run) for run in live)
                heapq.heapify(tie)
                at[key] = tie
        self._at = at
        self._heap = list(at)
        heapq.heapify(self._heap)

    def check_invariants(self) -> None:
        """Assert the rules the heap's fast paths rest on (for tests; O(blocks + runs)).

        - the heap holds each key of `_at` once, in heap order;
        - a `Tie` holds at least two runs (one collapses back to a lone `Run`), each under
          its own key and sequence number, in heap order, and a stored rank is never later
          than the run's exact rank (ranks go stale only towards sorting earlier);
        - a run lists its blocks deepest first (what makes stale ranks early, never late);
        - a run's `live` counts exactly its blocks at or after the cursor whose slot points
          at it, and no block before the cursor does: so `live == m − cursor` really means
          no hit lies ahead of the cursor, the fact the slicing pop path trusts;
        - every slot that holds a run points at a run queued under that run's key, and
          `_queued` is the number of such slots.
        """
        heap, at, state = self._heap, self._at, self._state
        assert sorted(heap) == sorted(at) and len(set(heap)) == len(heap), (
            "run heap: the heap's keys and the key → run map disagree"
        )
        for k in range(1, len(heap)):
            assert not heap[k] < heap[(k - 1) // 2], f"run heap: key {heap[k]!r} breaks heap order"
        queued_runs: set[int] = set()
        for key, queued in at.items():
            if type(queued) is Tie:
                assert len(queued) >= 2, f"run heap: the tie under {key!r} has one run left"
                for k in range(1, len(queued)):
                    assert not queued[k] < queued[(k - 1) // 2], (
                        f"run heap: the tie under {key!r} breaks heap order"
                    )
                for rank, seq, run in queued:
                    assert seq == run.seq, f"run heap: run {run.seq} is tied under seq {seq}"
                    assert rank <= self._exact_rank(run), (
                        f"run heap: run {run.seq} under {key!r} has a rank later than its "
                        f"exact one ({rank} > {self._exact_rank(run)})"
                    )
                runs = [entry[2] for entry in queued]
            else:
                runs = [queued]
            for run in runs:
                assert run.key == key, f"run heap: run {run.seq} is queued under a foreign key"
                assert id(run) not in queued_runs, f"run heap: run {run.seq} is queued twice"
                queued_runs.add(id(run))
                self._check_run(run)
        slots = [b for b, s in enumerate(state) if type(s) is Run]
        for b in slots:
            assert id(state[b]) in queued_runs, f"run heap: block {b} points at an unqueued run"
        assert len(slots) == self._queued, (
            f"run heap: {len(slots)} blocks are queued but the count says {self._queued}"
        )

    def _check_run(self, run: Run) -> None:
        ids, depths, state = run.block_ids, run.depths, self._state
        assert len(ids) == len(depths), f"run heap: run {run.seq} has ids and depths unequal"
        assert all(depths[j] >= depths[j + 1] for j in range(len(depths) - 1)), (
            f"run heap: run {run.seq} does not list its blocks deepest first"
        )
        assert not any(state[b] is run for b in ids[: run.cursor]), (
            f"run heap: run {run.seq} has a queued block behind its cursor"
        )
        live = sum(1 for b in ids[run.cursor :] if state[b] is run)
        assert run.live == live, f"run heap: run {run.seq} counts {run.live} live, has {live}"

    def _exact_rank(self, run: Run) -> int:
        """`_rank` without moving the cursor: −depth of the first live block, 0 if none."""
        state = self._state
        for j in range(run.cursor, len(run.block_ids)):
            if state[run.block_ids[j]] is run:
                return -run.depths[j]
        return 0

    def _runs(self) -> Iterator[Run]:
        """Every run under a key in the heap (dead ones included), in no order."""
        for queued in self._at.values():
            if type(queued) is Run:
                yield queued
            else:
                for entry in queued:
                    yield entry[2]

    def _ordered(self) -> Iterator[int]:
        """Queued blocks in pop order, without popping (O(n log n); for tests and debugging)."""
        state = self._state
        items = []
        for run in self._runs():
            for j in range(run.cursor, len(run.block_ids)):
                block_id = run.block_ids[j]
                if state[block_id] is run:
                    items.append((run.key, -run.depths[j], run.seq, block_id))
        items.sort()
        return (item[3] for item in items)
