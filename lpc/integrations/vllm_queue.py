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

In `lru` and `shadow` mode (`QueueRuntime.mode`, switchable while the engine runs; see
`mode`) the queue evicts in stock vLLM's LRU order, exactly, while the learned evictor keeps
seeing every release so that switching back resumes the learned order.

The evictor is built from the configuration and, with `lpc-pooled`, the loaded access model's
label horizon (`QueueRuntime.horizon_s`, from its artifact's metadata; 180 s without one).
With `lpc-return` it is `eviction.return_window.ReturnWindowEvictor`: a release carries its
conversation's return curve (`Release.return_curve`, from the in-process return-time model;
none: the evictor's fallback score), a preempted request's blocks take a protected claim that
ranks after every other block, and LRU mode rebuilds LRU's order from it exactly as from LPC.

Fail-safe: an exception in LPC's part of `append_n` (the release's key, pooling) or of
`note_shared_release` never reaches vLLM's `BlockPool`, which would be left half way through a
free. It is counted (`plugin_errors`, the first one logged) and the blocks are queued as stock
vLLM would queue them: with the fallback p at the current time, i.e. LRU's place. Errors that
are vLLM's own contract (popping from an empty queue, removing a block that is not free) are
raised as vLLM raises them.

This module imports nothing from vLLM: blocks are duck-typed (`block_id`, `block_hash`,
`block_hash_num_tokens`), so it is tested with real `KVCacheBlock`s in vLLM's venv and reads
the same everywhere.
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
from lpc.integrations.mode import LRUOrder, ModeSwitch
from lpc.integrations.stats import PluginStats

Clock = Callable[[], float]
# The evictors the queue drives: both keep a preempted request's blocks last
# (`push_protected`), pool metadata across releases and rebuild LRU's order (`mode.LRUOrder`).
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
    # lpc, lru or shadow; a queue applies a change at its next pop (`mode`, the kill switch).
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


class LPCFreeBlockQueue:
    """A drop-in for vLLM 0.33's `FreeKVCacheBlockQueue` that evicts by LPC.

    vLLM builds it as `FreeKVCacheBlockQueue(blocks)` with only the block list, so the
    shared `QueueRuntime` is a class attribute of the subclass `bind_queue_class` makes at
    registration. Block ids must be the blocks' positions in the list (vLLM's invariant).
    """

    runtime: ClassVar[QueueRuntime]

    def __init__(self, blocks: list[Any]) -> None:
        for index, block in enumerate(blocks):
            if block.block_id != index:
                raise ValueError(
                    f"block at position {index} has id {block.block_id}; the LPC queue needs "
                    "block ids equal to their positions in the pool"
                )
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
        self._learned.reset(range(len(blocks)))
        # What decides evictions: the learned evictor, or in lru/shadow mode an `LRUOrder`
        # over it (`_apply_mode`, at a pop).
        self._evictor: LearnedEvictor | LRUOrder = self._learned
        self._lru_order = False
        self.runtime.queue_built()
        self._apply_mode()

    def _apply_mode(self) -> None:
        """Evict in the mode's order from now on: LRU order rebuilt exactly from the learned
        evictor (`mode.LRUOrder`), or the learned order, which saw everything meanwhile."""
        lru_order = self.runtime.mode.lru_order
        if lru_order == self._lru_order:
            return
        self._evictor = LRUOrder(self._learned, len(self._blocks)) if lru_order else self._learned
        self._lru_order = lru_order

    # -- what BlockPool calls ------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self._evictor)

    def popleft(self) -> Any:
        if self.runtime.mode.lru_order is not self._lru_order:
            self._apply_mode()
        if not len(self._evictor):
            raise ValueError("No free blocks available")
        # The time matters to `lpc-return` (its scores age, W is measured); LPC's keys are
        # static and ignore it.
        block = self._blocks[self._evictor.pop(self.runtime.clock())]
        if block.block_hash is not None:
            runtime = self.runtime
            runtime.stats.add(evictions=1)
            try:  # metrics only: the block is already vLLM's
                age = runtime.clock() - float(self._released_s[block.block_id])
                runtime.histograms.eviction_age_s.observe(age)
            except Exception as error:
                runtime.stats.plugin_error("the eviction-age histogram", error)
        return block

    def popleft_n(self, n: int) -> list[Any]:
        if n == 0:
            return []
        if self.runtime.mode.lru_order is not self._lru_order:
            self._apply_mode()
        if n > len(self._evictor):
            raise ValueError(f"cannot pop {n} blocks: only {len(self._evictor)} are free")
        ids = self._evictor.pop_n(n, self.runtime.clock())
        popped = list(map(self._blocks.__getitem__, ids))
        hashes = list(map(self._hash_of, popped))
        evicted = n - hashes.count(None)
        if evicted:
            self.runtime.stats.add(evictions=evicted)
            try:  # metrics only: the blocks are already vLLM's
                cached = None if evicted == n else list(map(is_not, hashes, repeat(None)))
                self._observe_eviction_ages(ids, cached)
            except Exception as error:
                self.runtime.stats.plugin_error("the eviction-age histogram", error)
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

    def remove(self, block: Any) -> None:
        try:
            self._evictor.remove(block.block_id)
        except KeyError:
            raise RuntimeError(f"remove() called on a block that is not free: {block}") from None

    def append(self, block: Any) -> None:
        self.append_n([block])

    def append_n(self, blocks: Sequence[Any]) -> None:
        """Blocks with a hash whose last holder released them, the sequence's tail first."""
        if not blocks:
            return
        runtime = self.runtime
        freed = _freed(blocks, self._hash_of if self._reads_hashes else None)
        release = runtime.current_release()
        protected = type(release) is ProtectedRelease
        try:
            if protected:
                self._evictor.push_protected(freed, release)
            else:
                self._evictor.push_cached(freed, release)
        except Exception as error:
            runtime.stats.plugin_error("the LPC queue's append", error)
            self._append_as_lru(freed)
        try:  # for the eviction-age histogram
            ids = freed.block_ids
            self._released_s[np.fromiter(ids, np.intp, len(ids))] = release.time_s
        except Exception as error:
            runtime.stats.plugin_error("the LPC queue's release times", error)
        if protected:
            runtime.stats.add(
                cached_blocks_released=len(blocks), protected_blocks_released=len(blocks)
            )
        else:
            runtime.stats.add(cached_blocks_released=len(blocks))

    def _append_as_lru(self, freed: FreedBlocks) -> None:
        """After a failed append: queue the blocks the evictor does not hold yet with the
        fallback p at the current time and no conversation (LRU's place); if even that fails,
        before every cached block (their content is then lost first, but no block is)."""
        evictor = self._evictor
        keep = [i for i, block_id in enumerate(freed.block_ids) if block_id not in evictor]
        if not keep:
            return
        left = FreedBlocks(
            [freed.block_ids[i] for i in keep],
            [freed.depths[i] for i in keep],
            [freed.hashes[i] for i in keep],
        )
        try:
            evictor.push_cached(left, Release(self.runtime.clock(), None, None))
        except Exception as error:
            self.runtime.stats.plugin_error("the LPC queue's fallback append", error)
            evictor.push_uncached(left.block_ids)

    def prepend_n(self, blocks: Sequence[Any]) -> None:
        """Blocks without a hash: reused before any cached block, in the given order."""
        if not blocks:
            return
        self._evictor.push_uncached([block.block_id for block in blocks])
        self.runtime.stats.add(uncached_blocks_released=len(blocks))

    def get_all_free_blocks(self) -> list[Any]:
        self._apply_mode()
        blocks = self._blocks
        return [blocks[i] for i in self._evictor.free_block_ids()]

    def iter_blocks_after(self, cursor: Any | None) -> Iterator[Any]:
        """Free blocks in eviction order after `cursor` (all when None, none if it is not free).

        O(n log n) per call: the order is materialised from the heap. vLLM calls this only
        from the CPU-offloading connector's lazy mode.
        """
        self._apply_mode()
        order = self._evictor.free_block_ids()
        start = 0
        if cursor is not None:
            try:
                start = order.index(cursor.block_id) + 1
            except ValueError:
                return
        blocks = self._blocks
        for i in order[start:]:
            yield blocks[i]

    # -- what the plugin adds --------------------------------------------------------------
    def note_shared_release(self, blocks: Sequence[Any], release: Release) -> None:
        """Cached blocks this release gave up while other requests still hold them (pooling
        metadata only: on an error it is skipped, as stock vLLM has none)."""
        if blocks:
            try:
                if type(release) is ProtectedRelease:
                    self._evictor.note_protected_release(_freed(blocks, self._hash_of), release)
                else:
                    self._evictor.note_shared_release(_freed(blocks, self._hash_of), release)
            except Exception as error:
                self.runtime.stats.plugin_error("the LPC queue's shared release", error)
                return
            self.runtime.stats.add(shared_blocks_released=len(blocks))

    @property
    def evictor(self) -> LearnedEvictor:
        """The learned evictor (in lru and shadow mode too: it sees everything, evicts nothing)."""
        return self._learned


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


def bind_queue_class(runtime: QueueRuntime) -> type[LPCFreeBlockQueue]:
    """The queue class `BlockPool` will instantiate, bound to this process's runtime."""
    return type("LPCFreeKVCacheBlockQueue", (LPCFreeBlockQueue,), {"runtime": runtime})
