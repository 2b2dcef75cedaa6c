"""One scheduler's LPC: what the LPC scheduler class (`vllm_scheduler_class`) does at vLLM's
frees, drains and first schedulings, on vLLM's objects by duck typing.

Apart from the class so that it imports nothing of vLLM: replays, benchmarks and tests drive a
vLLM `KVCacheManager` (or a stand-in of one) through it without a scheduler (`ManagerLPC`,
`attach_manager`), and the stand-in engines of the default test suite run without vLLM.
Design: docs/design.md, "Through vLLM's `--scheduler-cls`".
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from time import perf_counter_ns
from types import SimpleNamespace
from typing import Any

from lpc.integrations import vllm_plugin
from lpc.integrations.kill_switch import ModeSwitch
from lpc.integrations.vllm_plugin import PluginRuntime
from lpc.integrations.vllm_seam_queue import LPCSeamQueue


class _NoShadow:
    """A runtime without a shadow feed: never feeding one."""

    active = False


_NO_SHADOW = _NoShadow()


class LPCSchedulerQueue(LPCSeamQueue):
    """The seam's queue, built by the scheduler class with its runtime (a free deferred by
    vLLM reaches it through `SchedulerLPC.drain`, with the release held for its blocks)."""


class _FirstScheduling:
    """A request as the shadow caches admit it on its first scheduling: nothing computed yet
    (vLLM sets its computed tokens after the allocation)."""

    __slots__ = ("_request",)
    num_computed_tokens = 0

    def __init__(self, request: Any) -> None:
        self._request = request

    def __getattr__(self, name: str) -> Any:
        return getattr(self._request, name)


@dataclass
class SchedulerLPC:
    """One scheduler's LPC: the runtime, and the queue its block pool was given."""

    plugin: PluginRuntime
    queue: LPCSchedulerQueue
    pool: Any
    # Inside `update_from_output` or `finish_requests` with an in-process model (`holding`):
    # the finished requests whose frees wait for the call's one scoring pass (`flush`).
    holding: bool = False
    held: list[Any] = field(default_factory=list)
    # Whether a model runs in process (the runtime's, fixed at start-up): then a step's frees
    # are held for one scoring call; without, they go at once.
    in_process: bool = field(init=False)
    # The runtime's shadow feed (a stand-in that is never active when it has none) and mode
    # switch, read at every step (`shadowing`).
    shadow: Any = field(init=False)
    switch: ModeSwitch = field(init=False)

    def __post_init__(self) -> None:
        plugin = self.plugin
        self.in_process = plugin.access is not None
        self.shadow = plugin.shadow if plugin.shadow is not None else _NO_SHADOW
        self.switch = plugin.queues.mode

    def hold(self, request: Any) -> bool:
        """Keep a finished request's free for the step's end (True), when the step is
        holding and LPC is on; False: free it now."""
        if (
            not self.holding
            or self.queue.runtime.mode.mode == "lru"
            or vllm_plugin.is_unfinished(request)  # preempted: a protected release, now
        ):
            return False
        self.held.append(request)
        return True

    def flush(self, scheduler: Any, free: Callable[[Any], None]) -> None:
        """The step's end: the held requests scored in one call (`score_finished`), then
        freed in the order vLLM finished them, each as `free` frees it. Before the next
        `schedule`, so no allocation sees the pool without their blocks."""
        held, self.held = self.held, []
        plugin = self.plugin
        plugin.score_finished(held)  # never raises
        try:
            for request in held:
                self.free(scheduler, request, free)
        finally:  # a release that did not take its outcome (switched off meanwhile)
            plugin.scored.clear()
            plugin.scored_hints.clear()

    def free(self, scheduler: Any, request: Any, free: Callable[[Any], None]) -> None:
        """`free` (vLLM's `_free_request_blocks`) with the request's release: announced to
        the queue before an immediate free, held for the blocks of a deferred one."""
        queue = self.queue
        if queue.runtime.mode.mode == "lru":  # off: vLLM's own list takes the blocks
            free(request)
            return
        start_ns = perf_counter_ns()
        plugin = self.plugin
        if scheduler._request_blocks_can_be_freed(request):
            self.announce(scheduler, request)
            free(request)
        else:
            release = plugin.safe_release_for(request)
            deferred = scheduler.deferred_frees
            before = len(deferred)
            free(request)
            if len(deferred) > before:
                try:
                    plugin.hold_for_deferred_free(deferred[-1][1], release)
                except Exception as error:  # the blocks are then freed on the fallback p
                    plugin.stats.plugin_error("holding a deferred free's release", error)
        queue.runtime.histograms.free_latency_ns.observe(perf_counter_ns() - start_ns)

    def announce(self, scheduler: Any, request: Any) -> None:
        """Before vLLM frees `request`'s blocks now: the request and its blocks per group to
        the queue (`on_request_freed`: its release, the blocks it shares). Never raises: on an
        error the free goes on as stock (fallback p)."""
        try:
            blocks = scheduler.kv_cache_manager.coordinator.get_blocks(request.request_id)
        except Exception as error:
            self.plugin.stats.plugin_error("reading a request's blocks", error)
            return
        self.queue.on_request_freed(request, blocks)

    def update_waiting_for_remote_kv(
        self, scheduler: Any, request: Any, update: Callable[[Any], None]
    ) -> None:
        """`update` (vLLM's `_update_waiting_for_remote_kv`) for a request whose KV load
        ended. A failed load that left nothing valid frees the request's blocks there for a
        local retry, calling `KVCacheManager.free` itself (not `_free_request_blocks`):
        that free is announced first, as `free` announces one (the request is not finished:
        its release is a protected one)."""
        if (
            request.request_id not in scheduler.failed_recving_kv_req_ids
            or request.num_computed_tokens
            or self.queue.runtime.mode.mode == "lru"
        ):
            update(request)
            return
        start_ns = perf_counter_ns()
        self.announce(scheduler, request)
        update(request)
        self.queue.runtime.histograms.free_latency_ns.observe(perf_counter_ns() - start_ns)

    def drain(self, scheduler: Any) -> None:
        """vLLM's `_drain_deferred_frees`, each free with the release held for its blocks
        (`vllm_plugin.free_with_release`), then the pooling notes for those other requests
        still hold."""
        deferred = scheduler.deferred_frees
        pool = scheduler.kv_cache_manager.block_pool
        while deferred:
            fence, _ = deferred[0]
            if fence > scheduler.processed_step_seq:
                break
            _, blocks = deferred.popleft()
            # Tail first, as vLLM frees them.
            if pool.free_block_queue is self.queue:
                vllm_plugin.free_with_release(self.plugin, pool, blocks[::-1], _free_blocks)
            else:  # off and drained: stock, as there
                pool.free_blocks(reversed(blocks))

    @property
    def notes_schedulings(self) -> bool:
        """Whether a first scheduling matters outside shadow mode: a predictor board asks for
        its prediction, the request log notes its hit. Fixed at start-up (the runtime's)."""
        return self.plugin.board is not None or self.plugin.request_log is not None

    @property
    def shadowing(self) -> bool:
        """Whether the shadow caches are fed now (or about to be: shadow mode was asked)."""
        return self.shadow.active or self.switch.mode == "shadow"

    def scheduled(self, scheduler: Any, output: Any) -> None:
        """What a first scheduling tells (`_admit`: the request log's hit, the prediction's
        ask, the shadow's admission), for the requests vLLM scheduled for the first time in
        this step, and the shadow's admissions of those running (never raises)."""
        plugin = self.plugin
        shadow = plugin.shadow
        shadowing = self.shadowing and shadow is not None
        if not shadowing and not output.scheduled_new_reqs:  # nothing to note
            return
        board, log = plugin.board, plugin.request_log
        pool = self.pool
        if (board is None and log is None and not shadowing) or (
            pool.free_block_queue is not self.queue  # off and drained: stock, as there
        ):
            return
        try:
            requests = scheduler.requests
            if shadowing:  # those that ran before the shadow started are not admitted
                for rid in output.scheduled_cached_reqs.req_ids:
                    shadow.scheduled(requests[rid], pool, plugin.conversation_of)
            for data in output.scheduled_new_reqs:
                request = requests.get(data.req_id)
                if request is not None:
                    self._admit(request, local_hit(request, data), shadowing)
        except Exception as error:
            plugin.stats.plugin_error("reading the requests scheduled", error)

    def admitted(self, request: Any, hit_tokens: int) -> None:
        """What `request`'s first scheduling tells, for a driver of vLLM's `KVCacheManager`
        without a scheduler (a replay; `scheduled` for the class): its prefix hit of
        `hit_tokens` to the request log, its prediction asked for, its admission to the shadow
        caches. Never raises."""
        if self.pool.free_block_queue is not self.queue:  # off and drained: stock
            return
        try:
            self._admit(request, hit_tokens, self.shadowing and self.plugin.shadow is not None)
        except Exception as error:
            self.plugin.stats.plugin_error("reading the requests scheduled", error)

    def _admit(self, request: Any, hit_tokens: int, shadowing: bool) -> None:
        plugin = self.plugin
        if plugin.request_log is not None:
            plugin.request_log.note_computed(request, hit_tokens, self.pool)
        if plugin.board is not None:
            plugin.safe_on_scheduled(request)
        if shadowing:
            plugin.shadow.scheduled(  # type: ignore[union-attr]
                _FirstScheduling(request),
                self.pool,
                lambda _view: plugin.conversation_of(request),
            )


class ScheduleFollower:
    """Follows the mode for a scheduler whose first schedulings matter to the shadow caches
    alone (`SchedulerLPC.notes_schedulings` false): outside shadow mode its `schedule` is
    vLLM's own bound method (`_stock_schedule`), set on the instance, so that no frame of
    LPC's runs at any step; in shadow mode the instance's is dropped, and the class's override
    feeds the caches. Set on the switch's thread; the scheduler thread reads the attribute at
    its next step. Holds the scheduler weakly: the switch outlives it."""

    def __init__(self, scheduler: Any) -> None:
        self._scheduler = weakref.ref(scheduler)

    def follow(self, mode: str) -> None:
        scheduler = self._scheduler()
        if scheduler is None:
            return
        if mode == "shadow":
            vars(scheduler).pop("schedule", None)
        else:
            scheduler.schedule = scheduler._stock_schedule


def _free_blocks(pool: Any, blocks: list[Any]) -> None:
    pool.free_blocks(blocks)


def local_hit(request: Any, data: Any) -> int:
    """The request's prefix-cache hit in this pool at its admission (what
    `get_computed_blocks` returned then: vLLM's prefill statistics keep it), else its
    computed tokens when scheduled."""
    stats = getattr(request, "prefill_stats", None)
    hit = getattr(stats, "num_local_cached_tokens", None)
    return hit if isinstance(hit, int) else data.num_computed_tokens


def give_queue(
    pool: Any, plugin: PluginRuntime, free_ids: set[int], stock: type | None = None
) -> LPCSchedulerQueue:
    """Hand vLLM's `pool` an LPC queue over its blocks (those in `free_ids` free, in id order,
    uncached; every other one held), in the runtime's current mode; `stock`: the queue class
    its list is (None: vLLM's `FreeKVCacheBlockQueue`)."""
    queue = LPCSchedulerQueue(pool.blocks, pool.hash_block_size, plugin, stock)
    for block in pool.blocks:  # the null block, and any block vLLM holds already
        if block.block_id not in free_ids:
            queue.remove(block)
    pool.free_block_queue = queue
    switch = plugin.queues.mode
    with switch.lock:  # the current mode, now that the pool holds the queue
        queue.follow(switch.mode)
    queue.settle()  # off (lru, shadow) with nothing learned: vLLM's own queue from the start
    return queue


@dataclass
class ManagerLPC:
    """LPC on a vLLM `KVCacheManager` driven without a scheduler (replays, benchmarks, tests):
    its pool holds the class's queue (`attach_manager`), and its frees and first allocations
    go through what the class does at them."""

    lpc: SchedulerLPC
    manager: Any
    # What the class's free path reads of its scheduler: no KV connector, so every finished
    # request's blocks are freed at once.
    scheduler: Any = field(init=False)

    def __post_init__(self) -> None:
        self.scheduler = SimpleNamespace(
            kv_cache_manager=self.manager, _request_blocks_can_be_freed=lambda _request: True
        )

    def free(self, request: Any) -> None:
        """vLLM's `KVCacheManager.free(request)` as the class frees a request
        (`SchedulerLPC.free`: its release announced to the queue first)."""
        self.lpc.free(self.scheduler, request, self.manager.free)

    def admitted(self, request: Any, hit_tokens: int) -> None:
        """After `request`'s first `allocate_slots`, with its prefix hit of `hit_tokens`."""
        self.lpc.admitted(request, hit_tokens)


def attach_manager(manager: Any, plugin: PluginRuntime) -> ManagerLPC:
    """Give `manager`'s pool the class's queue over its blocks (as `attach`, without a
    scheduler): LPC on that manager, with nothing of vLLM patched."""
    pool = manager.block_pool
    free = {block.block_id for block in pool.free_block_queue.get_all_free_blocks()}
    return ManagerLPC(SchedulerLPC(plugin, give_queue(pool, plugin, free), pool), manager)
