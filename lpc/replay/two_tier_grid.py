"""Every two-tier policy pair without replaying the GPU tier once per pair.

In `two_tier.replay_two_tier` the GPU tier never reads the CPU tier: the block manager sees
only the request's hashes, its allocation and its free (a block loaded from the CPU is cached
on the GPU exactly like a recomputed one). What the CPU tier reads of the GPU tier (per
arrival, the GPU lookup's hit it continues, the hit after allocation, and whether the
allocation failed; per completion, whether the request was held at all) therefore depends
only on the GPU policy and size. So the grid replays the GPU tier once per (GPU policy, GPU
size) into a `GpuTrace`, then only the CPU tier for every (CPU policy, CPU size) against that
trace, each CPU policy's sizes in one pass over the events. The figures are those of
`replay_two_tier` for the same pair, counter for counter (tests/lpc/test_two_tier_grid.py
checks it); that function stays the reference, and the one `per_request` comes from.

The replays are independent once their GPU trace exists, so they run in forked worker
processes, as the single-tier grid's do (`lpc.replay.ab`): the prepared workload is inherited,
only the GPU traces (two ints per request) and the results travel through pipes.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass

from lpc.replay.ab import ReplaySettings
from lpc.replay.latency import TierLatency, summarise_ttft
from lpc.replay.policies import PolicySpec
from lpc.replay.return_sources import request_curves
from lpc.replay.simulator import PreparedWorkload, request_probabilities
from lpc.replay.two_tier import TierSettings, TwoTierRequestHits, TwoTierResult, gpu_tier, host_tier
from lpc.workload import ARRIVAL

FAILED = -1  # `GpuTrace.device_blocks` of a request the GPU pool could not hold


@dataclass(frozen=True)
class GpuTrace:
    """What the CPU tier sees of one GPU replay, one entry per request index: the GPU
    lookup's hit in blocks (where the CPU lookup starts) and the hit after allocation
    (`FAILED` when the pool could not hold the request: it then skips both tiers)."""

    policy: str
    cache_tokens: int
    lookup_blocks: list[int]
    device_blocks: list[int]


@dataclass(frozen=True)
class GridTiming:
    """Where a two-tier grid's time went: its wall time, and the processor seconds (process
    time, which other jobs on the machine do not inflate) of its GPU replays and of its
    CPU-tier passes, all workers together: their sum is what one idle core would take."""

    wall_s: float
    gpu_replays: int
    gpu_replay_cpu_s: float
    host_passes: int
    host_replay_cpu_s: float
    workers: int


def replay_gpu_tier(
    workload: PreparedWorkload, spec: PolicySpec, cache_tokens: int, settings: ReplaySettings
) -> GpuTrace:
    """The GPU half of `replay_two_tier`: the same block manager, calls and order."""
    block_size = workload.block_size
    gpu = gpu_tier(workload, spec, cache_tokens, settings)
    categories = workload.categories
    gpu_p = request_probabilities(workload, spec)
    gpu_curves = request_curves(workload.curves, spec, len(workload.requests))
    n = len(workload.cache_requests)
    lookup_blocks = [0] * n
    device_blocks = [0] * n
    cache_requests = workload.cache_requests
    for time_s, kind, i in workload.events:
        request = cache_requests[i]
        if kind != ARRIVAL:
            if device_blocks[i] != FAILED:
                category = None if categories is None else categories[i]
                gpu.free(
                    request.request_id,
                    time_s,
                    gpu_p[i],
                    category=category,
                    return_curve=gpu_curves[i],
                )
            continue
        hashes = request.block_hashes
        assert hashes is not None, "a prepared workload carries every request's hashes"
        prefix = gpu.find_computed_prefix(request, hashes)
        lookup_blocks[i] = len(prefix.block_ids)
        allocation = gpu.allocate(request, prefix, time_s)
        device_blocks[i] = FAILED if allocation is None else allocation.num_hit_tokens // block_size
    return GpuTrace(spec.label, cache_tokens, lookup_blocks, device_blocks)


def replay_host_tier(
    workload: PreparedWorkload,
    gpu_trace: GpuTrace,
    offload_spec: PolicySpec,
    offload_sizes_tokens: Sequence[int],
    settings: ReplaySettings,
    store_threshold: int = 0,
    latency: TierLatency | None = None,
) -> list[TwoTierResult]:
    """The CPU half of `replay_two_tier` against a recorded GPU replay, every CPU size of one
    CPU policy in one pass over the events; one result per size, in the given order. Each
    result's `seconds` is the pass's wall time shared evenly among its sizes."""
    started = time.perf_counter()
    latency = latency or TierLatency()
    block_size = workload.block_size
    hosts = [
        host_tier(workload, offload_spec, offload_tokens, settings, store_threshold)
        for offload_tokens in offload_sizes_tokens
    ]
    categories = workload.categories
    host_p = request_probabilities(workload, offload_spec)
    host_curves = request_curves(workload.curves, offload_spec, len(workload.requests))
    first_counted = workload.first_counted
    cache_requests = workload.cache_requests
    lookup_of, device_of = gpu_trace.lookup_blocks, gpu_trace.device_blocks
    prompts: list[int] = []
    device_hits: list[int] = []
    host_hits: list[list[int]] = [[] for _ in hosts]
    stores = [0] * len(hosts)
    evictions = [0] * len(hosts)
    failures = 0
    for time_s, kind, i in workload.events:
        request = cache_requests[i]
        device_blocks = device_of[i]
        if kind != ARRIVAL:
            if device_blocks != FAILED:
                rid = request.request_id
                category = None if categories is None else categories[i]
                conversation = request.conversation_id or rid
                p, curve = host_p[i], host_curves[i]
                for host in hosts:
                    host.finish(rid, time_s, p, conversation, category, curve)
            continue
        counted = i >= first_counted
        num_prompt_tokens = request.num_prompt_tokens
        if device_blocks == FAILED:
            if counted:
                failures += 1
                prompts.append(num_prompt_tokens)
                device_hits.append(0)
                for hits in host_hits:
                    hits.append(0)
            continue
        rid = request.request_id
        hashes = request.block_hashes
        assert hashes is not None, "a prepared workload carries every request's hashes"
        max_blocks = (num_prompt_tokens - 1) // block_size
        lookup_blocks = lookup_of[i]
        offered = hashes[: num_prompt_tokens // block_size]
        for k, host in enumerate(hosts):
            host_blocks = host.lookup(hashes, lookup_blocks, max_blocks)
            host.load(rid, hashes, device_blocks, host_blocks, time_s, request.conversation_id)
            counters = host.counters
            stored, evicted = counters.stored_chunks, counters.evictions
            host.offer(rid, offered, time_s, request.conversation_id)
            if counted:
                stores[k] += counters.stored_chunks - stored
                evictions[k] += counters.evictions - evicted
                host_hits[k].append(host_blocks * block_size)
        if counted:
            prompts.append(num_prompt_tokens)
            device_hits.append(device_blocks * block_size)
    seconds = (time.perf_counter() - started) / max(1, len(hosts))
    results = []
    for k, offload_tokens in enumerate(offload_sizes_tokens):
        ttft = summarise_ttft(latency, prompts, device_hits, host_hits[k])
        results.append(
            TwoTierResult(
                policy=gpu_trace.policy,
                offload_policy=offload_spec.label,
                cache_tokens=gpu_trace.cache_tokens,
                offload_tokens=offload_tokens,
                requests=len(prompts),
                queried_tokens=sum(prompts),
                device_hit_tokens=sum(device_hits),
                host_hit_tokens=sum(host_hits[k]),
                host_stored_chunks=stores[k],
                host_evictions=evictions[k],
                allocation_failures=failures,
                ttft_p50_s=ttft.p50_s,
                ttft_p90_s=ttft.p90_s,
                ttft_mean_s=ttft.mean_s,
                prefill_gpu_s_saved=ttft.prefill_gpu_s_saved,
                load_s=ttft.load_s,
                seconds=seconds,
                request_hits=TwoTierRequestHits.of(workload, prompts, device_hits, host_hits[k]),
            )
        )
    return results


# Worker processes receive the workload once, through the pool initializer (inherited by
# fork, as in `lpc.replay.ab`); this module-level slot exists only inside those workers.
_worker_state: tuple[PreparedWorkload, ReplaySettings] | None = None


def _init_worker(workload: PreparedWorkload, settings: ReplaySettings) -> None:
    global _worker_state
    _worker_state = (workload, settings)


def _gpu_in_worker(spec: PolicySpec, cache_tokens: int) -> tuple[GpuTrace, float]:
    assert _worker_state is not None, "worker used before its initializer ran"
    workload, settings = _worker_state
    return _gpu_replay(workload, spec, cache_tokens, settings)


def _host_in_worker(
    gpu_trace: GpuTrace, offload_spec: PolicySpec, tiers: TierSettings
) -> tuple[list[TwoTierResult], float]:
    assert _worker_state is not None, "worker used before its initializer ran"
    workload, settings = _worker_state
    return _host_pass(workload, gpu_trace, offload_spec, tiers, settings)


def run_pair_grid(
    workload: PreparedWorkload,
    specs: Sequence[PolicySpec],
    cache_sizes_tokens: Sequence[int],
    tiers: TierSettings,
    settings: ReplaySettings,
    workers: int = 1,
    on_result: Callable[[TwoTierResult], None] | None = None,
) -> tuple[list[TwoTierResult], GridTiming]:
    """Every GPU policy × CPU policy × GPU size × CPU size, in that order (the order and
    figures of `two_tier.run_two_tier_grid`): one GPU replay per (GPU policy, GPU size), one
    CPU-tier pass per (GPU replay, CPU policy), in `workers` processes."""
    started = time.perf_counter()
    gpu_jobs = [(g, s) for g in range(len(specs)) for s in range(len(cache_sizes_tokens))]
    passes: dict[tuple[int, int, int], list[TwoTierResult]] = {}
    gpu_cpu_s: list[float] = []
    host_cpu_s: list[float] = []

    def done(key: tuple[int, int, int], outcome: tuple[list[TwoTierResult], float]) -> None:
        passes[key], cpu_s = outcome
        host_cpu_s.append(cpu_s)
        if on_result is not None:
            for result in passes[key]:
                on_result(result)

    offload_specs = tiers.offload_policies
    serial = workers <= 1 or "fork" not in multiprocessing.get_all_start_methods()
    if serial:
        for g, s in gpu_jobs:
            trace, cpu_s = _gpu_replay(workload, specs[g], cache_sizes_tokens[s], settings)
            gpu_cpu_s.append(cpu_s)
            for c, offload_spec in enumerate(offload_specs):
                done((g, s, c), _host_pass(workload, trace, offload_spec, tiers, settings))
    else:
        with ProcessPoolExecutor(
            max_workers=workers,
            mp_context=multiprocessing.get_context("fork"),
            initializer=_init_worker,
            initargs=(workload, settings),
        ) as pool:
            pending: dict[Future, tuple[int, ...]] = {
                pool.submit(_gpu_in_worker, specs[g], cache_sizes_tokens[s]): (g, s)
                for g, s in gpu_jobs
            }
            while pending:
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in finished:
                    key = pending.pop(future)
                    if len(key) == 2:  # a GPU replay: its CPU-tier passes can start
                        trace, cpu_s = future.result()
                        gpu_cpu_s.append(cpu_s)
                        for c, offload_spec in enumerate(offload_specs):
                            host = pool.submit(_host_in_worker, trace, offload_spec, tiers)
                            pending[host] = (*key, c)
                    else:
                        done(key, future.result())  # type: ignore[arg-type]
    results = [
        result
        for g in range(len(specs))
        for c in range(len(offload_specs))
        for s in range(len(cache_sizes_tokens))
        for result in passes[(g, s, c)]
    ]
    timing = GridTiming(
        wall_s=time.perf_counter() - started,
        gpu_replays=len(gpu_cpu_s),
        gpu_replay_cpu_s=sum(gpu_cpu_s),
        host_passes=len(passes),
        host_replay_cpu_s=sum(host_cpu_s),
        workers=1 if serial else workers,
    )
    return results, timing


def _gpu_replay(
    workload: PreparedWorkload, spec: PolicySpec, cache_tokens: int, settings: ReplaySettings
) -> tuple[GpuTrace, float]:
    """A GPU replay and the processor seconds it took."""
    started = time.process_time()
    trace = replay_gpu_tier(workload, spec, cache_tokens, settings)
    return trace, time.process_time() - started


def _host_pass(
    workload: PreparedWorkload,
    trace: GpuTrace,
    offload_spec: PolicySpec,
    tiers: TierSettings,
    settings: ReplaySettings,
) -> tuple[list[TwoTierResult], float]:
    """A CPU-tier pass (every CPU size) and the processor seconds it took."""
    started = time.process_time()
    results = replay_host_tier(
        workload,
        trace,
        offload_spec,
        tiers.offload_sizes_tokens,
        settings,
        tiers.store_threshold,
        tiers.latency,
    )
    return results, time.process_time() - started
