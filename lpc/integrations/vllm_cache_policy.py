"""LPC's vLLM 0.33 `CachePolicy` classes for the CPU offload tier, loaded by vLLM by name:

    --kv-transfer-config '{"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
      "kv_connector_extra_config": {"cpu_bytes_to_use": ..., "eviction_policy":
      "LPCCachePolicy", "cache_policy_module_path": "lpc.integrations.vllm_cache_policy"}}'

One class per policy, each `EvictorCachePolicy` (the logic, `lpc.integrations.cpu_tier_policy`,
which runs without vLLM) on vLLM's `CachePolicy`. This module imports vLLM: only an engine
imports it.
"""

from __future__ import annotations

from vllm.v1.kv_offload.cpu.policies.base import CachePolicy

from lpc.integrations.cpu_tier_policy import (
    EvictorCachePolicy,
    ReturnEvictorCachePolicy,
    init_for_engine,
)

# The policy first in each class: its methods implement CachePolicy's abstract ones.


class LPCCachePolicy(EvictorCachePolicy, CachePolicy):
    """vLLM's CPU offload tier ordered by eviction's 'lpc' evictor (max pooling)."""

    def __init__(self, cache_capacity: int) -> None:
        CachePolicy.__init__(self, cache_capacity)
        init_for_engine(self, cache_capacity, "lpc")


class LPCPooledCachePolicy(EvictorCachePolicy, CachePolicy):
    """vLLM's CPU offload tier ordered by eviction's 'lpc-pooled' evictor (OR pooling and a
    shared-prefix floor over the tier's own horizon)."""

    def __init__(self, cache_capacity: int) -> None:
        CachePolicy.__init__(self, cache_capacity)
        init_for_engine(self, cache_capacity, "lpc-pooled")


class LPCReturnCachePolicy(ReturnEvictorCachePolicy, CachePolicy):
    """vLLM's CPU offload tier ordered by eviction's 'lpc-return' evictor (the GPU plugin's
    return curves; refused without them)."""

    def __init__(self, cache_capacity: int) -> None:
        CachePolicy.__init__(self, cache_capacity)
        init_for_engine(self, cache_capacity, "lpc-return")
