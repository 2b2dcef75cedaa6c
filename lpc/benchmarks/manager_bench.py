"""vLLM's whole `KVCacheManager` calls for one request, stock against the LPC scheduler class.

The queue benchmark (`queue_bench`) times the free queue's part alone; this times what the
scheduler thread pays around it: `get_computed_blocks` + `allocate_slots` (the hit's touch and
the allocation), and the free, stock `KVCacheManager.free` against the class's free path
(`SchedulerLPC.free`: the release announced to the queue, its shared blocks found, then the
same `KVCacheManager.free` with the LPC queue inside). A third manager holds the floor
(`floor_queue.RunFloorQueue`: the least a queue keyed per release does) and is freed by
`KVCacheManager.free`, and a fourth the pooled floor (`floor_queue.PooledFloorQueue`: the
floor plus the per-block keys any pooling LPC queue reads and writes). Four real vLLM 0.33
managers over the same multi-turn requests, interleaved request by request; every request
carries its p as a trusted hint (scores present, no model: `lpc bench step-scoring` times the
scoring). Runs in vLLM's venv, from `queue_bench --manager`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from eviction.lpc_pooled import DEFAULT_MEMORY
from lpc.benchmarks.floor_queue import PooledFloorQueue, RunFloorQueue
from lpc.benchmarks.per_request import (
    BLOCK_SIZE,
    WARMUP_REQUESTS,
    Figure,
    compare_sides,
)
from lpc.integrations.config import PluginConfig

SIDES = ("stock", "lpc", "floor", "pooled_floor")
FLOORS = {"floor": RunFloorQueue, "pooled_floor": PooledFloorQueue}
P = 0.7  # every request's p, a trusted hint: one p, so LPC keeps the last turn as LRU does


@dataclass(frozen=True)
class ManagerResult:
    tokens: int
    requests: int
    hit_blocks: int  # blocks each request hits (half of its previous turn), on both sides
    stock: dict[str, Figure]  # "allocate", "free"
    lpc: dict[str, Figure]
    ratio_p50: dict[str, float]
    ratio_p99: dict[str, float]
    floor: dict[str, Figure]  # the floor queue's (`floor_queue`), and its ratios to stock
    floor_ratio_p50: dict[str, float]
    floor_ratio_p99: dict[str, float]
    pooled_floor: dict[str, Figure]  # the pooled floor's (`PooledFloorQueue`), and its ratios
    pooled_floor_ratio_p50: dict[str, float]
    pooled_floor_ratio_p99: dict[str, float]


def _manager(num_blocks: int) -> Any:
    import torch
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

    spec = FullAttentionSpec(
        block_size=BLOCK_SIZE, num_kv_heads=1, head_size=1, dtype=torch.float32
    )
    config = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer0"], spec)],
    )
    return KVCacheManager(
        config,
        max_model_len=num_blocks * BLOCK_SIZE,
        scheduler_block_size=BLOCK_SIZE,
        hash_block_size=BLOCK_SIZE,
        enable_caching=True,
    )


def run_manager(
    tokens: int, requests: int, evictor: str, pooled_memory: str = DEFAULT_MEMORY
) -> ManagerResult:
    """Every manager through the same `requests` turns of one conversation of `tokens` tokens
    each, every turn repeating the first half of the previous one (so each hits it)."""
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request, RequestStatus

    from lpc.integrations import vllm_plugin
    from lpc.integrations.scheduler_lpc import attach_manager

    init_none_hash(sha256)
    hasher = get_request_block_hasher(BLOCK_SIZE, sha256)
    n = tokens // BLOCK_SIZE
    hit = n // 2
    num_blocks = 4 * n + 64 + 1  # the null block besides
    clock = SimpleNamespace(now=0.0)
    config = PluginConfig(
        evictor=evictor,
        pooled_memory=pooled_memory,
        stats_log_interval_s=0.0,
        trust_request_hints=True,
    )
    plugin = vllm_plugin.install_runtime(config, clock=lambda: clock.now)
    try:
        sides: dict[str, dict[str, Any]] = {}
        for name in SIDES:
            manager = _manager(num_blocks)
            side: dict[str, Any] = {"manager": manager, "allocate": [], "free": []}
            if name == "lpc":
                side["free_path"] = attach_manager(manager, plugin).free
            else:
                side["free_path"] = manager.free
            if name in FLOORS:
                pool = manager.block_pool
                pool.free_block_queue = FLOORS[name](pool.free_block_queue, len(pool.blocks))
            sides[name] = side
        prompt: list[int] = []
        next_token = 1
        for r in range(WARMUP_REQUESTS + requests):
            clock.now = float(r)
            kept = prompt[: hit * BLOCK_SIZE]
            prompt = kept + list(range(next_token, next_token + tokens - len(kept)))
            next_token += tokens
            extra = {"lpc_probability": P, "lpc_conversation_id": "chat"}
            turn = r % len(SIDES)
            for name in SIDES[turn:] + SIDES[:turn]:  # each side first in turn
                side = sides[name]
                manager = side["manager"]
                request = Request(
                    request_id=f"{name}-{r}",
                    prompt_token_ids=prompt,
                    sampling_params=SamplingParams(max_tokens=1, extra_args=extra),
                    pooling_params=None,
                    arrival_time=float(r),
                    block_hasher=hasher,
                )
                t0 = time.thread_time_ns()
                computed, num_hit = manager.get_computed_blocks(request)[:2]
                blocks = manager.allocate_slots(
                    request,
                    num_new_tokens=request.num_tokens - num_hit,
                    num_new_computed_tokens=num_hit,
                    new_computed_blocks=computed,
                )
                t1 = time.thread_time_ns()
                if blocks is None:
                    raise RuntimeError(f"{name}: request {r} could not be allocated")
                request.status = RequestStatus.FINISHED_STOPPED
                t2 = time.thread_time_ns()
                side["free_path"](request)
                t3 = time.thread_time_ns()
                if r >= WARMUP_REQUESTS:
                    if num_hit != hit * BLOCK_SIZE:
                        raise RuntimeError(
                            f"{name}: request {r} hit {num_hit} tokens, not {hit * BLOCK_SIZE}"
                        )
                    side["allocate"].append(t1 - t0)
                    side["free"].append(t3 - t2)
    finally:
        vllm_plugin.unregister()
    calls = ("allocate", "free")
    figures, ratio_p50, ratio_p99 = compare_sides(sides, calls)
    _, floor_p50, floor_p99 = compare_sides(sides, calls, side="floor")
    _, pooled_p50, pooled_p99 = compare_sides(sides, calls, side="pooled_floor")
    return ManagerResult(
        tokens=tokens,
        requests=requests,
        hit_blocks=hit,
        stock=figures["stock"],
        lpc=figures["lpc"],
        ratio_p50=ratio_p50,
        ratio_p99=ratio_p99,
        floor=figures["floor"],
        floor_ratio_p50=floor_p50,
        floor_ratio_p99=floor_p99,
        pooled_floor=figures["pooled_floor"],
        pooled_floor_ratio_p50=pooled_p50,
        pooled_floor_ratio_p99=pooled_p99,
    )
