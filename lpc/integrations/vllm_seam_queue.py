"""The LPC free queue that vLLM's `EvictionPolicyFactory` builds, on a vLLM with the seam.

vLLM imports this module by path (`vllm_seam.register_seam` registers it as the policy `lpc`).
It stands apart from `vllm_seam` because the queue takes its runtime from the plugin
(`vllm_plugin.seam_runtime`), and the plugin imports `vllm_seam` to register it. What the
queue learns from `on_request_freed`, and what the seam leaves out: `vllm_seam`.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from eviction.base import Release
from lpc.integrations import vllm_plugin
from lpc.integrations.vllm_queue import LPCFreeBlockQueue
from lpc.integrations.vllm_seam import SeamQueueRuntime, seam_engine_context


@dataclass
class _PendingRelease:
    """A release announced by `on_request_freed`, until its groups' frees have been queued."""

    release: Release
    shared: list[Any]  # cached blocks other requests still hold (pooling metadata)
    openers: set[int]  # block id of each group's first freed cached block, not yet queued


class LPCSeamQueue(LPCFreeBlockQueue):
    """The LPC free queue as vLLM's `EvictionPolicyFactory` builds it: `(blocks, hash_block_size)`,
    its runtime the registration's (built on first use from the `LPC_*` environment). The LPC
    scheduler class (`vllm_scheduler_class`) builds it with its own runtime (`plugin`), and a
    test's stand-in engine with a stand-in of vLLM's queue class (`stock`)."""

    def __init__(
        self,
        blocks: list[Any],
        hash_block_size: int | None = None,
        plugin: vllm_plugin.PluginRuntime | None = None,
        stock: type | None = None,
    ) -> None:
        if plugin is None:
            plugin = vllm_plugin.seam_runtime()
        queues = plugin.queues
        if isinstance(queues, SeamQueueRuntime) and not queues.seam_activated:
            queues.engine = seam_engine_context(hash_block_size)
        self.runtime = queues  # this instance's (`bind_queue_class` makes it a class attribute)
        # The list (and, off, the pool's queue) is vLLM's own queue class; `stock` a stand-in's.
        if stock is None:
            stock = importlib.import_module("vllm.v1.core.kv_cache_utils").FreeKVCacheBlockQueue
        self.stock = stock
        self._plugin = plugin
        self._block_pool = blocks[0].pool if blocks else None  # vLLM's blocks know their pool
        self._pending: _PendingRelease | None = None
        super().__init__(blocks)

    def on_request_freed(self, request: Any, blocks: Sequence[Sequence[Any]]) -> None:
        """vLLM is about to free `request`'s `blocks` (one list per KV cache group, allocation
        order): its release, the blocks it shares, and which appends will carry it. Nothing
        with the kill switch off (`lru`): vLLM's own list takes the blocks. Never
        raises: on an error the free goes on as stock (fallback p, no pooling metadata)."""
        self._end_release()
        if self.runtime.mode.mode == "lru":  # off: vLLM's own list takes the blocks
            return
        plugin = self._plugin
        release = plugin.safe_release_for(request)
        try:
            shared: list[Any] = []
            openers: set[int] = set()
            for group in blocks:
                ordered = group[::-1]  # vLLM frees tail first
                shared.extend(vllm_plugin.shared_blocks(ordered, self._block_pool))
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
        """Note the finished release's shared blocks (after its freed ones, as
        `vllm_plugin.free_with_release` does) and forget it."""
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
