"""The plugin through vLLM's eviction-policy seam, where vLLM has it: nothing patched.

`docs/vllm-eviction-seam.patch` proposes to vLLM an `EvictionPolicyFactory` in
`vllm.v1.core.block_pool`: a `BlockPool` whose `CacheConfig.eviction_policy` names a
registered policy builds that class as its free-block queue, and `KVCacheManager.free` calls the
queue's `on_request_freed(request, blocks)` before it frees the request's blocks. On such a
vLLM, `vllm_plugin.register()` calls `register_seam()` instead of patching: it registers
`LPCSeamQueue` under the name `lpc` and replaces no class, wraps no `Scheduler`,
`KVCacheManager` or `BlockPool` method and reads no call stack. Only the pools configured with
`eviction_policy="lpc"` get the LPC queue; every other pool keeps vLLM's own.

What the patch points learn by wrapping, the queue learns from `on_request_freed`:
- the release (probability, time, conversation namespaced by tenant, preemption as a
  `ProtectedRelease`): `PluginRuntime.safe_release_for`, the same call the wrapped
  `KVCacheManager.free` makes;
- the cached blocks the request gives up while others still hold them (max pooling):
  `vllm_plugin.shared_blocks`, the same scan the wrapped `BlockPool.free_blocks` makes, noted
  after the request's freed blocks are queued, as there;
- which `append_n` calls carry that release: the first block each group will free (the
  deepest one the request alone holds) opens its group's `append_n`; any other append (an
  unpin, a deferred free) is outside a release, as with the patch points.

Not carried by the seam (each needs a hook it does not have; the seam path logs one line
naming the configured ones, `unsupported_by_seam`): the predictor RPC's asks, the shadow
caches' admissions, the request log's prefix hits, what the patch points read in
`Scheduler.__init__` (the CPU tier's settings, the engine checks, the metrics' `model_name`),
and frees deferred through `pop_blocks_for_free` (their blocks take the fallback p at the
current time, LRU's place). The LPC settings come from the `LPC_*` environment or
`register(config)`.
"""

from __future__ import annotations

import importlib
import logging
import multiprocessing
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from eviction.base import Release
from lpc.integrations import vllm_compat
from lpc.integrations.config import PluginConfig
from lpc.integrations.engine_context import EngineContext, rank_of_process_name
from lpc.integrations.vllm_queue import LPCFreeBlockQueue, QueueRuntime

logger = logging.getLogger("vllm.plugins.lpc")

SEAM_POLICY_NAME = "lpc"
SEAM_QUEUE_CLASS = "LPCSeamQueue"


class SeamQueueRuntime(QueueRuntime):
    """`QueueRuntime` whose engine facts come from the seam (the pool hands the queue its hash
    block size; the rank is the engine core's process name), not from the call stack."""

    seam_activated: bool = False

    def queue_built(self) -> None:
        if self.seam_activated:
            return
        self.seam_activated = True
        if self.activate is not None:
            try:
                self.activate()
            except Exception as error:  # e.g. the metrics server: vLLM must still start
                self.stats.plugin_error("activating the plugin (metrics server)", error)


def seam_engine_context(hash_block_size: Any) -> EngineContext:
    """The block size the pool passed, and the rank vLLM's process name carries (else 0)."""
    size = hash_block_size if isinstance(hash_block_size, int) and hash_block_size > 0 else None
    rank = rank_of_process_name(multiprocessing.current_process().name)
    if rank is None:
        return EngineContext(size)
    return EngineContext(size, rank, "process name")


@dataclass
class _PendingRelease:
    """A release announced by `on_request_freed`, until its groups' frees have been queued."""

    release: Release
    shared: list[Any]  # cached blocks other requests still hold (pooling metadata)
    openers: set[int]  # block id of each group's first freed cached block, not yet queued


class LPCSeamQueue(LPCFreeBlockQueue):
    """The LPC free queue as vLLM's `EvictionPolicyFactory` builds it: `(blocks, hash_block_size)`,
    its runtime the registration's (built on first use from the `LPC_*` environment)."""

    def __init__(self, blocks: list[Any], hash_block_size: int | None = None) -> None:
        from lpc.integrations import vllm_plugin

        plugin = vllm_plugin.seam_runtime()
        queues = plugin.queues
        if isinstance(queues, SeamQueueRuntime) and not queues.seam_activated:
            queues.engine = seam_engine_context(hash_block_size)
        self.runtime = queues  # this instance's (the class attribute of the patch path)
        # The list (and, off, the pool's queue) is vLLM's own queue class, as on the patch path.
        self.stock = importlib.import_module("vllm.v1.core.kv_cache_utils").FreeKVCacheBlockQueue
        self._plugin = plugin
        self._block_pool = blocks[0].pool if blocks else None  # vLLM's blocks know their pool
        self._pending: _PendingRelease | None = None
        super().__init__(blocks)

    def on_request_freed(self, request: Any, blocks: Sequence[Sequence[Any]]) -> None:
        """vLLM is about to free `request`'s `blocks` (one list per KV cache group, allocation
        order): its release, the blocks it shares, and which appends will carry it. Nothing
        with the kill switch off (`lru`), as the patch points' hooks skip such a pool. Never
        raises: on an error the free goes on as stock (fallback p, no pooling metadata)."""
        self._end_release()
        if self.runtime.mode.mode == "lru":  # off: vLLM's own list takes the blocks
            return
        plugin = self._plugin
        release = plugin.safe_release_for(request)
        try:
            from lpc.integrations.vllm_plugin import shared_blocks

            shared: list[Any] = []
            openers: set[int] = set()
            for group in blocks:
                ordered = group[::-1]  # vLLM frees tail first
                shared.extend(shared_blocks(ordered, self._block_pool))
                opener = self._first_freed(ordered)
                if opener is not None:
                    openers.add(opener)
        except Exception as error:
            plugin.stats.plugin_error("preparing a free of blocks", error)
            return
        self._pending = _PendingRelease(release, shared, openers)
        if not openers:  # nothing of it reaches the queue: its shared blocks are noted now
            self._end_release()

    def _first_freed(self, ordered: Sequence[Any]) -> int | None:
        """The id of the first block of `ordered` that this free queues as cached (held by
        this request alone): the first `append_n` of this group starts with it."""
        pool = self._block_pool
        for block in ordered:
            if (
                block.ref_cnt == 1
                and not block.is_null
                and block.block_hash is not None
                and (block.pool is None or block.pool is pool)
            ):
                return block.block_id
        return None

    def _end_release(self) -> None:
        """Note the finished release's shared blocks (after its freed ones, as the patch
        points do) and forget it."""
        pending = self._pending
        if pending is not None:
            self._pending = None
            self.note_shared_release(pending.shared, pending.release)

    def append_n(self, blocks: Sequence[Any]) -> None:
        pending = self._pending
        if pending is None or not blocks or blocks[0].block_id not in pending.openers:
            super().append_n(blocks)
            return
        pending.openers.discard(blocks[0].block_id)
        with self.runtime.releasing(pending.release):
            super().append_n(blocks)
        if not pending.openers:
            self._end_release()


def register_seam(block_pool: Any) -> None:
    """Register `LPCSeamQueue` as the policy `lpc` in vLLM's `EvictionPolicyFactory` (vLLM
    loads plugins more than once per process: a second registration is a no-op)."""
    factory = block_pool.EvictionPolicyFactory
    try:
        factory.register_eviction_policy(SEAM_POLICY_NAME, __name__, SEAM_QUEUE_CLASS)
    except ValueError:  # already registered: ours, from an earlier load in this process
        resolved = factory.get_eviction_policy_cls(SEAM_POLICY_NAME)
        if resolved is not LPCSeamQueue:
            raise


def unsupported_by_seam(config: PluginConfig) -> list[str]:
    """The configured features the seam path cannot serve (they need hooks it has no
    counterpart for), for the one log line."""
    missing = []
    if config.predictor_url is not None:
        missing.append("predictor_url (asked when a request is first scheduled)")
    if config.request_log_dir is not None:
        missing.append("request_log_dir's prefix hits (noted in get_computed_blocks)")
    if config.mode == "shadow":
        missing.append("shadow mode's admissions (noted in allocate_slots)")
    return missing


def seam_problems(modules: dict[str, Any]) -> list[str]:
    """`vllm_compat.seam_problems` over the modules `vllm_plugin` imported."""
    return vllm_compat.seam_problems(
        modules["block_pool"],
        modules["kv_cache_utils"],
        modules["kv_cache_manager"],
        modules["request_module"],
        modules["sampling_params"],
        modules["scheduler"],
    )
