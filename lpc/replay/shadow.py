"""Our replay of the requests a vLLM engine's shadow caches saw, to check their figures.

The plugin's shadow mode (`lpc.integrations.shadow`) replays an engine's requests through
metadata-only LPC and LRU caches. This module replays the same requests again, from the
requests' token ids (hashed here with `lpc.blocks.hashing`, not vLLM's hashes) and the
shadow's event log (`Admission`/`Finish`: when each request entered and finished, its token
counts and its release's probability, in the order the shadow applied them), through two
`PrefixCacheBlockManager`s of the same size: the learned evictor built as the plugin builds
it, and LRU. The hit tokens must equal the shadow's, cache by cache.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eviction import LPCEvictor, LRUEvictor
from eviction.lpc_pooled import DEFAULT_MEMORY
from lpc.blocks.block_manager import CacheRequest, PrefixCacheBlockManager
from lpc.blocks.hashing import BlockHash, BlockHasher
from lpc.integrations.config import PluginConfig
from lpc.integrations.stats import PluginStats
from lpc.integrations.vllm_queue import QueueRuntime


@dataclass(frozen=True)
class ShadowRequest:
    """A request's whole token sequence (prompt, then the output it emits) and salt."""

    token_ids: Sequence[int]
    num_prompt_tokens: int
    cache_salt: str | None = None


@dataclass
class ShadowReplayResult:
    requests: int = 0
    queries: int = 0
    hits: dict[str, int] = field(default_factory=lambda: {"lpc": 0, "lru": 0})
    allocation_failures: dict[str, int] = field(default_factory=lambda: {"lpc": 0, "lru": 0})

    def hit_ratio(self, cache: str) -> float:
        return self.hits[cache] / self.queries if self.queries else 0.0


def read_events(path: Path) -> list[dict[str, Any]]:
    """The shadow's event log as the scheduler replay writes it (one JSON object a line)."""
    with path.open(encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def learned_evictor_factory(
    evictor: str,
    scale_per_s: float,
    fallback_probability: float,
    probability_floor: float,
    horizon_s: float | None,
    pooled_memory: str = DEFAULT_MEMORY,
) -> Callable[[int], LPCEvictor]:
    """Builds the learned evictor exactly as the plugin's queues and shadow do."""
    config = PluginConfig(
        evictor=evictor,
        scale_per_s=scale_per_s,
        fallback_probability=fallback_probability,
        probability_floor=probability_floor,
        pooled_memory=pooled_memory,
    )
    runtime = QueueRuntime(config, PluginStats())
    runtime.horizon_s = horizon_s
    return runtime.new_evictor


def replay_shadow(
    requests: Mapping[str, ShadowRequest],
    events: Iterable[Mapping[str, Any]],
    new_learned_evictor: Callable[[int], LPCEvictor],
) -> ShadowReplayResult:
    """Replay the events (the last `start` begins fresh caches) through our block manager."""
    result = ShadowReplayResult()
    managers: dict[str, PrefixCacheBlockManager] = {}
    hasher: BlockHasher | None = None
    hashes: dict[str, list[BlockHash]] = {}
    failed: dict[str, set[str]] = {"lpc": set(), "lru": set()}  # not held: no finish
    for event in events:
        kind = event["event"]
        if kind == "start":
            num_blocks, block_size = event["num_blocks"], event["block_size"]
            managers = {
                "lpc": PrefixCacheBlockManager(
                    num_blocks, block_size, evictor=new_learned_evictor(num_blocks)
                ),
                "lru": PrefixCacheBlockManager(
                    num_blocks, block_size, evictor=LRUEvictor(num_blocks)
                ),
            }
            hasher = BlockHasher(block_size)
            result = ShadowReplayResult()
            continue
        assert hasher is not None, "an event before the shadow's start"
        rid = event["request_id"]
        request = requests[rid]
        if rid not in hashes:
            hashes[rid] = hasher.hash_sequence(request.token_ids, request.cache_salt)
        num_tokens = event["tokens"]
        full = hashes[rid][: num_tokens // hasher.block_size]
        if kind == "admit":
            result.requests += 1
            result.queries += num_tokens
            cache_request = CacheRequest(
                rid,
                request.token_ids[:num_tokens],
                num_tokens,
                conversation_id=event["conversation_id"],
                block_hashes=full,
            )
            for name, manager in managers.items():
                allocation = manager.allocate(cache_request, None, event["t"])
                if allocation is None:
                    result.allocation_failures[name] += 1
                    failed[name].add(rid)
                else:
                    result.hits[name] += allocation.num_hit_tokens
        elif kind == "finish":
            for name, manager in managers.items():
                if rid in failed[name]:
                    failed[name].discard(rid)
                    continue
                manager.grow(rid, num_tokens, full, event["t"])
                manager.free(rid, event["t"], event["p"])
            del hashes[rid]
        else:
            raise ValueError(f"unknown shadow event {kind!r}")
    return result
