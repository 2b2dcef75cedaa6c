"""The plugin through vLLM's eviction-policy seam, where vLLM has it: nothing patched.

On a vLLM with `docs/vllm-eviction-seam.patch`'s `EvictionPolicyFactory`,
`vllm_plugin.register()` calls `register_seam()`, which registers
`LPCSeamQueue` (`vllm_seam_queue`) as the policy `lpc`, and only pools configured with
`eviction_policy="lpc"` get the LPC queue. The queue learns each release from
`on_request_freed`.

What the seam carries and what it does not: docs/design.md, "Through vLLM's eviction-policy
seam".
"""

from __future__ import annotations

import logging
import multiprocessing
from typing import Any

from lpc.integrations import vllm_compat
from lpc.integrations.config import PluginConfig
from lpc.integrations.engine_context import EngineContext, rank_of_process_name
from lpc.integrations.vllm_queue import QueueRuntime

logger = logging.getLogger("vllm.plugins.lpc")

SEAM_POLICY_NAME = "lpc"
# Where vLLM's factory finds the queue: a module of its own, since the queue needs the plugin's
# runtime (`vllm_plugin`), which imports this module.
SEAM_QUEUE_MODULE = "lpc.integrations.vllm_seam_queue"
SEAM_QUEUE_CLASS = "LPCSeamQueue"


class SeamQueueRuntime(QueueRuntime):
    """`QueueRuntime` whose engine facts come from the seam (the pool hands the queue its hash
    block size; the rank is the engine core's process name)."""

    seam_activated: bool = False

    def queue_built(self, pool: Any = None) -> None:
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


def register_seam(block_pool: Any) -> None:
    """Register `LPCSeamQueue` as the policy `lpc` in vLLM's `EvictionPolicyFactory` (vLLM
    loads plugins more than once per process: a second registration is a no-op)."""
    factory = block_pool.EvictionPolicyFactory
    try:
        factory.register_eviction_policy(SEAM_POLICY_NAME, SEAM_QUEUE_MODULE, SEAM_QUEUE_CLASS)
    except ValueError:  # already registered: ours, from an earlier load in this process
        resolved = factory.get_eviction_policy_cls(SEAM_POLICY_NAME)
        if (resolved.__module__, resolved.__qualname__) != (SEAM_QUEUE_MODULE, SEAM_QUEUE_CLASS):
            raise


def unsupported_by_seam(config: PluginConfig) -> list[str]:
    """The configured features the seam path cannot serve (they need hooks it has no
    counterpart for), for the one log line."""
    missing = []
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
