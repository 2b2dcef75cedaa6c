"""A min-heap of block *runs*: the blocks one release hands over share a priority key.

A plain `heapq` of (key, rank, seq, run) entries, one per run; ties in key evict the deeper
block first, then the block of the older run. It also keeps prefix closure: a block is never
handed out while a cached descendant in its chain stays. Policies subclass `RunHeap` (through
`PriorityEvictor`) so their hot paths touch these lists directly; the protected methods here
are the heap's whole interface.

The design and its bound: docs/design.md, "LPC's key" (its **Prefix closure** paragraph) and
"The run heap's bookkeeping".
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from itertools import chain, compress, repeat
from operator import itemgetter, ne, setitem
from typing import Any, TypeAlias

import numpy as np

from eviction.linked_list import BlockList

heappop = heapq.heappop  # one global load on the pop path, per used-up run
heapreplace = heapq.heapreplace
consume = deque  # deque(iterator, 0) runs an iterator in C, keeping nothing
# Stores by `map(setitem, repeat(list), ids, repeat(value))`: `operator.setitem` is a plain C
# function, about twice as fast per block as the bound `list.__setitem__` wrapper.


# Fewer blocks than this in a row go by `pop_n`'s block-by-block loop unless no check is needed:
# the C-level path's few calls cost more than the loop's steps for them.
SLICE_MIN = 64


def _gatherer(ids: Sequence[int]) -> Callable[[Sequence[Any]], Sequence[Any]]:
    """A function of a list giving `values[b]` for each b in `ids` (at least one), by one
    C-level `itemgetter` call: built once, it reads several per-block lists."""
    if len(ids) > 1:
        return itemgetter(*ids)
    block_id = ids[0]
    return lambda values: (values[block_id],)


def _stretches(keys: Sequence[Any], tags: Sequence[Any]) -> Iterator[tuple[int, int]]:
    """(start, end) of each stretch of neighbours with equal key and tag, in order."""
    n = len(keys)
    start = 0
    for i in range(1, n + 1):
        if i == n or keys[i] != keys[start] or tags[i] != tags[start]:
            yield start, i
            start = i


class Ghost:
    """The metadata of a run a block has left (or of a release that did not free it)."""

    __slots__ = ("key", "tag")

    def __init__(self, key: Any, tag: Any) -> None:
        self.key = key
        self.tag = tag


class Run:
    """Blocks queued together under one key; `tag` is the policy's own metadata."""

    __slots__ = (
        "block_ids",
        "chain",
        "cursor",
        "depths",
        "ghost",
        "key",
        "live",
        "seq",
        "tag",
    )

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
        # A chain's run (a request's contiguous tail): block j's parent is block j + 1.
        self.chain = False

    def __lt__(self, other: Run) -> bool:
        # Entries compare runs only on a full tie of (key, rank, seq), which only a set-aside
        # parent and its own run's head can reach: either may go first.
        return False


Key: TypeAlias = Any  # totally ordered: a float, or a tuple of them
Entry: TypeAlias = tuple[Key, int, int, Run]  # (key, rank: −depth of head, run seq, run)


class RunHeap:
    """Uncached blocks, then cached ones by (key, −depth, run age); O(1) membership by id."""

    def __init__(self, num_blocks: int) -> None:
        self._uncached = BlockList(num_blocks)  # reused before any run, in vLLM's order
        self._heap: list[Entry] = []
        self._state: list[Run | Ghost | None] = [None] * num_blocks
        self._next_seq = 0
        self._queued = 0
        # Prefix closure: each cached block's parent (−1: none known) and how many cached
        # blocks name it as their parent; free blocks held back for a cached child.
        self._parent = [-1] * num_blocks
        self._children = [0] * num_blocks
        self._deferred: dict[int, Run] = {}
        # Each queued block's index in its run: numpy, so that a release writes its run's
        # positions by one scatter in C (`_write_positions`) instead of a store per block.
        self._pos = np.zeros(num_blocks, np.intp)
        self._arange = np.arange(num_blocks, dtype=np.intp)
        # Reads go through a memoryview of the same buffer: a Python int at about a list's
        # cost, where indexing the array (a numpy scalar) costs a hit three times as much.
        self._pos_of = memoryview(self._pos)
        # The scan order (`iter_after`): (key, seq, run) of every run entered into the heap,
        # sorted; built by the first scan and kept from then on (None until a scan asks).
        self._order: list[tuple[Key, float, Run]] | None = None
        self._order_heap: list[Entry] | None = None  # the heap list it was built from
        self.order_builds = 0  # how many times the scan order was built (tests count them)
        self.scan_runs = 0  # runs a scan looked at (tests bound it)

    def __getstate__(self) -> dict[str, Any]:
        # A memoryview cannot be pickled or copied: rebuilt over the copy's own array.
        state = self.__dict__.copy()
        del state["_pos_of"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._pos_of = memoryview(self._pos)

    def _clear_heap(self) -> None:
        self._heap.clear()
        n = len(self._state)
        self._state = [None] * n
        self._queued = 0
        self._parent = [-1] * n
        self._children = [0] * n
        self._deferred.clear()
        self._pos[:] = 0
        self._order = None

    def _link_runs(self, runs: Sequence[Run], parent_id: int | None) -> None:
        """Mark the runs one release of a chain made (deepest run first) as chains: within a
        run the links are implicit (block j's parent is block j + 1); each run's top block is
        linked explicitly to the next run's first block, the last one's to `parent_id` (None:
        unknown, an old link stays). O(runs), whatever the chain's length."""
        for k, run in enumerate(runs):
            run.chain = True
            p = runs[k + 1].block_ids[0] if k + 1 < len(runs) else parent_id
            if p is not None:
                self._set_parent(run.block_ids[-1], p)

    def _set_parent(self, block_id: int, p: int) -> None:
        """An explicit link: `p` holds the block's parent (counted in p's children)."""
        parent = self._parent
        old = parent[block_id]
        if old == p:
            return
        self._children[p] += 1
        parent[block_id] = p
        if old >= 0:
            self._drop_child(old)

    def _make_explicit(self, run: Run, j: int) -> None:
        """Block j of a chain run leaves it without losing its content (a hit, or held back):
        the implicit links it was part of become explicit, its own (to block j + 1) and its
        child's (block j − 1, if still queued in the run)."""
        ids, parent = run.block_ids, self._parent
        block_id = ids[j]
        if j + 1 < len(ids) and parent[block_id] < 0:
            self._set_parent(block_id, ids[j + 1])
        if j:
            child = ids[j - 1]
            if self._state[child] is run and parent[child] < 0:
                self._set_parent(child, block_id)

    def _unlink(self, block_id: int) -> bool:
        """The block lost its content: its parent has one cached child less. Returns True
        when that puts a set-aside parent back into the heap (the root may have changed)."""
        parent = self._parent
        p = parent[block_id]
        if p < 0:
            return False
        parent[block_id] = -1
        return self._drop_child(p)

    def _drop_child(self, p: int) -> bool:
        """Block p has one cached child less; a held-back p with none left goes back into
        the heap (True: the root may have changed)."""
        c = self._children[p] - 1
        self._children[p] = c
        if c or p not in self._deferred:
            return False
        return self._requeue_deferred(p)

    def _defer(self, run: Run, j: int) -> None:
        """Hold back block j of `run` (the caller has taken it out of the run's count): it
        has a cached child. It stays free, in a run of its own outside the heap, with the
        same key, tag and depth, ranked just after its old run among equal keys and depths."""
        block_id = run.block_ids[j]
        if run.chain:
            self._make_explicit(run, j)
        held = Run(run.key, run.tag, [block_id], [run.depths[j]], run.seq)
        held.seq = run.seq + 0.5  # unique among entries; the same age against other runs
        self._state[block_id] = held
        self._pos[block_id] = 0
        self._deferred[block_id] = held

    def _requeue_deferred(self, block_id: int) -> bool:
        """Put a held-back block into the heap (if it is still free and held back)."""
        held = self._deferred.pop(block_id)
        if not held.live or self._state[block_id] is not held:
            return False
        heapq.heappush(self._heap, (held.key, -held.depths[0], held.seq, held))
        if self._order is not None:
            insort(self._order, (held.key, held.seq, held))
        return True

    def _write_positions(self, block_ids: Sequence[int], index: Any = None) -> None:
        """Each block's index in its new run, by one gather and one scatter in C (`index`:
        the ids as a numpy array already, when the caller has one)."""
        n = len(block_ids)
        if index is None:
            index = np.fromiter(block_ids, np.intp, n)
        self._pos[index] = self._arange[:n]

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

    def _claim(self, block_ids: Sequence[int], run: Run, own_tag: Any, index: Any = None) -> bool:
        """Point the blocks' slots at `run` if each is new (no metadata) or tagged `own_tag`
        (released before by this release's conversation only); else change nothing and
        return False. Both passes run in C (a set of the few distinct runs and ghosts the
        blocks come from, a map of stores): no Python step per block. `index`: the ids as a
        numpy array, when the caller has one (`FreedBlocks.index`)."""
        state = self._state
        # An itemgetter's tuple: no method call per block (one id: the item itself).
        olds = set(itemgetter(*block_ids)(state)) if len(block_ids) > 1 else {state[block_ids[0]]}
        olds.discard(None)
        for old in olds:
            if old.tag != own_tag:
                return False
        consume(map(setitem, repeat(state), block_ids, repeat(run)), 0)
        self._write_positions(block_ids, index)
        return True

    def _enqueue(self, run: Run) -> None:
        """Queue a new run under its key (the caller has pointed its blocks' slots at it)."""
        self._queued += run.live
        heapq.heappush(self._heap, (run.key, -run.depths[0], run.seq, run))
        if self._order is not None:
            insort(self._order, (run.key, run.seq, run))

    def _rekey_run(self, run: Run, key: Key) -> bool:
        """Queue a run's live blocks under a new key, as of the same age: a new run holds
        them (same tag, chain and sequence number), and the old one, left with none, is
        dropped when it reaches the root. One heap push, and C-level passes over the blocks
        (their slots and positions) unless a hit left holes ahead of the cursor. Blocks held
        back for prefix closure keep their key. False when no block of the run is queued."""
        live = run.live
        if not live:
            return False
        i = self._head(run)
        ids = run.block_ids
        block_ids, depths = ids[i:], run.depths[i:]
        state = self._state
        moved = block_ids if live == len(block_ids) else [b for b in block_ids if state[b] is run]
        new = Run(key, run.tag, block_ids, depths, run.seq)
        new.chain = run.chain
        new.live = live
        consume(map(setitem, repeat(state), moved, repeat(new)), 0)
        self._write_positions(block_ids)
        run.live = 0
        run.cursor = len(ids)
        heapq.heappush(self._heap, (key, -depths[0], new.seq, new))
        if self._order is not None:
            insort(self._order, (key, new.seq, new))
        return True

    def _push_run(
        self, key: Key, tag: Any, block_ids: Sequence[int], depths: Sequence[int]
    ) -> Run | None:
        """Queue blocks that are not queued now and share `key`, listed deepest first.

        The heap keeps references to both sequences: pass ones nobody mutates afterwards.
        """
        if not block_ids:
            return None
        run = self._new_run(key, tag, block_ids, depths)
        consume(map(setitem, repeat(self._state), block_ids, repeat(run)), 0)
        self._write_positions(block_ids)
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
        n = len(block_ids)
        if n and keys.count(keys[0]) == n and tags.count(tags[0]) == n:
            # One key and tag for all (a request's chain, the common case): one run, found
            # by the lists' own loops. Keys are never NaN, so `count`'s identity-or-equal
            # test splits exactly where the loop's `!=` would: nowhere.
            run = self._push_run(keys[0], tags[0], block_ids[:], depths[:])
            return [] if run is None else [run]
        runs = []
        for start, end in _stretches(keys, tags):
            run = self._push_run(keys[start], tags[start], block_ids[start:end], depths[start:end])
            if run is not None:
                runs.append(run)
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

    def _remember_grouped(
        self, block_ids: Sequence[int], keys: Sequence[Key], tags: Sequence[Any]
    ) -> None:
        """`_remember` with per-block keys and tags: one ghost for each stretch of equal
        neighbours (these belong to no run, so no re-keying changes them: blocks may share
        one)."""
        state = self._state
        for start, end in _stretches(keys, tags):
            ghost = Ghost(keys[start], tags[start])
            consume(map(setitem, repeat(state), block_ids[start:end], repeat(ghost)), 0)

    def metadata(self, block_id: int) -> Ghost | None:
        """A copy of the block's metadata (the key and tag its releases gave it, queued or
        not; None when it holds none), for `restore_metadata`."""
        held = self._state[block_id]
        return None if held is None else Ghost(held.key, held.tag)

    def restore_metadata(self, block_id: int, metadata: Ghost | None) -> None:
        """Give a block that is not queued the metadata `metadata` held before, so its next
        release pools with that instead of with what it was given since (vLLM's CPU tier:
        a running request's provisional hold on a chunk it reads,
        `lpc.integrations.vllm_cache_policy`)."""
        if type(self._state[block_id]) is Run:
            raise ValueError(f"block {block_id} is queued; remove it first")
        self._state[block_id] = metadata

    def forget(self, block_id: int) -> None:
        """Drop the metadata of a block that is not queued (a ghost of its last release), so
        its next release starts afresh: its content changed, or that release was provisional.
        vLLM's CPU tier (`lpc.integrations.vllm_cache_policy`) needs it; the GPU pool does not."""
        if type(self._state[block_id]) is Run:
            raise ValueError(f"block {block_id} is queued; remove it first")
        self._state[block_id] = None
        self._unlink(block_id)

    def remove(self, block_id: int) -> None:
        """Take a free block out: a queued one leaves its run, whose ghost (same key and tag)
        becomes its metadata; an uncached one leaves the list.

        The one dequeue, for hits and for any policy that re-queues a block. It does not check
        for a rebuild: a hit adds no entry to the heap, so `pop_n`'s check bounds the dead entries
        (on `lpc bench evictor` a check here cost a quarter of the block operation, callgrind).
        """
        state = self._state
        run = state[block_id]
        if type(run) is not Run:  # a ghost or None: the block is not queued, so uncached
            self._uncached.remove(block_id)
            return
        parent = self._parent
        children = self._children
        # `_set_parent` and `_unlink` inlined: a hit's path (vLLM's touch, one call a block).
        if run.chain:  # the queued child's implicit link to this block becomes explicit
            j = self._pos_of[block_id]
            if j:
                child = run.block_ids[j - 1]
                if state[child] is run and parent[child] < 0:
                    children[block_id] += 1
                    parent[child] = block_id
        p = parent[block_id]
        if p >= 0:
            # A block in use holds its parent back no more: whoever hit it holds its prefix,
            # this parent or a duplicate of its content. Its next release links it afresh.
            parent[block_id] = -1
            c = children[p] - 1
            children[p] = c
            if not c and p in self._deferred:
                self._requeue_deferred(p)
        ghost = run.ghost
        if ghost is None:  # the run's first hit
            ghost = run.ghost = Ghost(run.key, run.tag)
        state[block_id] = ghost
        run.live -= 1
        self._queued -= 1

    def pop_n(self, n: int, now_s: float = 0.0) -> list[int]:
        """The next n blocks to reuse: uncached ones first, then the smallest keys in order,
        leaves first (a block with a cached child is held back until it has none: the
        module's prefix closure).

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
        heap, state = self._heap, self._state
        children, parent, deferred = self._children, self._parent, self._deferred
        need = n - from_uncached
        self._queued -= need
        force = False  # set only if every free block waits for a child (a corrupt chain)
        while need:
            if not heap:
                self._release_all_deferred()
                force = True
            key, rank, seq, run = heap[0]
            live = run.live
            if not live:  # every block of the run was hit (or held back) since
                heappop(heap)
                continue
            size = len(heap)
            if (size > 1 and not key < heap[1][0]) or (size > 2 and not key < heap[2][0]):
                # A tie on the key: the root gives its head only if its rank is exact.
                i = self._head(run)
                exact = -run.depths[i]
                if exact != rank:
                    heapreplace(heap, (key, exact, seq, run))
                    continue
                block_id = run.block_ids[i]
                run.live = live - 1
                run.cursor = i + 1
                if live == 1:
                    heappop(heap)
                if children[block_id] and not force:
                    self._defer(run, i)
                    continue
                state[block_id] = None
                out.append(block_id)
                need -= 1
                if parent[block_id] >= 0:
                    self._unlink(block_id)
                continue
            # Strictly the smallest key: the run's live blocks go first, in order, until a
            # held-back parent comes back into the heap (it may be the new root).
            ids = run.block_ids
            m = len(ids)
            i = run.cursor
            taken = 0
            j = i
            requeued = False
            # The run's next `need` live blocks (or all it has left), when they are the blocks
            # right after the cursor (no hit among them, which `live == m − i` vouches for)
            # and none has a cached child: handed out by C-level passes, as a linked list
            # would hand them out. Their explicit parent links (a hit's child, a run's top)
            # are dropped in order, stopping after one that puts a held-back parent back into
            # the heap, as the block-by-block loop below does. Hits behind them (a turn's
            # shared prefix, hit by the next turn) are not walked: the run is used up.
            k = i + (need if need < live else live)
            size = k - i
            plain = live == m - i
            long = size >= SLICE_MIN  # a short one is cheaper by the loop, unless plain
            fast = plain or long
            if fast:
                take = ids[i:k]
                gather = _gatherer(take)
                fast = (plain or gather(state).count(run) == size) and not any(gather(children))
            if fast:
                links = gather(parent)
                if links.count(-1) != size:
                    if long:
                        size, requeued = self._unlink_taken(take, links)
                        if size < k - i:
                            take = take[:size]
                    else:
                        fast = False
            if fast:
                out.extend(take)
                consume(map(setitem, repeat(state), take, repeat(None)), 0)
                taken = size
                live -= size
                j = i + size if live else m
            while live and taken < need and not requeued:
                block_id = ids[j]
                j += 1
                if state[block_id] is not run:
                    continue
                live -= 1
                if children[block_id] and not force:
                    self._defer(run, j - 1)
                    continue
                state[block_id] = None
                out.append(block_id)
                taken += 1
                p = parent[block_id]
                if p >= 0:  # an explicit link (`_unlink`, inlined: the allocation path)
                    parent[block_id] = -1
                    c = children[p] - 1
                    children[p] = c
                    if not c and p in deferred and self._requeue_deferred(p):
                        requeued = True
                        break
            need -= taken
            run.live = live
            run.cursor = j
            if not live and not requeued:
                heappop(heap)  # the run is used up (and still the root)
        return out

    def _unlink_taken(self, take: Sequence[int], links: Sequence[int]) -> tuple[int, bool]:
        """Drop the explicit parent links (`links`, −1: none) of blocks `pop_n` hands out in
        a row (`take`, none with a cached child), in order: returns how many of them go, and
        whether the last one's link put a held-back parent back into the heap (then the pop
        stops after it: the parent may be the new root). The linked blocks (a few per chain)
        are found by C-level passes."""
        parent, children, deferred = self._parent, self._children, self._deferred
        for f in compress(range(len(links)), map(ne, links, repeat(-1))):
            p = links[f]
            parent[take[f]] = -1
            c = children[p] - 1
            children[p] = c
            if not c and p in deferred and self._requeue_deferred(p):
                return f + 1, True
        return len(take), False

    def _release_all_deferred(self) -> None:
        """Put every held-back block into the heap: only reached when no free block is a leaf,
        which parent links that form a cycle (a corrupt caller) could cause."""
        for block_id in list(self._deferred):
            self._requeue_deferred(block_id)
        if not self._heap:
            raise RuntimeError("run heap: blocks are counted free but none is queued")

    def discard_n(self, block_ids: Sequence[int]) -> None:
        """Take out free blocks that another order handed out (the plugin's LRU mode): each
        forgets its run, as `pop_n` makes a popped block forget it; an uncached one leaves the
        list. The heap is rebuilt on the same bound as in `pop_n`, since no `pop_n` may come
        to clean up the runs these leave behind."""
        state = self._state
        uncached = self._uncached
        parent = self._parent
        for block_id in block_ids:
            run = state[block_id]
            if type(run) is Run:
                state[block_id] = None
                run.live -= 1
                self._queued -= 1
                if parent[block_id] >= 0:
                    self._unlink(block_id)
            else:
                uncached.remove(block_id)
        if len(self._heap) > 2 * self._queued + 1024:
            self._rebuild()

    def iter_after(self, block_id: int | None) -> Iterator[int]:
        """`_runs_after`'s blocks, one by one: chained in C, so that a walk costs one Python
        step per run, not per block."""
        return chain.from_iterable(self._runs_after(block_id))

    def _runs_after(self, block_id: int | None) -> Iterator[Sequence[int]]:
        """Free blocks in scan order after `block_id` (from the first when None; none when it
        is not free or is held back): what vLLM's lazy CPU offload walks every step
        (`FreeKVCacheBlockQueue.iter_blocks_after`), so it costs O(log runs) to find the
        block and O(1) per block after it, not a sort of the whole order.

        The scan order is the pop order but for two things it does not model: runs with equal
        keys are listed run after run (oldest first, each deepest first) where `pop_n`
        interleaves them by depth, and a block held back for a cached child is listed only
        once it is back in the heap (at its own key). It rests on a sorted list of the runs
        (key, seq), built on the first scan (O(runs log runs)) and kept from then on: one
        `insort` per queued run, in C; rebuilt when the heap list was replaced (a rebuild, or
        `lpc-return`'s re-keying) or when used-up runs outnumber the heap's entries. Do not
        change the heap while the iterator is suspended.
        """
        order = self._order
        if (
            order is None
            or self._order_heap is not self._heap
            or len(order) > 2 * len(self._heap) + 1024
        ):
            order = self._build_order()
        state = self._state
        if block_id is None:
            if self._uncached.size:
                yield list(self._uncached)
            i, start = 0, -1
        else:
            run = state[block_id]
            if type(run) is not Run:
                if block_id not in self._uncached:
                    return
                uncached = list(self._uncached)
                yield uncached[uncached.index(block_id) + 1 :]
                i, start = 0, -1
            else:
                i = bisect_left(order, (run.key, run.seq))
                if i == len(order) or order[i][2] is not run:
                    return  # held back for a cached child: not listed until it is back
                start = self._pos_of[block_id] + 1
        n = len(order)
        while i < n:
            run = order[i][2]
            i += 1
            self.scan_runs += 1
            live = run.live
            if not live:
                continue
            ids = run.block_ids
            cursor = run.cursor
            j = cursor if start < cursor else start
            start = -1
            if live == len(ids) - cursor:  # nothing hit ahead of the cursor: a C-level slice
                yield ids[j:]
            else:
                yield [b for b in ids[j:] if state[b] is run]

    def _build_order(self) -> list[tuple[Key, float, Run]]:
        """The scan order's sorted runs, from the heap's live entries (`iter_after`)."""
        order = [(run.key, run.seq, run) for _, _, _, run in self._heap if run.live]
        order.sort(key=lambda entry: entry[:2])
        self._order = order
        self._order_heap = self._heap
        self.order_builds += 1
        return order

    def _queued_in_push_order(self) -> list[int]:
        """Queued blocks in the order they were pushed: run by run, oldest first, each run's
        blocks in its own order (O(n log runs); taken once per switch to LRU order)."""
        state = self._state
        out: list[int] = []
        for run in sorted(self._runs(), key=lambda run: run.seq):
            if not run.live:
                continue
            ids = run.block_ids
            for j in range(run.cursor, len(ids)):
                if state[ids[j]] is run:
                    out.append(ids[j])
        return out

    def _rebuild(self) -> None:
        """Drop the runs every block of which was hit; re-rank the others exactly."""
        heap = []
        for _, _, seq, run in self._heap:
            i = self._head(run)
            if i < len(run.block_ids):
                heap.append((run.key, -run.depths[i], seq, run))
        heapq.heapify(heap)
        self._heap = heap

    def check_invariants(self) -> None:
        """Assert the rules the heap's fast paths rest on (for tests; O(blocks + runs)).

        - the heap is in heap order, and each entry holds its run's key and sequence number,
          each run once, with a rank never later than the run's exact rank (ranks go stale
          only towards sorting earlier);
        - a run lists its blocks deepest first (what makes stale ranks early, never late);
        - a run's `live` counts exactly its blocks at or after the cursor whose slot points
          at it, and no block before the cursor does: so `live == m − cursor` really means
          no hit lies ahead of the cursor, the fact the slicing pop path trusts;
        - every slot that holds a run points at a run in the heap or a held-back one, and
          `_queued` is the number of such slots;
        - prefix closure: each block's child count is the number of blocks that name it as
          their parent, a held-back block still has a cached child, and a block in the heap
          with a cached child is never the one `pop_n` hands out next.
        """
        heap, state = self._heap, self._state
        for k in range(1, len(heap)):
            assert not heap[k] < heap[(k - 1) // 2], f"run heap: entry {k} breaks heap order"
        queued_runs: set[int] = set()
        for key, rank, seq, run in heap:
            assert key == run.key, f"run heap: run {run.seq} is queued under a foreign key"
            assert seq == run.seq, f"run heap: run {run.seq} is queued under seq {seq}"
            assert rank <= self._exact_rank(run), (
                f"run heap: run {run.seq} has a rank later than its exact one "
                f"({rank} > {self._exact_rank(run)})"
            )
            assert id(run) not in queued_runs, f"run heap: run {run.seq} is queued twice"
            queued_runs.add(id(run))
            self._check_run(run)
        for block_id, held in self._deferred.items():
            if held.live and state[block_id] is held:
                assert self._children[block_id] > 0, (
                    f"run heap: block {block_id} is held back but has no cached child"
                )
                queued_runs.add(id(held))
        slots = [b for b, s in enumerate(state) if type(s) is Run]
        for b in slots:
            assert id(state[b]) in queued_runs, f"run heap: block {b} points at an unqueued run"
        assert len(slots) == self._queued, (
            f"run heap: {len(slots)} blocks are queued but the count says {self._queued}"
        )
        self._check_closure()

    def _check_closure(self) -> None:
        """The child counts match the parent links, and the next block `pop_n` would hand
        out (the first of `_ordered`) has no cached child."""
        counts = [0] * len(self._children)
        for p in self._parent:
            if p >= 0:
                counts[p] += 1
        for block_id, (have, want) in enumerate(zip(self._children, counts, strict=True)):
            assert have == want, (
                f"run heap: block {block_id} counts {have} cached children, {want} name it"
            )
        order, stuck = self._closure_order()
        if order and stuck < len(order):
            assert not self._children[order[0]], (
                f"run heap: block {order[0]} would be evicted before its cached child"
            )

    def _parent_of(self, block_id: int) -> int:
        """A queued block's parent: its explicit link, else the next block of its chain run
        (−1: none known)."""
        p = self._parent[block_id]
        run = self._state[block_id]
        if p >= 0 or type(run) is not Run or not run.chain:
            return p
        j = self._pos_of[block_id] + 1
        return run.block_ids[j] if j < len(run.block_ids) else -1

    def _check_run(self, run: Run) -> None:
        ids, depths, state = run.block_ids, run.depths, self._state
        assert len(ids) == len(depths), f"run heap: run {run.seq} has ids and depths unequal"
        assert all(depths[j] >= depths[j + 1] for j in range(len(depths) - 1)), (
            f"run heap: run {run.seq} does not list its blocks deepest first"
        )
        assert not any(state[b] is run for b in ids[: run.cursor]), (
            f"run heap: run {run.seq} has a queued block behind its cursor"
        )
        assert all(self._pos[b] == j for j, b in enumerate(ids) if state[b] is run), (
            f"run heap: run {run.seq} has a block whose position is not its index"
        )
        live = sum(1 for b in ids[run.cursor :] if state[b] is run)
        assert run.live == live, f"run heap: run {run.seq} counts {run.live} live, has {live}"

    def _exact_rank(self, run: Run) -> int:
        """The run's exact rank, without moving the cursor: −depth of its first live block
        (0 if none)."""
        state = self._state
        for j in range(run.cursor, len(run.block_ids)):
            if state[run.block_ids[j]] is run:
                return -run.depths[j]
        return 0

    def _runs(self) -> Iterator[Run]:
        """Every run in the heap (dead ones included) and every held-back one, in no order."""
        for entry in self._heap:
            yield entry[3]
        yield from self._deferred.values()

    def _ordered(self) -> Iterator[int]:
        """Queued blocks in pop order, without popping (O(n log n); for tests and debugging):
        the smallest (key, −depth, age) among the blocks with no queued child, as `pop_n`."""
        return iter(self._closure_order()[0])

    def _closure_order(self) -> tuple[list[int], int]:
        """`_ordered`'s order, and how many blocks at its end wait for a child that never
        leaves (only links that form a cycle, from a corrupt caller, leave any)."""
        state = self._state
        items = []
        for run in self._runs():
            for j in range(run.cursor, len(run.block_ids)):
                block_id = run.block_ids[j]
                if state[block_id] is run:
                    items.append((run.key, -run.depths[j], run.seq, block_id))
        # As pop_n counts them: every explicitly linked cached child, queued or not (a child
        # in use while its parent is free only arises from duplicate contents, and holds the
        # parent back); a queued block's implicit parent (the next block of its chain run)
        # waits for it too, though the order already puts it first.
        waiting = {block_id: self._children[block_id] for *_, block_id in items}
        up = {block_id: self._parent_of(block_id) for block_id in waiting}
        for block_id in waiting:
            p = up[block_id]
            if p >= 0 and self._parent[block_id] < 0 and p in waiting:
                waiting[p] += 1
        heapq.heapify(items)
        held: dict[int, tuple[Key, int, float, int]] = {}
        order: list[int] = []
        while items:
            item = heapq.heappop(items)
            block_id = item[3]
            if waiting[block_id]:
                held[block_id] = item
                continue
            order.append(block_id)
            p = up[block_id]
            if p in waiting:
                waiting[p] -= 1
                if not waiting[p] and p in held:
                    heapq.heappush(items, held.pop(p))
        # Blocks whose child never leaves: only a corrupt chain or duplicate contents.
        order.extend(block_id for *_, block_id in sorted(held.values()))
        return order, len(held)
