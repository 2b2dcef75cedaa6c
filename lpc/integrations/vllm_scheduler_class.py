"""LPC through vLLM's own `--scheduler-cls`: nothing in vLLM patched, one block pool changed.

    vllm serve MODEL --scheduler-cls lpc.integrations.vllm_scheduler_class.LPCScheduler \\
        --additional-config '{"lpc": {"evictor": "lpc-pooled"}}'

`LPCScheduler` / `LPCAsyncScheduler` subclass vLLM's schedulers: only this scheduler's
full-attention pool gets the LPC queue, the request's release reaches it in
`_free_request_blocks` and in `_update_waiting_for_remote_kv` (a failed KV load's free), a
deferred free's blocks are freed with it in `_drain_deferred_frees`, `schedule` notes what
the first scheduling tells, and with a model in process `update_from_output` (and
`finish_requests`, for aborts) holds the frees of the requests it finishes until its end, to
score them in one call. This module
imports vLLM: only an engine imports it. Design: docs/design.md, "Through vLLM's
`--scheduler-cls`".
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from time import perf_counter_ns
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from lpc.integrations import vllm_compat, vllm_plugin
from lpc.integrations.config import load_config
from lpc.integrations.engine_config import config_from_table, lpc_table
from lpc.integrations.kill_switch import ModeSwitch
from lpc.integrations.vllm_plugin import PluginRuntime
from lpc.integrations.vllm_seam_queue import LPCSeamQueue

logger = logging.getLogger("vllm.plugins.lpc")

_MODULES = {**vllm_plugin.VLLM_MODULES, "scheduler_output": "vllm.v1.core.sched.output"}


@functools.cache
def unfit_vllm() -> str | None:
    """Why this vLLM does not fit the class (None: it fits): a shape other than the one it
    reads and overrides, or a version it is not verified with (unless
    `LPC_VLLM_ALLOW_UNTESTED=1`, and then said); said once per process."""
    modules = {key: importlib.import_module(name) for key, name in _MODULES.items()}
    problems = vllm_compat.scheduler_class_problems(**modules)
    untested = vllm_compat.check_version(importlib.import_module("vllm").__version__)
    allowed = os.environ.get(vllm_compat.ALLOW_UNTESTED_VARIABLE) == "1"
    if untested is not None and not problems and allowed:
        logger.warning(
            "LPC scheduler class: %s; LPC runs anyway (%s=1, every structural check passed)",
            untested,
            vllm_compat.ALLOW_UNTESTED_VARIABLE,
        )
    elif untested is not None:
        problems.append(
            f"{untested}; {vllm_compat.ALLOW_UNTESTED_VARIABLE}=1 runs LPC on it where every "
            "structural check passes"
        )
    if not problems:
        return None
    reason = "; ".join(problems)
    logger.warning("LPC scheduler class: vLLM runs its own scheduler, stock: %s", reason)
    return reason


def stock_engine(vllm_config: Any, kv_cache_config: Any) -> str | None:
    """Why this engine's KV cache stays stock (None: one full-attention group, prefix caching
    on): LPC orders one full-attention pool, as the seam does."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    cache = getattr(vllm_config, "cache_config", None)
    if not getattr(cache, "enable_prefix_caching", False):
        return "prefix caching is off"
    groups = getattr(kv_cache_config, "kv_cache_groups", None) or []
    if len(groups) != 1:
        return f"{len(groups)} KV cache groups (a hybrid model)"
    spec = groups[0].kv_cache_spec
    if not isinstance(spec, FullAttentionSpec):
        return f"its KV cache group is {type(spec).__name__}, not full attention"
    return None


class _NoShadow:
    """A runtime without a shadow feed: never feeding one."""

    active = False


_NO_SHADOW = _NoShadow()


class LPCSchedulerQueue(LPCSeamQueue):
    """The seam's queue, built by the scheduler class with its runtime (a free deferred by
    vLLM reaches it through `SchedulerLPC.drain`, with the release held for its blocks)."""


class _FirstScheduling:
    """A request as the patch points' `allocate_slots` hook sees it on its first scheduling:
    nothing computed yet (vLLM sets its computed tokens after the allocation)."""

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
        that free is announced first, as the patch points' `free` wrapper makes its release
        (the request is not finished: a protected one)."""
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
        """vLLM's `_drain_deferred_frees`, each free as the patch points' `free_blocks`
        wrapper makes it: with the release held for its blocks (`free_with_release`), then
        the pooling notes for those other requests still hold."""
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
    def shadowing(self) -> bool:
        """Whether the shadow caches are fed now (or about to be: shadow mode was asked)."""
        return self.shadow.active or self.switch.mode == "shadow"

    def scheduled(self, scheduler: Any, output: Any) -> None:
        """What the patch points' `get_computed_blocks` and `allocate_slots` hooks note, for
        the requests vLLM scheduled for the first time in this step (never raises)."""
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


def _free_blocks(pool: Any, blocks: list[Any]) -> None:
    pool.free_blocks(blocks)


def local_hit(request: Any, data: Any) -> int:
    """The request's prefix-cache hit in this pool at its admission (what
    `get_computed_blocks` returned then: vLLM's prefill statistics keep it), else its
    computed tokens when scheduled."""
    stats = getattr(request, "prefill_stats", None)
    hit = getattr(stats, "num_local_cached_tokens", None)
    return hit if isinstance(hit, int) else data.num_computed_tokens


def prepare(scheduler_class: type, vllm_config: Any, kv_cache_config: Any) -> PluginRuntime | None:
    """Before vLLM's constructor, what the patch points' `Scheduler.__init__` wrapper does:
    the runtime with this engine's configuration (None: this scheduler stays stock, said)."""
    if unfit_vllm() is not None:
        return None
    if vllm_plugin.patch_points_installed():
        logger.info(
            "LPC runs through the replay harness's patch points in this process "
            "(install_patch_points); %s adds nothing",
            scheduler_class.__qualname__,
        )
        return None
    table = lpc_table(vllm_config)
    config = config_from_table(table) if table is not None else load_config()
    reason = stock_engine(vllm_config, kv_cache_config)
    if reason is not None:
        logger.info("LPC leaves this engine's KV cache stock: %s", reason)
        return None
    vllm_plugin.check_engine(config, vllm_config, kv_cache_config)
    plugin = vllm_plugin.install_unpatched(config)
    if plugin is not None:
        vllm_plugin.note_engine(plugin, vllm_config)
    return plugin


def attach(scheduler: Any, plugin: PluginRuntime) -> SchedulerLPC | None:
    """Give this scheduler's block pool an LPC queue over the same blocks, in the same order
    (every free block uncached, in id order, as vLLM's constructor leaves them); None: the
    pool stays stock, said."""
    from vllm.v1.core.kv_cache_utils import FreeKVCacheBlockQueue

    problems = vllm_compat.scheduler_instance_problems(scheduler, FreeKVCacheBlockQueue)
    pool = scheduler.kv_cache_manager.block_pool if not problems else None
    if pool is not None:
        free = pool.free_block_queue.get_all_free_blocks()
        ids = [block.block_id for block in free]
        if ids != sorted(set(ids)) or any(block.block_hash is not None for block in free):
            problems.append("the block pool's free queue is not as vLLM's constructor leaves it")
    if problems or pool is None:
        logger.warning("LPC scheduler class: the block pool stays stock: %s", "; ".join(problems))
        return None
    return SchedulerLPC(plugin, give_queue(pool, plugin, set(ids)), pool)


def give_queue(pool: Any, plugin: PluginRuntime, free_ids: set[int]) -> LPCSchedulerQueue:
    """Hand vLLM's `pool` an LPC queue over its blocks (those in `free_ids` free, in id order,
    uncached; every other one held), in the runtime's current mode."""
    queue = LPCSchedulerQueue(pool.blocks, pool.hash_block_size, plugin)
    for block in pool.blocks:  # the null block, and any block vLLM holds already
        if block.block_id not in free_ids:
            queue.remove(block)
    pool.free_block_queue = queue
    switch = plugin.queues.mode
    with switch.lock:  # the current mode, now that the pool holds the queue
        queue.follow(switch.mode)
    return queue


def _configs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """`Scheduler.__init__`'s `vllm_config` and `kv_cache_config`, however they were passed."""
    vllm_config = kwargs["vllm_config"] if "vllm_config" in kwargs else args[0]
    if "kv_cache_config" in kwargs:
        return vllm_config, kwargs["kv_cache_config"]
    return vllm_config, args[1] if len(args) > 1 else None


class LPCSchedulerMixin:
    """LPC in vLLM's scheduler by subclassing (module docstring); first in the bases."""

    lpc: SchedulerLPC | None = None  # None: stock
    _stock_update: Callable[[Any, Any], Any]
    _stock_schedule: Callable[[bool], Any]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        plugin = prepare(type(self), *_configs(args, kwargs))
        super().__init__(*args, **kwargs)
        if plugin is not None:
            self.lpc = attach(self, plugin)
        # vLLM's own step methods, bound once: the overrides below run at every step. Where
        # one has nothing to do for this scheduler's whole life (stock; no model in process),
        # vLLM's bound method is set on the instance, ahead of the override: no frame of ours.
        self._stock_update = super().update_from_output  # type: ignore[misc]
        self._stock_schedule = super().schedule  # type: ignore[misc]
        lpc = self.lpc
        if lpc is None:
            self.schedule = self._stock_schedule  # type: ignore[method-assign]
        if lpc is None or not lpc.in_process:
            self.update_from_output = self._stock_update  # type: ignore[method-assign]

    def _free_request_blocks(self, request: Any) -> None:
        lpc = self.lpc
        if lpc is None:
            return super()._free_request_blocks(request)  # type: ignore[misc]
        if not lpc.hold(request):
            lpc.free(self, request, super()._free_request_blocks)  # type: ignore[misc]
        return None

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        # Only with a model in process (`__init__`): the step's frees are held for one call.
        lpc: SchedulerLPC = self.lpc  # type: ignore[assignment]
        lpc.holding = True
        try:
            return self._stock_update(scheduler_output, model_runner_output)
        finally:
            lpc.holding = False
            if lpc.held:
                lpc.flush(self, super()._free_request_blocks)  # type: ignore[misc]

    def finish_requests(self, request_ids: Any, finished_status: Any) -> Any:
        """vLLM's, for requests finished from outside the step (aborts, usually a batch of
        them): with a model in process, scored in one call as at a step's end."""
        lpc = self.lpc
        finish = super().finish_requests  # type: ignore[misc]
        if lpc is None or not lpc.in_process or lpc.holding:
            return finish(request_ids, finished_status)
        lpc.holding = True
        try:
            return finish(request_ids, finished_status)
        finally:
            lpc.holding = False
            if lpc.held:
                lpc.flush(self, super()._free_request_blocks)  # type: ignore[misc]

    def _update_waiting_for_remote_kv(self, request: Any) -> None:
        lpc = self.lpc
        if lpc is None:
            return super()._update_waiting_for_remote_kv(request)  # type: ignore[misc]
        update = super()._update_waiting_for_remote_kv  # type: ignore[misc]
        lpc.update_waiting_for_remote_kv(self, request, update)
        return None

    def _drain_deferred_frees(self) -> None:
        lpc = self.lpc
        if lpc is None:
            return super()._drain_deferred_frees()  # type: ignore[misc]
        lpc.drain(self)
        return None

    def schedule(self, throttle_prefills: bool = False) -> Any:
        # Only with LPC on this scheduler (`__init__`).
        output = self._stock_schedule(throttle_prefills)
        lpc: SchedulerLPC = self.lpc  # type: ignore[assignment]
        # Most steps admit no request and feed no shadow: they skip the call (every step).
        if output.scheduled_new_reqs or lpc.shadow.active or lpc.switch.mode == "shadow":
            lpc.scheduled(self, output)
        return output


class LPCScheduler(LPCSchedulerMixin, Scheduler):
    """vLLM's `Scheduler` with LPC eviction: `--scheduler-cls
    lpc.integrations.vllm_scheduler_class.LPCScheduler`."""


class LPCAsyncScheduler(LPCSchedulerMixin, AsyncScheduler):
    """vLLM's `AsyncScheduler` with LPC eviction (async scheduling): `--scheduler-cls
    lpc.integrations.vllm_scheduler_class.LPCAsyncScheduler`."""
