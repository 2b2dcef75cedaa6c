"""LPC through vLLM's own `--scheduler-cls`: nothing in vLLM patched, one block pool changed.

    vllm serve MODEL --scheduler-cls lpc.integrations.vllm_scheduler_class.LPCScheduler \\
        --additional-config '{"lpc": {"evictor": "lpc-pooled"}}'

`LPCScheduler` / `LPCAsyncScheduler` subclass vLLM's schedulers: only this scheduler's
full-attention pool gets the LPC queue, the request's release reaches it in
`_free_request_blocks` and in `_update_waiting_for_remote_kv` (a failed KV load's free), a
deferred free's blocks are freed with it in `_drain_deferred_frees`, `schedule` notes what
the first scheduling tells, and with a model in process `update_from_output` (and
`finish_requests`, for aborts) holds the frees of the requests it finishes until its end, to
score them in one call: what it does at each of those calls is `scheduler_lpc.SchedulerLPC`,
which imports nothing of vLLM. This module imports vLLM: only an engine imports it. Design:
docs/design.md, "Through vLLM's `--scheduler-cls`".
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
from collections.abc import Callable
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from lpc.integrations import vllm_compat, vllm_plugin
from lpc.integrations.config import load_config
from lpc.integrations.engine_config import config_from_table, lpc_table
from lpc.integrations.scheduler_lpc import ScheduleFollower, SchedulerLPC, give_queue
from lpc.integrations.vllm_plugin import PluginRuntime

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


def prepare(scheduler_class: type, vllm_config: Any, kv_cache_config: Any) -> PluginRuntime | None:
    """Before vLLM's constructor: the configuration, the engine checks and the runtime, with
    this engine's configuration noted (None: this scheduler stays stock, said)."""
    if unfit_vllm() is not None:
        return None
    table = lpc_table(vllm_config)
    config = config_from_table(table) if table is not None else load_config()
    reason = stock_engine(vllm_config, kv_cache_config)
    if reason is not None:
        logger.info("LPC leaves this engine's KV cache stock: %s", reason)
        return None
    vllm_plugin.check_engine(config, vllm_config, kv_cache_config)
    plugin = vllm_plugin.install_runtime(config)
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
        # `schedule` has nothing to do outside shadow mode without a predictor board or a
        # request log: the mode sets or drops vLLM's there (`ScheduleFollower`).
        self._stock_update = super().update_from_output  # type: ignore[misc]
        self._stock_schedule = super().schedule  # type: ignore[misc]
        lpc = self.lpc
        if lpc is None:
            self.schedule = self._stock_schedule  # type: ignore[method-assign]
        elif not lpc.notes_schedulings:
            lpc.switch.attach(ScheduleFollower(self))
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
        # Only with LPC on this scheduler, and without a board or request log in shadow mode
        # alone (`__init__`).
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
