"""vLLM's free-block queue, ordered by LPC instead of LRU: an adapter over `LPCEvictor`.

`LPCFreeBlockQueue` offers `FreeKVCacheBlockQueue`'s methods on the same `KVCacheBlock`
objects but keeps no order of its own: it maps blocks to their ids and drives the learned
evictor, the one implementation of its ordering. What it cannot see, a release's probability,
time and conversation, comes from the release context the plugin sets (`QueueRuntime`). It
imports nothing from vLLM: blocks are duck-typed and vLLM's queue class is passed in.

The two structures and the mode: docs/design.md, "The kill switch"; releases, the evictor,
the fail-safe and the pinned cap: "The free queue (`lpc/integrations/vllm_queue.py`)".
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from itertools import repeat
from operator import attrgetter, is_not, itemgetter
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
from lpc.integrations.kill_switch import ModeSwitch
from lpc.integrations.late_predictions import MAX_WAITING, LatePredictions
from lpc.integrations.stats import PluginStats
from lpc.integrations.stock_queue import StockFreeBlockQueue
from lpc.integrations.vllm_compat import QUEUE_METHODS

Clock = Callable[[], float]
# The evictors the queue drives: both keep a preempted request's blocks last
# (`push_protected`), pool metadata across releases and scan in order (`RunHeap.iter_after`).
LearnedEvictor = LPCEvictor | ReturnWindowEvictor


@dataclass(frozen=True, slots=True)
class ProtectedRelease(Release):
    """The release of a request that is not finished (preempted): its blocks are queued after
    every free block (`LPCEvictor.push_protected`), since it asks for them again as soon as it
    is rescheduled; its probability is not used."""


@dataclass(frozen=True, slots=True)
class TenantRelease(Release):
    """A finished request's release with the request's tenant (`trust.tenant_of`), and
    whether its p is a trusted hint from the request (`hinted`; `trust`): the plugin, which
    reads the request, makes it, so the queue needs no other state to cap a tenant's pinned
    share (`pinned_share`)."""

    tenant: str = ""
    hinted: bool = False
    # The request whose prediction is still on its way (`late_predictions`): its blocks are
    # queued at the fallback p and re-keyed when it comes. None: nothing to wait for.
    awaiting: str | None = None


# A pop of at most this many blocks reads their release times for the eviction-age histogram
# one by one (`_observe_few_eviction_ages`), and leaves its tenants' pinned counts one by one
# (`_unpin`); a larger one in numpy. Speed only: the same observations and counts either way.
SMALL_POP = 64
# A pop of more cached blocks than this observes the release times of this many of them, every
# k-th block, each standing for the k blocks from it (the last for the rest): the histogram's
# count stays exact, and an age's count is off by less than k per run of equal release times.
# The histogram is a metric; reading every block of a 128K-token pop cost about 145 µs.
SAMPLED_AGES = 256

# Tenants one queue counts apart for the pinned cap: the first 4096 it sees; every later one
# shares one count (so they are capped together), and the table stays bounded.
MAX_PINNING_TENANTS = 4096


class Releasing:
    """`QueueRuntime.releasing`'s context: a class, at a third of a generator's cost (every
    free enters one)."""

    __slots__ = ("_release", "_token", "_variable")

    def __init__(self, variable: ContextVar[Release | None], release: Release) -> None:
        self._variable = variable
        self._release = release

    def __enter__(self) -> None:
        self._token = self._variable.set(self._release)

    def __exit__(self, *exc_info: object) -> None:
        self._variable.reset(self._token)


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
    # Learned when the first queue is built (`engine_context`): from its block pool, and the
    # config of the scheduler being built (set by the plugin's scheduler hook).
    engine: EngineContext = field(default_factory=EngineContext)
    vllm_config: Any = None
    # The latest queue's (its trust gate, or lpc-return's window, is exported).
    evictor: LearnedEvictor | None = None
    # lpc, lru or shadow; the queues follow a change at once (`kill_switch`).
    mode: ModeSwitch = field(default_factory=ModeSwitch)
    # Predictions that came after their release, for every queue to re-key.
    late: LatePredictions = field(default_factory=LatePredictions)
    _release: ContextVar[Release | None] = field(
        default_factory=lambda: ContextVar("lpc_release", default=None)
    )
    _active: bool = False

    def queue_built(self, pool: Any = None) -> None:
        """The first queue of the process is built (in `pool`, when its blocks know it)."""
        if not self._active:
            self._active = True
            try:
                self.engine = engine_context(pool, self.vllm_config)
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

    def releasing(self, release: Release) -> Releasing:
        """Blocks freed inside this block carry `release`'s probability, time and conversation."""
        return Releasing(self._release, release)

    @property
    def evictor_horizon_s(self) -> float | None:
        """The horizon `lpc-pooled` runs with: the model's, else the default (None: `lpc`)."""
        if self.config.evictor != "lpc-pooled":
            return None
        return self.horizon_s if self.horizon_s is not None else DEFAULT_SHARED_HORIZON_S

    def new_evictor(self, num_blocks: int) -> LearnedEvictor:
        """The configured learned evictor: `lpc` or `lpc-pooled` (LPC evictors; the pooled
        one judges over the loaded model's horizon, remembers contents at least that long,
        and keeps that memory as `pooled_memory` says), or `lpc-return` with its own
        constants, as the replay runs it (W = 4 × its measured turnover, re-keyed every 5 s,
        fallback score 0.5: `eviction/return_window.py`); its curves come with the releases."""
        c = self.config
        if c.evictor == ReturnWindowEvictor.name:
            evictor: LearnedEvictor = ReturnWindowEvictor(num_blocks)
            self.evictor = evictor
            return evictor
        options = {}
        horizon_s = self.evictor_horizon_s
        if horizon_s is not None:  # lpc-pooled
            options = {
                "horizon_s": horizon_s,
                "memory_window_s": max(DEFAULT_MEMORY_WINDOW_S, horizon_s),
                "memory": c.pooled_memory,
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


# What the queue does with a call, by mode (`follow`): evict by the learned order; drain the
# learned blocks after a switch off; or pass every call through to vLLM's own queue.
LPC, DRAINING, THROUGH = "lpc", "draining", "through"


class LPCFreeBlockQueue:
    """A drop-in for vLLM 0.33's `FreeKVCacheBlockQueue` that evicts by LPC.

    vLLM builds it as `FreeKVCacheBlockQueue(blocks)` with only the block list, so the
    shared `QueueRuntime` is a class attribute of the subclass `bind_queue_class` makes at
    registration, and so is `stock`, vLLM's own queue class. Block ids must be the blocks'
    positions in the list (vLLM's invariant).

    Two structures hold the free blocks: `_list`, an instance of vLLM's own queue (its list
    and its count), and the learned evictor; `num_free_blocks` is their sum. In `lpc` mode
    cached releases go to the learned evictor, blocks without a hash to the list's front (as
    vLLM puts them), and pops take the list first (its hash-less blocks, then any cached ones
    left from an off mode, in their LRU order), then the learned order. At start every block
    is in the list (uncached, in id order), as in vLLM. Off (`lru`, `shadow`) the learned
    blocks drain first (`DRAINING`), then every call goes to `_list` (`THROUGH`), and in `lru`
    the pool itself is handed `_list` (`_hand_over`): vLLM's own object, its own methods, no
    plugin code on any call (`vllm_plugin`'s hooks act only on pools whose queue is an
    `LPCFreeBlockQueue`). Switching on hands the pool this queue again.
    """

    runtime: ClassVar[QueueRuntime]
    # The engine's FreeKVCacheBlockQueue (`bind_queue_class`); the transcription without vLLM.
    stock: ClassVar[type] = StockFreeBlockQueue

    def __init__(self, blocks: list[Any]) -> None:
        for index, block in enumerate(blocks):
            if block.block_id != index:
                raise ValueError(
                    f"block at position {index} has id {block.block_id}; the LPC queue needs "
                    "block ids equal to their positions in the pool"
                )
        self._list = self.stock(blocks)  # every block free, in vLLM's list, in id order
        # The pool that will hold this queue (vLLM 0.33's blocks know it): off in `lru`, it
        # is handed `_list` itself. None (blocks without one): calls pass through instead.
        self._pool = getattr(blocks[0], "pool", None) if blocks else None
        self._blocks = list(blocks)
        # Each block's last release time (the queue's clock): its age when evicted. A numpy
        # array, so that a release writes its chain's times, and a pop reads them, in C.
        self._released_s = np.zeros(len(blocks))
        self._learned = self.runtime.new_evictor(len(blocks))
        # The pinned cap: per block the tenant index whose trusted hint pinned it while the
        # learned evictor holds it (0: not pinned), per tenant index its pinned blocks; the
        # last index is every tenant past MAX_PINNING_TENANTS (2 bytes a block hold them all).
        self._pins = type(self._learned) is not ReturnWindowEvictor  # lpc-return keys no p
        self._pin_cap = self.runtime.config.pinned_share * len(blocks)
        self._pinned_by = np.zeros(len(blocks), np.uint16)
        self._pinned = np.zeros(MAX_PINNING_TENANTS + 2, np.int64)
        # A hit reads and writes one block's pin through memoryviews of the same buffers: a
        # Python int at about a list's cost, where a numpy scalar costs several times that.
        self._pinned_by_of = memoryview(self._pinned_by)
        self._pinned_of = memoryview(self._pinned)
        self._pinned_total = 0
        self._tenants: dict[str, int] = {}
        self._capped: tuple[Release, Release] | None = None  # the last capped release
        self._lone_tenant: str | None = None  # the only tenant that released here so far
        self._shared_pool = False  # a second tenant released here: the cap binds
        # How a release reads its blocks' hashes: vLLM's `block_hash` is a property over the
        # slot `_block_hash`; reading the slot in C halves the pass. Plain LPC never reads a
        # hash (only the pooled memory and lpc-return do): its releases skip the pass.
        self._hash_of = _hash_getter(blocks)
        self._reads_hashes = type(self._learned) is not LPCEvictor
        # Late predictions: this queue's inbox, and its releases still waiting for one (by
        # request id: the release's own runs and the release), at most MAX_WAITING.
        self._late_inbox = self.runtime.late.inbox()
        self._awaiting: dict[str, tuple[list[Any], Release]] = {}
        self._rekeys = isinstance(self._learned, LPCEvictor)  # lpc-return keys no p
        self._learned.reset([])
        # How many blocks the learned evictor holds, kept by every call that changes it (all
        # on the scheduler thread): the pops read it rather than the evictor's `__len__`.
        self._held = 0
        # Every free block, the list's and the learned evictor's, as a plain attribute: vLLM
        # reads it several times a step and once per allocation, where a property cost a
        # frame each. Only the scheduler thread writes it: each call that changes a count
        # (while the pool holds this queue), and `_rejoin`, which takes the pool back from
        # vLLM's list after a switch on (docs/design.md, "The kill switch").
        self.num_free_blocks = self._list.num_free_blocks
        self._list._lpc_queue = self  # a rejoining list's calls find this queue (`_rejoin`)
        self._rejoining = rejoining_class(self.stock)  # built now, not by the switch
        self._phase = LPC
        self._tripped = False
        self.runtime.queue_built(self._pool)
        self.runtime.mode.attach(self)

    # -- the mode ----------------------------------------------------------------------------
    def follow(self, mode: str) -> None:
        """Take `mode` on: called under the mode switch's lock, from any thread. O(1): a
        phase and at most the pool's queue attribute (or the list's class) change, no block
        is touched. Both objects the pool may hold share one list and its count (`_list`), so
        a call that reaches either one, before or after the change, finds the same free
        blocks. While the pool holds vLLM's list (`lru`, drained), this queue's count is not
        kept: a mode that needs this queue back makes the list rejoin it at the pool's next
        call, on the scheduler thread, which counts first (`_rejoin`). A rejoin still pending
        when the mode goes back to `lru` stays so: that call hands the pool a fresh list."""
        listed = self._list
        if getattr(self._pool, "free_block_queue", None) is listed:
            if (mode == "lpc" and not self._tripped) or mode == "shadow":
                listed.__class__ = self._rejoining
            return
        self._take_mode(mode)

    def _take_mode(self, mode: str) -> None:
        """`follow`'s change while the pool holds this queue (or no pool holds either)."""
        if mode == "lpc" and not self._tripped:
            self._phase = LPC
            self._install(self)
            return
        if self._phase != THROUGH:  # the learned evictor may hold blocks: the pops drain them
            self._phase = DRAINING
        if mode == "shadow" or self._phase != THROUGH:  # shadow needs the plugin's hooks
            self._install(self)
        else:
            self._install(self._list)

    def _rejoin(self) -> Any:
        """The pool's first call on a rejoining list (`rejoining_class`), on the scheduler
        thread: the list's state moves to a fresh object of vLLM's class, which the pool
        holds; this queue counts, and takes the mode on (the pool holds this queue again, or
        keeps the fresh list in `lru`); returns what the pool holds, which takes the call.
        A fresh object, since an instance whose class was assigned stays on CPython 3.11's
        slow attribute path for good (vLLM's own calls on it cost up to twice as much)."""
        switch = self.runtime.mode
        with switch.lock:
            stock = self.stock
            fresh = stock.__new__(stock)
            for name, value in vars(self._list).items():  # vLLM's order: the fast layout
                setattr(fresh, name, value)
            self._list = fresh
            self._pool.free_block_queue = fresh
            self.num_free_blocks = fresh.num_free_blocks + self._held
            self._take_mode(switch.mode)
        return self._pool.free_block_queue

    def _install(self, queue: Any) -> None:
        """Hand the pool `queue` (this queue, or vLLM's `_list`) if it holds the other."""
        pool = self._pool
        if pool is not None and getattr(pool, "free_block_queue", None) in (self, self._list):
            pool.free_block_queue = queue

    def settle(self) -> None:
        """Before the pool's first call, on the thread that makes them: in an off mode with
        nothing learned, pass every call to vLLM's queue (and in `lru` hand the pool that
        queue) at once, as the first pop would (a pool that takes its null block by a pop does
        so; one given this queue after vLLM's constructor does not pop)."""
        self._drained()

    def _drained(self) -> None:
        """The learned evictor is empty while draining: from now on every call goes to vLLM's
        queue, which in `lru` the pool holds itself (on the scheduler thread, under the
        switch's lock so that a switch is not lost)."""
        switch = self.runtime.mode
        with switch.lock:
            if self._phase == DRAINING and not len(self._learned):
                self._phase = THROUGH
                self.follow(switch.mode)

    # -- the learned evictor, fail-safe ----------------------------------------------------
    def _take_learned(self, n: int) -> list[Any]:
        """Pop `n` blocks from the learned evictor (the caller checked it holds them)."""
        runtime = self.runtime
        if self._late_inbox:
            self._rekey_late()
        try:
            ids = self._learned.pop_n(n, runtime.clock())
        except Exception as error:
            self._trip("the LPC queue's pop", error)
            return self._list.popleft_n(n)
        self._held -= len(ids)
        if self._pinned_total:
            self._unpin(ids)
        popped = list(itemgetter(*ids)(self._blocks)) if n > 1 else [self._blocks[ids[0]]]
        if self._phase != LPC:
            # Off, the drain counts no eviction and observes no age, as vLLM's own queue
            # counts none once drained; it spares the drain a read of every block's hash.
            return popped
        hashes = list(map(self._hash_of, popped))
        # vLLM's hashes are non-empty bytes: `all` (a truth test per block) vouches that none
        # is None at a third of `count(None)`'s cost (a comparison per block); else count.
        evicted = n if all(hashes) else n - hashes.count(None)
        if evicted:
            runtime.stats.add(evictions=evicted)
            try:  # metrics only: the blocks are already vLLM's
                cached = None if evicted == n else list(map(is_not, hashes, repeat(None)))
                self._observe_eviction_ages(ids, cached)
            except Exception as error:
                runtime.stats.plugin_error("the eviction-age histogram", error)
        return popped

    # -- late predictions --------------------------------------------------------------------
    def _await(self, release: TenantRelease, freed: FreedBlocks) -> None:
        """Keep a release queued at the fallback p until its prediction comes: its own runs
        (`LPCEvictor.own_runs`), under its request id (the oldest forgotten past the bound)."""
        awaiting = self._awaiting
        runs = self._learned.own_runs(freed)
        kept = awaiting.get(release.awaiting)
        if kept is not None and kept[1] is release:  # the same release, freed in parts
            runs = kept[0] + runs
        awaiting[release.awaiting] = (runs, release)
        if len(awaiting) > MAX_WAITING:
            del awaiting[next(iter(awaiting))]

    def _rekey_late(self) -> None:
        """Re-key the releases whose predictions came since the last pop: one heap push per
        run still queued (`LPCEvictor.rekey_late`). An error costs those releases their
        prediction, never the pop."""
        inbox, awaiting = self._late_inbox, self._awaiting
        used = rekeyed = 0
        try:
            while inbox:
                request_id, probability = inbox.popleft()
                kept = awaiting.pop(request_id, None)
                if kept is None:
                    continue
                runs, release = kept
                rekeyed += self._learned.rekey_late(runs, replace(release, probability=probability))
                used += 1
        except Exception as error:
            self.runtime.stats.plugin_error("re-keying a release by its late prediction", error)
        if used:
            self.runtime.stats.add(late_predictions_used=used, late_runs_rekeyed=rekeyed)

    # -- the pinned cap ---------------------------------------------------------------------
    def _tenant_index(self, tenant: str) -> int:
        tenants = self._tenants
        index = tenants.get(tenant)
        if index is None:
            if len(tenants) >= MAX_PINNING_TENANTS:
                return MAX_PINNING_TENANTS + 1
            index = tenants[tenant] = len(tenants) + 1
        return index

    def _note_tenant(self, tenant: str) -> None:
        """A tenant released into this queue: the second one shares the pool with the first,
        and from then on the cap binds."""
        if self._lone_tenant is None:
            self._lone_tenant = tenant
        elif tenant != self._lone_tenant:
            self._shared_pool = True

    def _pin(self, release: TenantRelease, n: int, shared: bool = False) -> tuple[Release, int]:
        """The release as the evictor is to key it, and the tenant index its `n` blocks count
        against (0: not pinned). A trusted hint above the fallback p pins, unless the pool is
        shared and the blocks would take the tenant's pinned blocks past the cap: then the
        fallback p (LRU's place), counted once per release. `shared`: blocks others still hold
        (pooling metadata, not counted): the same test, and a release capped on its freed
        blocks stays capped."""
        capped = self._capped
        if capped is not None and capped[0] is release:
            return capped[1], 0
        p = release.probability
        if not release.hinted or p is None or not p > self.runtime.config.fallback_probability:
            return release, 0
        index = self._tenant_index(release.tenant)
        if not self._shared_pool or self._pinned[index] + n <= self._pin_cap:
            return release, 0 if shared else index
        keyed = replace(release, probability=None)
        self._capped = (release, keyed)
        self.runtime.stats.add(pinned_share_capped=1)
        return keyed, 0

    def _unpin(self, ids: Sequence[int]) -> None:
        """Blocks that left the learned evictor leave their tenants' pinned counts. On an
        error every count is dropped (the cap counts afresh; the blocks are vLLM's). A small
        pop (`SMALL_POP`, the common one) block by block through the memoryviews, as a hit
        does; numpy's calls cost more than that loop there."""
        try:
            if len(ids) <= SMALL_POP:
                pinned_by, pinned = self._pinned_by_of, self._pinned_of
                unpinned = 0
                for block_id in ids:
                    owner = pinned_by[block_id]
                    if owner:
                        pinned[owner] -= 1
                        pinned_by[block_id] = 0
                        unpinned += 1
                self._pinned_total -= unpinned
                return
            index = np.fromiter(ids, np.intp, len(ids))
            owners = self._pinned_by[index]
            owners = owners[owners != 0]
            if len(owners):
                self._pinned -= np.bincount(owners, minlength=len(self._pinned))
                self._pinned_by[index] = 0
                self._pinned_total -= len(owners)
        except Exception as error:
            self.runtime.stats.plugin_error("the LPC queue's pinned counts", error)
            self._clear_pins()

    def _clear_pins(self) -> None:
        """No block pinned: the learned evictor was emptied (tripped)."""
        self._pinned_by[:] = 0
        self._pinned[:] = 0
        self._pinned_total = 0

    def pinned_counts(self) -> dict[str, int]:
        """Each tenant's pinned blocks now (tenants past the table's bound under "*")."""
        counts = {tenant: int(self._pinned[i]) for tenant, i in self._tenants.items()}
        overflow = int(self._pinned[MAX_PINNING_TENANTS + 1])
        if overflow:
            counts["*"] = overflow
        return {tenant: count for tenant, count in counts.items() if count}

    def _observe_eviction_ages(self, ids: list[int], cached: list[bool] | None) -> None:
        """Eviction ages of the cached blocks among those popped (`ids`; `cached[i]` says
        whether block i held a hash, None: all did): one observation per run of consecutive
        blocks released together (equal release times), not one per block."""
        if len(ids) <= SMALL_POP:
            self._observe_few_eviction_ages(ids, cached)
        else:
            self._observe_many_eviction_ages(ids, cached)

    def _observe_many_eviction_ages(self, ids: list[int], cached: list[bool] | None) -> None:
        """`_observe_eviction_ages` in numpy: one release's blocks take two reductions. Over
        `SAMPLED_AGES` blocks, all cached, every k-th block stands for k."""
        runtime = self.runtime
        n = len(ids)
        stride = -(-n // SAMPLED_AGES) if cached is None and n > SAMPLED_AGES else 1
        if stride > 1:
            ids = ids[::stride]
        times = self._released_s[np.fromiter(ids, np.intp, len(ids))]
        if cached is not None:
            times = times[np.fromiter(cached, bool, len(cached))]
            n = len(times)
        first = float(times[0])
        if first == times.min() == times.max():
            runtime.histograms.eviction_age_s.observe_n(runtime.clock() - first, n)
            return
        starts = np.flatnonzero(np.diff(times)) + 1
        counts = np.diff(np.concatenate(([0], starts, [len(times)]))) * stride
        counts[-1] -= len(times) * stride - n  # the last sample stands for the rest
        ages = runtime.clock() - times[np.concatenate(([0], starts))]
        observe = runtime.histograms.eviction_age_s.observe_n
        for age, count in zip(ages.tolist(), counts.tolist(), strict=True):
            observe(age, count)

    def _observe_few_eviction_ages(self, ids: list[int], cached: list[bool] | None) -> None:
        """`_observe_eviction_ages` of a small pop (the common one): the same observations,
        read one block at a time, which costs less there than numpy's calls."""
        runtime = self.runtime
        item = self._released_s.item
        if cached is None:
            times = list(map(item, ids))
        else:
            times = [item(block_id) for block_id, held in zip(ids, cached, strict=True) if held]
        now = runtime.clock()
        observe = runtime.histograms.eviction_age_s.observe_n
        start, first = 0, times[0]
        for k, time_s in enumerate(times):
            if time_s != first:
                observe(now - first, k - start)
                start, first = k, time_s
        observe(now - first, len(times) - start)

    def _trip(self, where: str, error: Exception) -> None:
        """The learned evictor failed where vLLM cannot take an error: hand every block it
        holds to vLLM's list (its tail) and pass every call to vLLM's queue from now on,
        whatever the mode says (counted in `plugin_errors`, logged). O(blocks), once."""
        runtime = self.runtime
        runtime.stats.plugin_error(f"{where} (this queue runs stock vLLM from now on)", error)
        try:
            held = self._learned.free_block_ids()
        except Exception:  # the evictor cannot say: the free blocks no list links
            held = [
                block.block_id
                for block in self._blocks
                if block.prev_free_block is None
                and getattr(block, "ref_cnt", 1) == 0
                and not getattr(block, "is_null", False)
            ]
        blocks = self._blocks
        self._list.append_n([blocks[i] for i in held if blocks[i].prev_free_block is None])
        try:
            self._learned.reset([])
        except Exception as reset_error:
            runtime.stats.plugin_error("resetting the failed learned evictor", reset_error)
        self._held = 0  # every call goes to vLLM's list from now on
        self.num_free_blocks = self._list.num_free_blocks
        self._clear_pins()
        self._awaiting.clear()
        switch = runtime.mode
        with switch.lock:
            self._tripped = True
            self._phase = THROUGH
            self.follow(switch.mode)

    # -- what BlockPool calls ------------------------------------------------------------
    # Each call that frees or takes blocks counts `num_free_blocks` afresh from both
    # structures once it has changed them (`self._list`: a call of this queue's that reached
    # a rejoining list, after a switch on another thread, was served by what the pool holds
    # then, and the list is a fresh object since, `_rejoin`): right after every call.
    def popleft(self) -> Any:
        listed = self._list
        phase = self._phase
        if phase == LPC:
            if listed.num_free_blocks:
                block = listed.popleft()
            elif not self._held:
                raise ValueError("No free blocks available")
            else:
                block = self._take_learned(1)[0]
            self.num_free_blocks = self._list.num_free_blocks + self._held
            return block
        if phase == THROUGH:
            block = listed.popleft()
            self.num_free_blocks = self._list.num_free_blocks + self._held
            return block
        return self.popleft_n(1)[0]

    def popleft_n(self, n: int) -> list[Any]:
        if n == 0:
            return []
        listed = self._list
        phase = self._phase
        if phase == THROUGH:
            out = listed.popleft_n(n)
            self.num_free_blocks = self._list.num_free_blocks + self._held
            return out
        in_list = listed.num_free_blocks
        held = self._held
        if n > in_list + held:
            raise ValueError(f"cannot pop {n} blocks: only {in_list + held} are free")
        if phase == LPC:
            if n <= in_list:
                out = listed.popleft_n(n)
            else:
                out = listed.popleft_n(in_list) if in_list else []
                out += self._take_learned(n - in_list)
            self.num_free_blocks = self._list.num_free_blocks + self._held
            return out
        # Draining: the list's leading hash-less blocks (vLLM reuses those first), the learned
        # blocks (all released before every cached block in the list: LRU's order across the
        # boundary; among them the learned order), then the list.
        # Counted first, then popped by vLLM's own `popleft_n`: a pop per block cost 4× that.
        hash_of, tail = self._hash_of, listed.fake_free_list_tail
        block = listed.fake_free_list_head.next_free_block
        lead = 0
        while lead < n and block is not tail and hash_of(block) is None:
            lead += 1
            block = block.next_free_block
        out = listed.popleft_n(lead)
        if len(out) < n and held:
            out += self._take_learned(min(n - len(out), held))
        if not self._held:
            self._drained()
        if len(out) < n:
            out += listed.popleft_n(n - len(out))
        self.num_free_blocks = self._list.num_free_blocks + self._held
        return out

    def remove(self, block: Any) -> None:
        """A hit on a free block: out of whichever structure holds it."""
        if block.prev_free_block is not None:
            self._list.remove(block)
            self.num_free_blocks = self._list.num_free_blocks + self._held
            return
        block_id = block.block_id
        try:
            self._learned.remove(block_id)
        except KeyError:
            raise RuntimeError(f"remove() called on a block that is not free: {block}") from None
        except Exception as error:
            self._trip("the LPC queue's remove", error)
            if block.prev_free_block is not None:  # salvaged into the list: take it out
                self._list.remove(block)
                self.num_free_blocks = self._list.num_free_blocks + self._held
            return
        self._held -= 1
        self.num_free_blocks = self._list.num_free_blocks + self._held
        if self._pinned_total:  # `_unpin` of the one block, inlined: a hit is vLLM's touch
            try:
                pinned_by = self._pinned_by_of
                owner = pinned_by[block_id]
                if owner:
                    self._pinned_of[owner] -= 1
                    pinned_by[block_id] = 0
                    self._pinned_total -= 1
            except Exception as error:
                self.runtime.stats.plugin_error("the LPC queue's pinned counts", error)
                self._clear_pins()

    def append(self, block: Any) -> None:
        if self._phase == LPC:
            self.append_n([block])
        else:
            self._list.append(block)
            self.num_free_blocks = self._list.num_free_blocks + self._held

    def append_n(self, blocks: Sequence[Any]) -> None:
        """Blocks with a hash whose last holder released them, the sequence's tail first."""
        if not blocks:
            return
        if self._phase != LPC:
            self._list.append_n(blocks)
            self.num_free_blocks = self._list.num_free_blocks + self._held
            return
        runtime = self.runtime
        release = runtime.current_release()
        protected = type(release) is ProtectedRelease
        pin = 0  # the tenant index the blocks count against (`_pin`)
        freed = None
        try:
            if type(release) is TenantRelease and self._pins:
                if not self._shared_pool:
                    self._note_tenant(release.tenant)
                release, pin = self._pin(release, len(blocks))
            freed = _freed(blocks, self._hash_of if self._reads_hashes else None, index=True)
            if protected:
                self._learned.push_protected(freed, release)
            else:
                self._learned.push_cached(freed, release)
                if self._rekeys and type(release) is TenantRelease and release.awaiting:
                    self._await(release, freed)
        except Exception as error:
            runtime.stats.plugin_error("the LPC queue's append", error)
            pin = 0  # queued at the fallback p (`_append_as_lru`): not pinned
            self._append_as_lru(blocks)
            if self._tripped:  # in vLLM's list, counted afresh (`_append_as_lru`)
                return
        self._held = len(self._learned)
        self.num_free_blocks = self._list.num_free_blocks + self._held
        try:  # for the eviction-age histogram, and the pinned counts
            if freed is not None:
                index = freed.index
            else:
                index = np.fromiter(map(_block_id, blocks), np.intp, len(blocks))
            self._released_s[index] = release.time_s
            if pin:
                self._pinned_by[index] = pin
                self._pinned[pin] += len(index)
                self._pinned_total += len(index)
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
            return
        except Exception as error:
            self._trip("the LPC queue's fallback append", error)
        self._list.append_n([block for block in blocks if block.prev_free_block is None])
        self.num_free_blocks = self._list.num_free_blocks + self._held  # tripped: held is 0

    def prepend_n(self, blocks: Sequence[Any]) -> None:
        """Blocks without a hash: reused before any cached block, at the list's front, as
        vLLM puts them."""
        if not blocks:
            return
        self._list.prepend_n(blocks)
        self.num_free_blocks = self._list.num_free_blocks + self._held
        if self._phase == LPC:
            self.runtime.stats.add(uncached_blocks_released=len(blocks))

    def get_all_free_blocks(self) -> list[Any]:
        """Every free block in eviction order, exactly (O(n log n): vLLM uses it in tests)."""
        listed = self._list.get_all_free_blocks()
        blocks = self._blocks
        learned = [blocks[i] for i in self._learned.free_block_ids()]
        if self._phase == LPC:
            return listed + learned
        k = 0
        while k < len(listed) and listed[k].block_hash is None:
            k += 1
        return listed[:k] + learned + listed[k:]

    def iter_blocks_after(self, cursor: Any | None) -> Iterator[Any]:
        """Free blocks in eviction order after `cursor` (all when None, none if it is not
        free): in lpc mode the list's, then the learned evictor's scan order
        (`RunHeap.iter_after`): O(log runs) to start, one Python step per block. vLLM's lazy
        CPU offload walks it every step."""
        listed = self._list
        if self._phase == THROUGH:
            return listed.iter_blocks_after(cursor)
        if self._phase == DRAINING:
            return self._iter_draining(cursor)
        return self._iter_lpc(cursor)

    def _iter_lpc(self, cursor: Any | None) -> Iterator[Any]:
        if cursor is None or cursor.prev_free_block is not None:
            yield from self._list.iter_blocks_after(cursor)
            after = None
        elif self._holds(cursor):
            after = cursor.block_id
        else:
            return
        try:  # one generator frame per block, as vLLM's own walk
            yield from map(self._blocks.__getitem__, self._learned.iter_after(after))
        except Exception as error:
            self.runtime.stats.plugin_error("the LPC queue's scan for the CPU offload", error)

    def _iter_draining(self, cursor: Any | None) -> Iterator[Any]:
        """In pop order: the list's leading hash-less blocks, the learned ones, the rest."""
        listed = self._list
        tail = listed.fake_free_list_tail
        prefix = []
        node = listed.fake_free_list_head.next_free_block
        while node is not tail and node.block_hash is None:
            prefix.append(node)
            node = node.next_free_block
        rest_from = node  # the first list block after the hash-less prefix
        if cursor is None:
            yield from prefix
            after = None
        elif cursor.prev_free_block is not None:
            at = next((i for i, block in enumerate(prefix) if block is cursor), None)
            if at is None:
                yield from listed.iter_blocks_after(cursor)
                return
            yield from prefix[at + 1 :]
            after = None
        elif self._holds(cursor):
            after = cursor.block_id
        else:
            return
        try:
            yield from map(self._blocks.__getitem__, self._learned.iter_after(after))
        except Exception as error:
            self.runtime.stats.plugin_error("the LPC queue's scan for the CPU offload", error)
        if rest_from is not tail:
            yield rest_from
            yield from listed.iter_blocks_after(rest_from)

    def _holds(self, block: Any) -> bool:
        try:
            return block.block_id in self._learned
        except Exception as error:
            self.runtime.stats.plugin_error("the LPC queue's membership test", error)
            return False

    # -- what the plugin adds --------------------------------------------------------------
    def note_shared_release(self, blocks: Sequence[Any], release: Release) -> None:
        """Cached blocks this release gave up while other requests still hold them (pooling
        metadata only: on an error it is skipped, as stock vLLM has none; off, none is kept)."""
        if blocks and self._phase == LPC:
            try:
                if type(release) is TenantRelease and self._pins:
                    release = self._pin(release, len(blocks), shared=True)[0]
                if type(release) is ProtectedRelease:
                    self._learned.note_protected_release(_freed(blocks, self._hash_of), release)
                else:
                    self._learned.note_shared_release(_freed(blocks, self._hash_of), release)
            except Exception as error:
                self.runtime.stats.plugin_error("the LPC queue's shared release", error)
                return
            self.runtime.stats.add(shared_blocks_released=len(blocks))

    @property
    def phase(self) -> str:
        """lpc, draining (off, learned blocks left) or through (off: vLLM's queue)."""
        return self._phase

    @property
    def evictor(self) -> LearnedEvictor:
        """The learned evictor (empty once an off mode drained it)."""
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


def _freed(
    blocks: Sequence[Any], hash_of: Callable[[Any], Any] | None, index: bool = False
) -> FreedBlocks:
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
    ids = list(map(_block_id, blocks))
    return FreedBlocks(
        ids,
        depths,
        [None] * n if hash_of is None else list(map(hash_of, blocks)),
        chain=True,
        # The release's: the heap's positions and the release times; pooling notes need none.
        index=np.fromiter(ids, np.intp, n) if index else None,
    )


@functools.cache
def rejoining_class(stock: type) -> type:
    """`stock` (vLLM's queue class) whose first pool call has the LPC queue take the pool
    back (`LPCFreeBlockQueue._rejoin`, on the scheduler thread), then goes to whatever the
    pool holds. A switch on sets it as the class of the list the pool holds in `lru`; its
    count is the list's own attribute, right until then."""

    def forward(name: str) -> Callable[..., Any]:
        def call(self: Any, *args: Any) -> Any:
            queue = self._lpc_queue
            # Once rejoined, this object is stale: a call still made on it goes to the pool's.
            target = queue._rejoin() if queue._list is self else queue._pool.free_block_queue
            return getattr(target, name)(*args)

        call.__name__ = call.__qualname__ = name
        return call

    # What vLLM's pool and offloading call on the queue (`vllm_compat`): each of these rejoins.
    calls = {name: forward(name) for name in QUEUE_METHODS}
    return type(f"Rejoining{stock.__name__}", (stock,), calls)


def bind_queue_class(runtime: QueueRuntime, stock: type | None = None) -> type[LPCFreeBlockQueue]:
    """The queue class `BlockPool` will instantiate, bound to this process's runtime, over
    `stock`: the engine's own `FreeKVCacheBlockQueue` (its instance holds the list, and is
    what the pool holds while the kill switch is off; None: `stock_queue.StockFreeBlockQueue`,
    the transcription, where vLLM is absent)."""
    stock = StockFreeBlockQueue if stock is None else stock
    return type(
        "LPCFreeKVCacheBlockQueue", (LPCFreeBlockQueue,), {"runtime": runtime, "stock": stock}
    )
