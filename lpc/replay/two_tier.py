"""Replay a workload through two tiers: the GPU prefix cache and a CPU tier below it.

The GPU tier is the single-tier replay's block manager, unchanged, so its device hits equal
`simulator.replay`'s for the same policy and size; the CPU tier is
`cache_policy_tier.CachePolicyTier`. Per request at its arrival: the GPU lookup's hit, the CPU
lookup continuing from it (loaded into the GPU), the write-through offer of the prompt's full
blocks; at its completion, its finish with its predicted probability. This is the reference
the grid (`two_tier_grid`) is checked against.

The rules: docs/design.md, "Two tiers".
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields

import numpy as np

from eviction import make_evictor
from lpc.blocks.block_manager import PrefixCacheBlockManager
from lpc.integrations.cpu_tier_policy import EvictorCachePolicy, cache_policy_class
from lpc.replay.ab import ReplayConstants
from lpc.replay.cache_policy_tier import VLLM_POLICIES, CachePolicyTier, TierPolicy
from lpc.replay.host_tier import HostTierPolicy
from lpc.replay.latency import TierLatency, summarise_ttft
from lpc.replay.policies import PolicySpec, build_evictor, evictor_options
from lpc.replay.return_sources import request_curves
from lpc.replay.simulator import PreparedWorkload, num_blocks_for, request_probabilities
from lpc.workload import ARRIVAL


@dataclass(frozen=True)
class TwoTierRequestHits:
    """Per counted request, in arrival order: its prompt, device-hit and host-hit tokens and
    its conversation (codes of `PreparedWorkload.counted_conversations`). What the paired
    bootstrap of `two_tier_intervals` resamples; a request the GPU pool could not hold
    counts with no hit, as in the totals."""

    prompt_tokens: np.ndarray  # int64
    device_hit_tokens: np.ndarray  # int64
    host_hit_tokens: np.ndarray  # int64
    conversations: np.ndarray  # int64 codes

    @classmethod
    def of(
        cls,
        workload: PreparedWorkload,
        prompts: list[int],
        device_hits: list[int],
        host_hits: list[int],
    ) -> TwoTierRequestHits:
        conversations = workload.counted_conversations
        if len(conversations) != len(prompts):
            raise AssertionError(
                f"{len(prompts)} counted requests replayed, {len(conversations)} in the workload"
            )
        return cls(
            np.asarray(prompts, dtype=np.int64),
            np.asarray(device_hits, dtype=np.int64),
            np.asarray(host_hits, dtype=np.int64),
            conversations,
        )


@dataclass(frozen=True)
class TwoTierResult:
    """One (GPU policy, CPU policy, GPU size, CPU size) replay over the counted requests."""

    policy: str  # the GPU tier's
    offload_policy: str  # the CPU tier's
    cache_tokens: int
    offload_tokens: int
    requests: int
    queried_tokens: int
    device_hit_tokens: int
    host_hit_tokens: int
    host_stored_chunks: int
    host_evictions: int
    allocation_failures: int
    ttft_p50_s: float
    ttft_p90_s: float
    ttft_mean_s: float
    prefill_gpu_s_saved: float
    load_s: float
    seconds: float
    # Per-request hits, for intervals (`two_tier_intervals`). Not part of the figures: left
    # out of `to_dict` and of comparisons.
    request_hits: TwoTierRequestHits | None = field(default=None, compare=False, repr=False)

    @property
    def device_hit_ratio(self) -> float:
        return self.device_hit_tokens / self.queried_tokens if self.queried_tokens else 0.0

    @property
    def host_hit_ratio(self) -> float:
        return self.host_hit_tokens / self.queried_tokens if self.queried_tokens else 0.0

    @property
    def hit_ratio(self) -> float:
        """Hit in either tier."""
        return self.device_hit_ratio + self.host_hit_ratio

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "request_hits"}
        d["device_hit_ratio"] = self.device_hit_ratio
        d["host_hit_ratio"] = self.host_hit_ratio
        d["hit_ratio"] = self.hit_ratio
        return d


@dataclass(frozen=True, slots=True)
class RequestTiers:
    """Where one request's prompt was served: `device_blocks` from the GPU, then
    `host_blocks` from the CPU, out of `max_blocks` a hit may cover (for checks against vLLM)."""

    index: int
    device_blocks: int
    host_blocks: int
    max_blocks: int


@dataclass(frozen=True)
class TierSettings:
    """What `lpc ab --offload-sizes` adds: the CPU tier's sizes, policies and store threshold,
    and the latency model that turns hits into time."""

    offload_sizes_tokens: tuple[int, ...]
    offload_policies: tuple[PolicySpec, ...]
    store_threshold: int = 0
    latency: TierLatency = field(default_factory=TierLatency)


def gpu_tier(
    workload: PreparedWorkload, spec: PolicySpec, cache_tokens: int, settings: ReplayConstants
) -> PrefixCacheBlockManager:
    """The GPU tier: the single-tier replay's block manager, `spec`'s evictor."""
    num_blocks = num_blocks_for(cache_tokens, workload.block_size)
    evictor = build_evictor(
        spec,
        num_blocks,
        settings.scale_per_s,
        settings.fallback_probability,
        workload.future,
        settings.policy_options.get(spec.evictor),
    )
    return PrefixCacheBlockManager(num_blocks, workload.block_size, evictor=evictor)


def host_tier(
    workload: PreparedWorkload,
    offload_spec: PolicySpec,
    offload_tokens: int,
    settings: ReplayConstants,
    store_threshold: int = 0,
) -> CachePolicyTier:
    """The CPU tier of `offload_tokens` tokens, one chunk per GPU block, running
    `offload_spec`'s policy (`cpu_policy_class`): `lpc` and `lpc-pooled` inside their vLLM
    class (`LPCCachePolicy`, `LPCPooledCachePolicy`), `vllm-arc` as vLLM's `ARCCachePolicy`,
    every other evictor under the replay's release rules (`HostTierPolicy`, the evictor built
    for the chunks' slot ids 1..n, as the GPU pool's)."""
    num_chunks = num_blocks_for(offload_tokens, workload.block_size) - 1
    policy_class = cpu_policy_class(offload_spec)
    if offload_spec.cpu_tier_only:
        return CachePolicyTier.running_vllm(
            offload_spec.evictor, num_chunks, workload.block_size, store_threshold
        )
    options = evictor_options(
        offload_spec,
        settings.scale_per_s,
        settings.fallback_probability,
        workload.future,
        settings.policy_options.get(offload_spec.evictor),
    )
    if policy_class is HostTierPolicy:
        evictor = make_evictor(offload_spec.evictor, num_chunks + 1, **options)
        return CachePolicyTier.over_evictor(
            num_chunks, evictor, workload.block_size, store_threshold
        )
    assert issubclass(policy_class, EvictorCachePolicy)  # `cpu_policy_class`
    return CachePolicyTier.running(
        policy_class,
        num_chunks,
        offload_spec.evictor,
        options,
        workload.block_size,
        store_threshold,
    )


def cpu_policy_class(offload_spec: PolicySpec) -> type[TierPolicy]:
    """The `CachePolicy` class `host_tier`'s tier runs for `offload_spec`: vLLM's own for a
    CPU-tier-only name, LPC's vLLM class for an evictor one runs with provisional stores (its
    release rules are not the replay's), else `HostTierPolicy` (`LPCReturnCachePolicy`
    follows its rules)."""
    if offload_spec.cpu_tier_only:
        return VLLM_POLICIES[offload_spec.evictor]
    policy_class = cache_policy_class(offload_spec.evictor)
    if policy_class is not None and policy_class.provisional_stores:
        return policy_class
    return HostTierPolicy


def replay_two_tier(
    workload: PreparedWorkload,
    spec: PolicySpec,
    offload_spec: PolicySpec,
    cache_tokens: int,
    offload_tokens: int,
    settings: ReplayConstants,
    store_threshold: int = 0,
    latency: TierLatency | None = None,
    per_request: list[RequestTiers] | None = None,
) -> TwoTierResult:
    """One pair of policies at one GPU size and one CPU size (see the module). With
    `per_request`, every request the GPU pool held is appended to it in arrival order."""
    started = time.perf_counter()
    latency = latency or TierLatency()
    block_size = workload.block_size
    gpu = gpu_tier(workload, spec, cache_tokens, settings)
    host = host_tier(workload, offload_spec, offload_tokens, settings, store_threshold)
    categories = workload.categories
    gpu_p = request_probabilities(workload, spec)
    host_p = request_probabilities(workload, offload_spec)
    gpu_curves = request_curves(workload.curves, spec, len(workload.requests))
    host_curves = request_curves(workload.curves, offload_spec, len(workload.requests))
    first_counted = workload.first_counted
    prompts: list[int] = []
    device_hits: list[int] = []
    host_hits: list[int] = []
    failed: set[int] = set()
    failures = 0
    counted_stores = counted_evictions = 0
    for time_s, kind, i in workload.events:
        request = workload.cache_requests[i]
        rid = request.request_id
        if kind != ARRIVAL:
            if i in failed:
                failed.discard(i)
                continue
            category = None if categories is None else categories[i]
            gpu.free(rid, time_s, gpu_p[i], category=category, return_curve=gpu_curves[i])
            host.finish(
                rid, time_s, host_p[i], request.conversation_id or rid, category, host_curves[i]
            )
            continue
        hashes = request.block_hashes
        assert hashes is not None, "a prepared workload carries every request's hashes"
        prefix = gpu.find_computed_prefix(request, hashes)
        max_blocks = (request.num_prompt_tokens - 1) // block_size
        device_blocks = len(prefix.block_ids)
        host_blocks = host.lookup(hashes, device_blocks, max_blocks)
        allocation = gpu.allocate(request, prefix, time_s)
        counted = i >= first_counted
        if allocation is None:
            failed.add(i)
            failures += counted
            device_blocks = host_blocks = 0
        else:
            device_blocks = allocation.num_hit_tokens // block_size
            host.load(rid, hashes, device_blocks, host_blocks, time_s, request.conversation_id)
            before = (host.counters.stored_chunks, host.counters.evictions)
            prompt_blocks = request.num_prompt_tokens // block_size
            host.offer(rid, hashes[:prompt_blocks], time_s, request.conversation_id)
            if per_request is not None:
                per_request.append(RequestTiers(i, device_blocks, host_blocks, max_blocks))
            if counted:
                counted_stores += host.counters.stored_chunks - before[0]
                counted_evictions += host.counters.evictions - before[1]
        if counted:
            prompts.append(request.num_prompt_tokens)
            device_hits.append(device_blocks * block_size)
            host_hits.append(host_blocks * block_size)
    return measured_result(
        workload,
        (spec.label, offload_spec.label, cache_tokens, offload_tokens),
        prompts,
        device_hits,
        host_hits,
        (counted_stores, counted_evictions, failures),
        latency,
        time.perf_counter() - started,
    )


def measured_result(
    workload: PreparedWorkload,
    pair: tuple[str, str, int, int],
    prompts: list[int],
    device_hits: list[int],
    host_hits: list[int],
    counts: tuple[int, int, int],
    latency: TierLatency,
    seconds: float,
) -> TwoTierResult:
    """A pair's result from what its replay counted over the evaluation part: `pair` is
    (GPU policy, CPU policy, GPU tokens, CPU tokens), the lists hold each counted request's
    prompt, device-hit and host-hit tokens, `counts` the CPU tier's stored chunks and
    evictions and the requests the GPU pool could not hold."""
    policy, offload_policy, cache_tokens, offload_tokens = pair
    stores, evictions, failures = counts
    ttft = summarise_ttft(latency, prompts, device_hits, host_hits)
    return TwoTierResult(
        policy=policy,
        offload_policy=offload_policy,
        cache_tokens=cache_tokens,
        offload_tokens=offload_tokens,
        requests=len(prompts),
        queried_tokens=sum(prompts),
        device_hit_tokens=sum(device_hits),
        host_hit_tokens=sum(host_hits),
        host_stored_chunks=stores,
        host_evictions=evictions,
        allocation_failures=failures,
        ttft_p50_s=ttft.p50_s,
        ttft_p90_s=ttft.p90_s,
        ttft_mean_s=ttft.mean_s,
        prefill_gpu_s_saved=ttft.prefill_gpu_s_saved,
        load_s=ttft.load_s,
        seconds=seconds,
        request_hits=TwoTierRequestHits.of(workload, prompts, device_hits, host_hits),
    )


def run_two_tier_grid(
    workload: PreparedWorkload,
    specs: tuple[PolicySpec, ...],
    cache_sizes_tokens: tuple[int, ...],
    tiers: TierSettings,
    settings: ReplayConstants,
    on_result: Callable[[TwoTierResult], None] | None = None,
) -> list[TwoTierResult]:
    """Every GPU policy × CPU policy × GPU size × CPU size, one replay at a time, in that
    order: the reference for `two_tier_grid.run_pair_grid`, which `lpc ab` runs (the same
    results, the GPU tier replayed once per GPU policy and size)."""
    results = []
    for spec in specs:
        for offload_spec in tiers.offload_policies:
            for size in cache_sizes_tokens:
                for offload in tiers.offload_sizes_tokens:
                    result = replay_two_tier(
                        workload,
                        spec,
                        offload_spec,
                        size,
                        offload,
                        settings,
                        tiers.store_threshold,
                        tiers.latency,
                    )
                    results.append(result)
                    if on_result is not None:
                        on_result(result)
    return results
