"""One fleet cell: N instances behind one router, one policy, one cache size per instance.

The replay walks the prepared workload's events (`lpc.replay.simulator.prepare`) exactly as
the single-instance replay does, with one block manager and one evictor per instance: at an
arrival the router picks an instance, which looks up and allocates; at a completion that
instance frees with the turn's probability. The timeline is the trace's (open loop), so every
router and policy replays the same requests and a conversation's hits can be paired across
cells. With one instance the calls are those of `simulator.replay`, in the same order: the same
hit tokens, request by request (a test checks).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np

from lpc.blocks.block_manager import CacheCounters, PrefixCacheBlockManager
from lpc.errors import InvalidInputError
from lpc.fleet.routers import Arrival, Load, make_router
from lpc.replay.latency import TierLatency, summarise_ttft
from lpc.replay.policies import PolicySpec, build_evictor
from lpc.replay.simulator import (
    PreparedWorkload,
    RequestHits,
    num_blocks_for,
    request_curves,
    request_probabilities,
)
from lpc.workload import ARRIVAL


@dataclass(frozen=True)
class FleetCell:
    """One replay of the fleet grid."""

    router: str
    policy: PolicySpec
    instances: int
    cache_tokens: int  # per instance


@dataclass(frozen=True)
class FleetResult:
    router: str
    policy: str
    instances: int
    cache_tokens: int  # per instance
    requests: int
    queried_tokens: int
    hit_tokens: int
    hit_requests: int
    evictions: int
    allocation_failures: int
    # counted prompt tokens routed to each instance: the load a router spread
    instance_prompt_tokens: tuple[int, ...]
    instance_hit_tokens: tuple[int, ...]
    ttft_p50_s: float
    ttft_p90_s: float
    ttft_mean_s: float
    seconds: float  # wall-clock
    cpu_seconds: float  # this process's processor time: the cost, whatever else runs
    per_request: RequestHits | None = field(default=None, compare=False, repr=False)

    @property
    def token_hit_ratio(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0

    @property
    def load_imbalance(self) -> float:
        """The busiest instance's prompt tokens over the mean (1.0: perfectly even)."""
        loads = np.asarray(self.instance_prompt_tokens, dtype=np.float64)
        return float(loads.max() / loads.mean()) if loads.sum() else 1.0

    @property
    def load_cv(self) -> float:
        """Coefficient of variation of the instances' prompt tokens (0: perfectly even)."""
        loads = np.asarray(self.instance_prompt_tokens, dtype=np.float64)
        return float(loads.std() / loads.mean()) if loads.sum() else 0.0

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "per_request"}
        d["instance_prompt_tokens"] = list(self.instance_prompt_tokens)
        d["instance_hit_tokens"] = list(self.instance_hit_tokens)
        d["token_hit_ratio"] = self.token_hit_ratio
        d["load_imbalance"] = self.load_imbalance
        d["load_cv"] = self.load_cv
        return d


def check_cell(cell: FleetCell) -> None:
    if cell.instances < 1:
        raise InvalidInputError(f"a fleet needs at least one instance, got {cell.instances}")
    if cell.policy.evictor == "belady" and cell.instances > 1:
        raise InvalidInputError(
            "belady needs each instance's own future, which the router decides during the "
            "replay: run it with one instance"
        )


def fleet_replay(
    workload: PreparedWorkload,
    cell: FleetCell,
    scale_per_s: float = 1e-2,
    fallback_probability: float = 0.5,
    policy_options: Mapping[str, Any] | None = None,
    latency: TierLatency | None = None,
) -> FleetResult:
    """Replay `workload` on `cell.instances` instances behind `cell.router` (module doc)."""
    check_cell(cell)
    started, started_cpu = time.perf_counter(), time.process_time()
    spec, n = cell.policy, cell.instances
    num_blocks = num_blocks_for(cell.cache_tokens, workload.block_size)
    managers = [
        PrefixCacheBlockManager(
            num_blocks,
            workload.block_size,
            evictor=build_evictor(
                spec, num_blocks, scale_per_s, fallback_probability, workload.future, policy_options
            ),
        )
        for _ in range(n)
    ]
    router = make_router(cell.router)
    probabilities = request_probabilities(workload, spec)
    curves = request_curves(workload, spec)
    cache_requests = workload.cache_requests
    categories: Sequence[str | None] = workload.categories or [None] * len(cache_requests)
    first_counted = workload.first_counted
    counted = max(0, len(cache_requests) - first_counted)
    counted_hits = np.zeros(counted, dtype=np.int64)
    counted_instance = np.zeros(counted, dtype=np.int64)
    queued = [0] * n
    queued_requests = [0] * n
    load = Load(queued, queued_requests)  # views of the two lists, updated in place
    instance_of = np.zeros(len(cache_requests), dtype=np.int64)
    failed: set[int] = set()
    failures = 0
    baselines: list[CacheCounters] | None = None if first_counted else [CacheCounters()] * n
    block_size = workload.block_size
    for time_s, kind, i in workload.events:
        request = cache_requests[i]
        if kind == ARRIVAL:
            if baselines is None and i >= first_counted:
                baselines = [replace(m.counters) for m in managers]
            hashes = request.block_hashes
            assert hashes is not None, "a prepared workload carries every request's hashes"
            max_blocks = (request.num_prompt_tokens - 1) // block_size

            def cached(instance: int, hashes: Sequence = hashes, limit: int = max_blocks) -> int:
                manager = managers[instance]
                for depth, h in enumerate(hashes[:limit]):
                    if manager.cached_block(h) is None:
                        return depth
                return min(limit, len(hashes))

            tokens = len(request.token_ids)
            arrival = Arrival(i, request.conversation_id or "", tokens, max_blocks)
            target = router.route(arrival, load, cached)
            instance_of[i] = target
            queued[target] += tokens
            queued_requests[target] += 1
            manager = managers[target]
            prefix = manager.find_computed_prefix(request, request.block_hashes)
            allocation = manager.allocate(request, prefix, time_s)
            if i >= first_counted:
                counted_instance[i - first_counted] = target
            if allocation is None:
                failed.add(i)
                failures += i >= first_counted
                continue
            if i >= first_counted:
                counted_hits[i - first_counted] = allocation.num_hit_tokens
            continue
        target = int(instance_of[i])
        queued[target] -= len(request.token_ids)
        queued_requests[target] -= 1
        if i in failed:
            failed.discard(i)
            continue
        managers[target].free(
            request.request_id,
            time_s,
            probabilities[i],
            category=categories[i],
            return_curve=None if curves is None else curves[i],
        )
    if baselines is None:
        baselines = [replace(m.counters) for m in managers]
    prompt = np.fromiter(
        (r.num_prompt_tokens for r in cache_requests[first_counted:]), np.int64, counted
    )
    ttft = summarise_ttft(latency or TierLatency(), prompt, counted_hits, np.zeros(counted))
    return FleetResult(
        router=cell.router,
        policy=spec.label,
        instances=n,
        cache_tokens=cell.cache_tokens,
        requests=counted,
        queried_tokens=int(prompt.sum()),
        hit_tokens=int(counted_hits.sum()),
        hit_requests=int((counted_hits > 0).sum()),
        evictions=sum(
            m.counters.evictions - b.evictions for m, b in zip(managers, baselines, strict=True)
        ),
        allocation_failures=failures,
        instance_prompt_tokens=tuple(
            int(x) for x in np.bincount(counted_instance, weights=prompt, minlength=n)
        ),
        instance_hit_tokens=tuple(
            int(x) for x in np.bincount(counted_instance, weights=counted_hits, minlength=n)
        ),
        ttft_p50_s=ttft.p50_s,
        ttft_p90_s=ttft.p90_s,
        ttft_mean_s=ttft.mean_s,
        seconds=time.perf_counter() - started,
        cpu_seconds=time.process_time() - started_cpu,
        per_request=RequestHits(counted_hits, workload.counted_conversations),
    )
