"""vLLM's free-block queue, ordered by LPC instead of LRU: an adapter over `LPCEvictor`.

vLLM's `BlockPool` keeps every free block in a `FreeKVCacheBlockQueue` and evicts by popping
its front. `LPCFreeBlockQueue` offers the same methods on the same `KVCacheBlock` objects but
keeps no order of its own: it maps blocks to their ids and drives `eviction.lpc.LPCEvictor`,
the one implementation of LPC's ordering (static key logit(p) + scale·t, max pooling, deeper
block first on ties, blocks without a hash before every cached one).

What the queue cannot see — the probability, time and conversation of a release — comes from
the release context the plugin sets while vLLM frees a request (`QueueRuntime.releasing`).
Blocks appended outside any release (e.g. `BlockPool.unpin_blocks`) get the fallback p at the
current time. A preempted request's release (`ProtectedRelease`) queues its blocks after every
free block (`LPCEvictor.push_protected`): it will need them again in milliseconds, and LRU
queues them last too.

Two structures hold the free blocks: the engine's own `FreeKVCacheBlockQueue` list (the
queue's second base class, `bind_queue_class`) and the learned evictor. The mode
(`QueueRuntime.mode`, switchable while the engine runs; see `mode`) picks the queue's class:
in `lpc` cached releases go to the learned evictor; in `lru` and `shadow` (off) the queue is
vLLM's own list, its methods unchanged, once the learned evictor has drained (its blocks are
evicted first, one pop at a time: `_Draining`). A switch changes one class pointer and touches
no block (docs/design.md, "The kill switch").

The evictor is built from the configuration and, with `lpc-pooled`, the loaded access model's
label horizon (`QueueRuntime.horizon_s`, from its artifact's metadata; 180 s without one).
With `lpc-return` it is `eviction.return_window.ReturnWindowEvictor`: a release carries its
conversation's return curve (`Release.return_curve`, from the in-process return-time model;
none: the evictor's fallback score), a preempted request's blocks take a protected claim that
ranks after every other block, and LRU mode rebuilds LRU's order from it exactly as from LPC.

Fail-safe: an exception in LPC's part of `append_n` (the release's key, pooling) or of
`note_shared_release` never reaches vLLM's `BlockPool`, which would be left half way through a
free. It is counted (`plugin_errors`, the first one logged) and the blocks are queued with the
fallback p at the current time (LRU's place). An exception where vLLM needs an answer (a pop,
a hit's `remove`, that fallback) trips the queue (`_trip`): the learned evictor's blocks go to
vLLM's list and the queue is vLLM's own from then on. A scan for the CPU offload
(`iter_blocks_after`) that fails ends early. Errors that are vLLM's own contract (popping from
an empty queue, removing a block that is not free) are raised as vLLM raises them.

This module imports nothing from vLLM: blocks are duck-typed (`block_id`, `block_hash`,
`block_hash_num_tokens`, and the list's `prev_free_block`/`next_free_block`), and vLLM's queue
class is passed in, so it is tested with real `KVCacheBlock`s in vLLM's venv and with the
transcription (`stock_queue`) everywhere else.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter, is_not
from typing import Any, ClassVar

import numpy as np

from eviction.base import FreedBlocks, Release
from eviction.lpc import LPCEvictor
from eviction.lpc_pooled import DEFAULT_MEMORY_WINDOW_S, DEFAULT_SHARED_HORIZON_S
from eviction.registry import make_evictor
from eviction.return_window import ReturnWindowEvictor
from lpc.integrations.config import PluginConfig
from lpc.integrations.engine_context import EngineContext, engine_context
from lpc.integrations.histograms import PluginHistograms
from lpc.integrations.mode import ModeSwitch
from lpc.integrations.stats import PluginStats
from lpc.integrations.stock_queue import StockFreeBlockQueue

Clock = Callable[[], float]
# The evictors the queue drives: both keep a preempted request's blocks last
# (`push_protected`), pool metadata across releases and scan in order (`RunHeap.iter_after`).
LearnedEvictor = LPCEvictor | ReturnWindowEvictor


@dataclass(frozen=True, slots=True)
class ProtectedRelease(Release):
    """The release of a request that is not finished (preempted): its blocks are queued after
    every free block (`LPCEvictor.push_protected`), since it asks for them again as soon as it
    is rescheduled; its probability is not used."""


@dataclass
class QueueRuntime:
    """What every LPC queue of a process shares: configuration, clock, counters, context."""

    config: PluginConfig
    stats: PluginStats
    clock: Clock = time.monotonic
    activate: Callable[[], None] | None = None  # called once, when the first queue is built
    # The loaded access model's label horizon (its artifact's `inputs.horizon_s`): what
    # `lpc-pooled` judges reuse and the model over. None: no model loaded, the default.
    horizon_s: float | None = None
    histograms: PluginHistograms = field(default_factory=PluginHistograms)
    # Learned from vLLM's constructors when the first queue is built (`engine_context`).
    engine: EngineContext = field(default_factory=EngineContext)
    # The latest queue's (its trust gate, or lpc-return's window, is exported).
    evictor: LearnedEvictor | None = None
    # lpc, lru or shadow; the queues follow a change at once (`mode`, the kill switch).
    mode: ModeSwitch = field(default_factory=ModeSwitch)
    _release: ContextVar[Release | None] = field(
        default_factory=lambda: ContextVar("lpc_release", default=None)
    )
    _active: bool = False

    def queue_built(self) -> None:
        if not self._active:
            self._active = True
            try:
                self.engine = engine_context(sys._getframe(1))
            except Exception as error:  # unknown block size, rank 0: still correct
                self.stats.plugin_error("reading the engine's block size and rank", error)
            if self.activate is not None:
                try:
                    self.activate()
                except Exception as error:  # e.g. the metrics server: vLLM must still start
                    self.stats.plugin_error("activating the plugin (metrics server)", error)

    def active_release(self) -> Release | None:
        """The release being freed now, if any."""
        return self._release.get()

    def current_release(self) -> Release:
        """The release being freed now, or an anonymous one (fallback p, current time)."""
        release = self._release.get()
        return release if release is not None else Release(self.clock(), None, None)

    @contextmanager
    def releasing(self, release: Release) -> Iterator[None]:
        """Blocks freed inside this block carry `release`'s probability, time and conversation."""
        token = self._release.set(release)
        try:
            yield
        finally:
            self._release.reset(token)

    @property
    def evictor_horizon_s(self) -> float | None:
        """The horizon `lpc-pooled` runs with: the model's, else the default (None: `lpc`)."""
        if self.config.evictor != "lpc-pooled":
            return None
        return self.horizon_s if self.horizon_s is not None else DEFAULT_SHARED_HORIZON_S

    def new_evictor(self, num_blocks: int) -> LearnedEvictor:
        """The configured learned evictor: `lpc` or `lpc-pooled` (LPC evictors; the pooled
        one judges over the loaded model's horizon, and remembers contents at least that
        long), or `lpc-return` with its own constants, as the replay runs it (W = 4 × its
        measured turnover, re-keyed every 5 s, fallback score 0.5: `eviction/return_window.py`);
        its curves come with the releases."""
        c = self.config
        if c.evictor == ReturnWindowEvictor.name:
            evictor: LearnedEvictor = ReturnWindowEvictor(num_blocks)
            self.evictor = evictor
            return evictor
        options = {}
        horizon_s = self.evictor_horizon_s
        if horizon_s is not None:
            options = {
                "horizon_s": horizon_s,
                "memory_window_s": max(DEFAULT_MEMORY_WINDOW_S, horizon_s),
            }
        evictor = make_evictor(
            c.evictor,
            num_blocks,
            scale_per_s=c.scale_per_s,
            fallback_probability=c.fallback_probability,
            probability_floor=c.probability_floor,
            **options,
        )
        assert isinstance(evictor, LPCEvictor), f"{c.evictor} is not an LPC evictor"
        self.evictor = evictor
        return evictor


# The methods vLLM's `BlockPool` (and its CPU offload) calls on its free queue: what each mode's
# class takes from vLLM's own class (off, drained) or defines (lpc, draining).
VLLM_METHODS = (
    "popleft",
    "popleft_n",
    "remove",
    "append",
    "append_n",
    "prepend_n",
    "get_all_free_blocks",
    "iter_blocks_after",
)


@dataclass(frozen=True)
class ModeClasses:
    """The classes one queue takes in turn (`follow`): `lpc`, and per off mode (`lru`,
    `shadow`) the draining class and the drained one, which is vLLM's queue."""

    lpc: type
    draining: dict[str, type]
    drained: dict[str, type]

    def off(self, mode: str, draining: bool) -> type:
        flavour = "shadow" if mode == "shadow" else "lru"
        return (self.draining if draining else self.drained)[flavour]


class _QueueCore:
    """What every mode's class shares: the learned structure, the fail-safe, the mode.

    State (set by `LPCFreeBlockQueue.__init__`, kept across class changes): vLLM's linked list
    (its own attributes: `fake_free_list_head`/`_tail`; `num_free_blocks` counts the free
    blocks of both structures), `_learned` (the learned evictor over block ids), `_blocks`.
    A free block is in exactly one of them: linked (`prev_free_block` set) or held by
    `_learned`.
    """

    runtime: ClassVar[QueueRuntime]
    # The engine's FreeKVCacheBlockQueue: its methods run the list (`bind_queue_class`).
    stock: ClassVar[type] = StockFreeBlockQueue
    classes: ClassVar[ModeClasses | None] = None
    _learned: LearnedEvictor
    _blocks: list[Any]
    _released_s: np.ndarray
    _tripped: bool
    num_free_blocks: int
    fake_free_list_head: Any
    fake_free_list_tail: Any

    # -- the mode ----------------------------------------------------------------------------
    def follow(self, mode: str) -> None:
        """Take `mode` on: called under the mode switch's lock, from any thread. O(1): one
        class store. Off from `lpc`, the learned structure may hold blocks: the draining
        class evicts them first (`_Draining`); on from off, the list's blocks go first."""
        classes = self.classes
        current = type(self)
        if mode == "lpc" and not self._tripped:
            target = classes.lpc
        else:  # a tripped queue's learned structure is empty: vLLM's queue at once
            draining = not self._tripped and (
                current is classes.lpc or current in classes.draining.values()
            )
            target = classes.off(mode, draining)
        if current is not target:
            self.__class__ = target

    def _drained(self) -> None:
        """The learned structure is empty while draining: from now on the queue is vLLM's own
        (on the scheduler thread, under the switch's lock so a switch is not lost)."""
        switch = self.runtime.mode
        with switch.lock:
            classes = self.classes
            if type(self) in classes.draining.values() and not len(self._learned):
                self.__class__ = classes.off(switch.mode, draining=False)

    # -- the learned structure, fail-safe ------------------------------------------------
    def _take_learned(self, n: int) -> list[Any]:
        """Pop `n` blocks from the learned structure (the caller checked it holds them)."""
        runtime = self.runtime
        try:
            ids = self._learned.pop_n(n, runtime.clock())
        except Exception as error:
            self._trip("the LPC queue's pop", error)
            return self.stock.popleft_n(self, n)
        self.num_free_blocks -= n
        popped = list(map(self._blocks.__getitem__, ids))
        hashes = list(map(self._hash_of, popped))
        evicted = n - hashes.count(None)
        if evicted:
            runtime.stats.add(evictions=evicted)
            try:  # metrics only: the blocks are already vLLM's
                cached = None if evicted == n else list(map(is_not, hashes, repeat(None)))
                self._observe_eviction_ages(ids, cached)
            except Exception as error:
                runtime.stats.plugin_error("the eviction-age histogram", error)
        return popped

    def _observe_eviction_ages(self, ids: list[int], cached: list[bool] | None) -> None:
        """Eviction ages of the cached blocks among those popped (`ids`; `cached[i]` says
        whether block i held a hash, None: all did): one observation per run of consecutive
        blocks released together (equal release times), not one per block. In C but for one
        step per run; one release's blocks (the common case) take two reductions."""
        runtime = self.runtime
        times = self._released_s[np.fromiter(ids, np.intp, len(ids))]
        if cached is not None:
            times = times[np.fromiter(cached, bool, len(cached))]
        first = float(times[0])
        if first == times.min() == times.max():
            runtime.histograms.eviction_age_s.observe_n(runtime.clock() - first, len(times))
            return
        starts = np.flatnonzero(np.diff(times)) + 1
        counts = np.diff(np.concatenate(([0], starts, [len(times)])))
        ages = runtime.clock() - times[np.concatenate(([0], starts))]
        observe = runtime.histograms.eviction_age_s.observe_n
        for age, count in zip(ages.tolist(), counts.tolist(), strict=True):
            observe(age, count)

    def _trip(self, where: str, error: Exception) -> None:
        """The learned evictor failed where vLLM cannot take an error: hand every block it
        holds to vLLM's list (its tail), and run vLLM's own queue from now on, whatever the
        mode says (counted in `plugin_errors`, logged). O(blocks), once."""
        runtime = self.runtime
        runtime.stats.plugin_error(f"{where} (this queue runs stock vLLM from now on)", error)
        try:
            held = self._learned.free_block_ids()
        except Exception:  # the evictor cannot say: the free blocks no structure links
            held = [
                block.block_id
                for block in self._blocks
                if block.prev_free_block is None
                and getattr(block, "ref_cnt", 1) == 0
                and not getattr(block, "is_null", False)
            ]
        blocks = self._blocks
        salvaged = [blocks[i] for i in held if blocks[i].prev_free_block is None]
        self.stock.append_n(self, salvaged)
        # Recount from the list itself: an evictor that failed half way may have lost blocks.
        count = 0
        node = self.fake_free_list_head.next_free_block
        tail = self.fake_free_list_tail
        while node is not tail:
            count += 1
            node = node.next_free_block
        self.num_free_blocks = count
        try:
            self._learned.reset([])
        except Exception as reset_error:
            runtime.stats.plugin_error("resetting the failed learned evictor", reset_error)
        with runtime.mode.lock:
            self._tripped = True
            self.follow(runtime.mode.mode)

    def remove(self, block: Any) -> None:
        """A hit on a free block: out of whichever structure holds it."""
        if block.prev_free_block is not None:
            self.stock.remove(self, block)
            return
        try:
            self._learned.remove(block.block_id)
        except KeyError:
            raise RuntimeError(f"remove() called on a block that is not free: {block}") from None
        except Exception as error:
            self._trip("the LPC queue's remove", error)
            if block.prev_free_block is not None:  # salvaged into the list: take it out
                self.stock.remove(self, block)
            return  # else lost with the evictor's state: out of every structure, as asked
        self.num_free_blocks -= 1

    def _learned_after(self, block_id: int | None) -> Iterator[Any]:
        """The learned structure's blocks in its scan order after `block_id`
        (`RunHeap.iter_after`, chained in C); an evictor error ends the scan, never reaches
        vLLM. One Python step per block: this frame's."""
        try:
            yield from map(self._blocks.__getitem__, self._learned.iter_after(block_id))
        except Exception as error:
            self.runtime.stats.plugin_error("the LPC queue's scan for the CPU offload", error)

    def _holds(self, block: Any) -> bool:
        try:
            return block.block_id in self._learned
        except Exception as error:
            self.runtime.stats.plugin_error("the LPC queue's membership test", error)
            return False

    def get_all_free_blocks(self) -> list[Any]:
        """Every free block in eviction order, exactly (O(n log n): vLLM uses it in tests)."""
        listed = self.stock.get_all_free_blocks(self)
        blocks = self._blocks
        learned = [blocks[i] for i in self._learned.free_block_ids()]
        if type(self) is self.classes.lpc:
            return listed + learned
        k = 0
        while k < len(listed) and listed[k].block_hash is None:
            k += 1
        return listed[:k] + learned + listed[k:]

    # -- what the plugin adds --------------------------------------------------------------
    def note_shared_release(self, blocks: Sequence[Any], release: Release) -> None:
        """Cached blocks this release gave up while other requests still hold them (pooling
        metadata only: on an error it is skipped, as stock vLLM has none)."""
        if blocks:
            try:
                if type(release) is ProtectedRelease:
                    self._learned.note_protected_release(_freed(blocks, self._hash_of), release)
                else:
                    self._learned.note_shared_release(_freed(blocks, self._hash_of), release)
            except Exception as error:
                self.runtime.stats.plugin_error("the LPC queue's shared release", error)
                return
            self.runtime.stats.add(shared_blocks_released=len(blocks))

    @property
    def evictor(self) -> LearnedEvictor:
        """The learned evictor (empty once an off mode drained it)."""
        return self._learned


class LPCFreeBlockQueue(_QueueCore):
    """A drop-in for vLLM 0.33's `FreeKVCacheBlockQueue` that evicts by LPC (`lpc` mode).

    vLLM builds it as `FreeKVCacheBlockQueue(blocks)` with only the block list, so the
    shared `QueueRuntime` is a class attribute of the subclass `bind_queue_class` makes at
    registration, with the engine's own queue class as its second base. Block ids must be the
    blocks' positions in the list (vLLM's invariant).

    Two structures hold the free blocks: vLLM's linked list and the learned evictor. In `lpc`
    mode releases of cached blocks go to the learned evictor; blocks without a hash go to the
    front of the list, as vLLM puts them; pops take the list first (its hash-less blocks, then
    any cached ones left from an off mode, in their LRU order), then the learned order. At
    start every block is in the list (uncached, in id order), as in vLLM.
    """

    def __init__(self, blocks: list[Any]) -> None:
        for index, block in enumerate(blocks):
            if block.block_id != index:
                raise ValueError(
                    f"block at position {index} has id {block.block_id}; the LPC queue needs "
                    "block ids equal to their positions in the pool"
                )
        classes = type(self).classes
        if classes is None or classes.lpc is not type(self):  # a subclass defined elsewhere
            _with_mode_classes(type(self))
        self.stock.__init__(self, blocks)  # every block free, in vLLM's list, in id order
        self._blocks = list(blocks)
        # Each block's last release time (the queue's clock): its age when evicted. A numpy
        # array, so that a release writes its chain's times, and a pop reads them, in C.
        self._released_s = np.zeros(len(blocks))
        self._learned = self.runtime.new_evictor(len(blocks))
        # How a release reads its blocks' hashes: vLLM's `block_hash` is a property over the
        # slot `_block_hash`; reading the slot in C halves the pass. Plain LPC never reads a
        # hash (only the pooled memory and lpc-return do): its releases skip the pass.
        self._hash_of = _hash_getter(blocks)
        self._reads_hashes = type(self._learned) is not LPCEvictor
        self._learned.reset([])
        self._tripped = False
        self.runtime.queue_built()
        self.runtime.mode.attach(self)  # an off mode makes this vLLM's own queue at once

    # -- what BlockPool calls ------------------------------------------------------------
    def popleft(self) -> Any:
        if self.fake_free_list_head.next_free_block is not self.fake_free_list_tail:
            return self.stock.popleft(self)
        if not self.num_free_blocks:
            raise ValueError("No free blocks available")
        return self._take_learned(1)[0]

    def popleft_n(self, n: int) -> list[Any]:
        if n == 0:
            return []
        if n > self.num_free_blocks:
            raise ValueError(f"cannot pop {n} blocks: only {self.num_free_blocks} are free")
        if self.fake_free_list_head.next_free_block is self.fake_free_list_tail:
            return self._take_learned(n)
        linked = self.num_free_blocks - len(self._learned)
        if n <= linked:
            return self.stock.popleft_n(self, n)
        out = self.stock.popleft_n(self, linked)
        out += self._take_learned(n - linked)
        return out

    def append(self, block: Any) -> None:
        self.append_n([block])

    def append_n(self, blocks: Sequence[Any]) -> None:
        """Blocks with a hash whose last holder released them, the sequence's tail first."""
        if not blocks:
            return
        runtime = self.runtime
        release = runtime.current_release()
        protected = type(release) is ProtectedRelease
        try:
            freed = _freed(blocks, self._hash_of if self._reads_hashes else None)
            if protected:
                self._learned.push_protected(freed, release)
            else:
                self._learned.push_cached(freed, release)
            self.num_free_blocks += len(blocks)
        except Exception as error:
            runtime.stats.plugin_error("the LPC queue's append", error)
            self._append_as_lru(blocks)
            if self._tripped:
                return
        try:  # for the eviction-age histogram
            ids = list(map(_block_id, blocks))
            self._released_s[np.fromiter(ids, np.intp, len(ids))] = release.time_s
        except Exception as error:
            runtime.stats.plugin_error("the LPC queue's release times", error)
        if protected:
            runtime.stats.add(
                cached_blocks_released=len(blocks), protected_blocks_released=len(blocks)
            )
        else:
            runtime.stats.add(cached_blocks_released=len(blocks))

    def _append_as_lru(self, blocks: Sequence[Any]) -> None:
        """After a failed append: queue the blocks the evictor does not hold yet with the
        fallback p at the current time and no conversation (LRU's place); if even that fails,
        the queue trips (`_trip`) and the blocks go to the tail of vLLM's list."""
        learned = self._learned
        try:
            freed = _freed(blocks, self._hash_of)
            keep = [i for i, block_id in enumerate(freed.block_ids) if block_id not in learned]
            if keep:
                left = FreedBlocks(
                    [freed.block_ids[i] for i in keep],
                    [freed.depths[i] for i in keep],
                    [freed.hashes[i] for i in keep],
                )
                learned.push_cached(left, Release(self.runtime.clock(), None, None))
            self.num_free_blocks += len(blocks)
            return
        except Exception as error:
            self._trip("the LPC queue's fallback append", error)
        rest = [block for block in blocks if block.prev_free_block is None]
        self.stock.append_n(self, rest)

    def prepend_n(self, blocks: Sequence[Any]) -> None:
        """Blocks without a hash: reused before any cached block, at the list's front, as
        vLLM puts them."""
        if not blocks:
            return
        self.stock.prepend_n(self, blocks)
        self.runtime.stats.add(uncached_blocks_released=len(blocks))

    def iter_blocks_after(self, cursor: Any | None) -> Iterator[Any]:
        """Free blocks in eviction order after `cursor` (all when None, none if it is not
        free): the list's, then the learned structure's scan order (`RunHeap.iter_after`).
        O(log runs) to start, O(1) per block: vLLM's lazy CPU offload calls it every step."""
        if cursor is None or cursor.prev_free_block is not None:
            yield from self.stock.iter_blocks_after(self, cursor)
            after = None
        elif self._holds(cursor):
            after = cursor.block_id
        else:
            return
        try:  # inlined `_learned_after`: one generator frame per block, as vLLM's own walk
            yield from map(self._blocks.__getitem__, self._learned.iter_after(after))
        except Exception as error:
            self.runtime.stats.plugin_error("the LPC queue's scan for the CPU offload", error)


class _Draining:
    """An off mode while the learned structure still holds blocks (`lru` or `shadow` just
    thrown): releases go to vLLM's list by vLLM's own methods (the class dict binds them);
    pops take the list's leading hash-less blocks (vLLM reuses those first), then the learned
    structure's blocks in its own order (all released before every cached block in the list,
    so LRU's order across the boundary), then the list. When the learned structure is empty
    the queue becomes vLLM's own (`_drained`). O(log runs) per pop, nothing rebuilt."""

    def popleft(self: Any) -> Any:
        first = self.fake_free_list_head.next_free_block
        if first is not self.fake_free_list_tail and first.block_hash is None:
            return self.stock.popleft(self)
        if len(self._learned):
            block = self._take_learned(1)[0]
            if not len(self._learned):
                self._drained()
            return block
        self._drained()
        return self.stock.popleft(self)

    def popleft_n(self: Any, n: int) -> list[Any]:
        if n == 0:
            return []
        if n > self.num_free_blocks:
            raise ValueError(f"cannot pop {n} blocks: only {self.num_free_blocks} are free")
        out: list[Any] = []
        head, tail = self.fake_free_list_head, self.fake_free_list_tail
        while len(out) < n:
            first = head.next_free_block
            if first is tail or first.block_hash is not None:
                break
            out.append(self.stock.popleft(self))
        held = len(self._learned)
        if len(out) < n and held:
            out += self._take_learned(min(n - len(out), held))
        if not len(self._learned):
            self._drained()
        if len(out) < n:
            out += self.stock.popleft_n(self, n - len(out))
        return out

    def iter_blocks_after(self: Any, cursor: Any | None) -> Iterator[Any]:
        """In pop order: the list's leading hash-less blocks, the learned structure's, then
        the rest of the list."""
        tail = self.fake_free_list_tail
        prefix = []
        node = self.fake_free_list_head.next_free_block
        while node is not tail and node.block_hash is None:
            prefix.append(node)
            node = node.next_free_block
        rest_from = node  # the first list block after the hash-less prefix
        if cursor is None:
            yield from prefix
            yield from self._learned_after(None)
        elif cursor.prev_free_block is not None:
            at = next((i for i, block in enumerate(prefix) if block is cursor), None)
            if at is None:
                yield from self.stock.iter_blocks_after(self, cursor)
                return
            yield from prefix[at + 1 :]
            yield from self._learned_after(None)
        elif self._holds(cursor):
            yield from self._learned_after(cursor.block_id)
        else:
            return
        if rest_from is not tail:
            yield rest_from
            yield from self.stock.iter_blocks_after(self, rest_from)

    def note_shared_release(self: Any, blocks: Sequence[Any], release: Release) -> None:
        """Off: no pooling metadata is kept (the learned structure only drains)."""


_block_id = attrgetter("block_id")
_block_hash = attrgetter("block_hash")
_block_hash_slot = attrgetter("_block_hash")


def _hash_getter(blocks: Sequence[Any]) -> Callable[[Any], Any]:
    """`attrgetter` of the blocks' hash: vLLM's slot when `block_hash` is the property that
    returns it (vLLM 0.33's `KVCacheBlock`), else the attribute itself (duck-typed blocks)."""
    if blocks:
        kind = type(blocks[0])
        if isinstance(getattr(kind, "block_hash", None), property) and hasattr(
            blocks[0], "_block_hash"
        ):
            return _block_hash_slot
    return _block_hash


def _freed(blocks: Sequence[Any], hash_of: Callable[[Any], Any] | None) -> FreedBlocks:
    # Fresh lists: the evictor keeps references to them. A block's depth is the token count
    # its hash covers (0 when unknown): `LPCEvictor` compares depths only with each other, to
    # evict the deeper of two blocks with equal keys, so (index + 1) · block size orders blocks
    # exactly as their index does, without knowing the group's block size.
    # vLLM frees a request's blocks tail first, and those whose count reached 0 are the
    # sequence's tail (other requests hold a prefix): a chain, whose top's parent the queue
    # does not see (links within the release are what prefix closure needs for a branch).
    # So its depths step down by one block from the tail's: a range from the two ends, with
    # no pass over the blocks, whenever the ends say so (else each block's own). The ids and
    # hashes are read in C (`map`), not by a Python loop; `hash_of` None: the evictor reads
    # no hash, so none is read (all None, as for blocks whose caller passes none).
    n = len(blocks)
    deepest = blocks[0].block_hash_num_tokens or 0
    top = blocks[-1].block_hash_num_tokens or 0
    step = (deepest - top) // (n - 1) if n > 1 else 0
    if n == 1:
        depths: Sequence[int] = [deepest]
    elif step > 0 and deepest - top == step * (n - 1):
        depths = range(deepest, top - step, -step)
    else:
        depths = [block.block_hash_num_tokens or 0 for block in blocks]
    return FreedBlocks(
        list(map(_block_id, blocks)),
        depths,
        [None] * n if hash_of is None else list(map(hash_of, blocks)),
        chain=True,
    )


def bind_queue_class(runtime: QueueRuntime, stock: type | None = None) -> type[LPCFreeBlockQueue]:
    """The queue class `BlockPool` will instantiate, bound to this process's runtime, over
    `stock`: the engine's own `FreeKVCacheBlockQueue` (its list and its methods are the off
    mode; None: `stock_queue.StockFreeBlockQueue`, the transcription, where vLLM is absent).

    The off classes for `lru` are no `LPCFreeBlockQueue`: the plugin's hooks, which act only
    on pools whose queue is one (`vllm_plugin._runtime_of`), leave such a pool to vLLM."""
    stock = StockFreeBlockQueue if stock is None else stock
    shared: dict[str, Any] = {"runtime": runtime, "stock": stock}
    lpc = type("LPCFreeKVCacheBlockQueue", (LPCFreeBlockQueue, stock), dict(shared))
    return _with_mode_classes(lpc, shared)


def _with_mode_classes(lpc: type, shared: dict[str, Any] | None = None) -> type:
    """Give the `lpc` mode's class its off classes (`ModeClasses`). With `shared` (the
    runtime and vLLM's class, `bind_queue_class`), `lru`'s are built on vLLM's class alone,
    so they are no `LPCFreeBlockQueue`; without it (a subclass defined elsewhere, e.g. the
    seam's queue) every class derives from `lpc`, keeping what it adds."""
    stock = lpc.stock
    own = {name: getattr(stock, name) for name in VLLM_METHODS}
    releases = {name: own[name] for name in ("append", "append_n", "prepend_n")}
    quiet = {"note_shared_release": _Draining.note_shared_release}
    name = lpc.__name__
    shadow_draining = type(f"{name}ShadowDraining", (_Draining, lpc), dict(releases))
    shadow_drained = type(f"{name}ShadowStock", (lpc,), own | quiet)
    if shared is None:
        lru_draining = type(f"{name}OffDraining", (_Draining, lpc), dict(releases))
        lru_drained = type(f"{name}OffStock", (lpc,), own | quiet)
    else:
        lru_draining = type(
            "LPCOffDrainingQueue", (_Draining, _QueueCore, stock), shared | releases
        )
        lru_drained = type("LPCOffStockQueue", (_QueueCore, stock), shared | own | quiet)
    classes = ModeClasses(
        lpc,
        {"shadow": shadow_draining, "lru": lru_draining},
        {"shadow": shadow_drained, "lru": lru_drained},
    )
    for cls in (lpc, shadow_draining, shadow_drained, lru_draining, lru_drained):
        cls.classes = classes
    return lpc
