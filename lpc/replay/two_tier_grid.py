"""Every two-tier policy pair without replaying the GPU tier once per pair.

The GPU tier never reads the CPU tier, so the grid replays it once per (GPU policy, GPU size)
into a `GpuTrace`, then only the CPU tier for every (CPU policy, CPU size) against that trace,
each CPU policy's sizes in one pass, in forked worker processes. The figures are those of
`two_tier.replay_two_tier` for the same pair, counter for counter.

Why this is exact, and the passes shared across GPU policies: docs/design.md, "Two tiers" and
"The grid's passes".
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass

from lpc.replay.ab import ReplayConstants
from lpc.replay.cache_policy_tier import policy_reads_loads
from lpc.replay.latency import TierLatency
from lpc.replay.policies import PolicySpec
from lpc.replay.return_sources import request_curves
from lpc.replay.simulator import PreparedWorkload, request_probabilities
from lpc.replay.two_tier import (
    TierSettings,
    TwoTierResult,
    cpu_policy_class,
    gpu_tier,
    host_tier,
    measured_result,
)
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
    workload: PreparedWorkload, spec: PolicySpec, cache_tokens: int, settings: ReplayConstants
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
    settings: ReplayConstants,
    store_threshold: int = 0,
    latency: TierLatency | None = None,
) -> list[TwoTierResult]:
    """The CPU half of `replay_two_tier` against a recorded GPU replay, every CPU size of one
    CPU policy in one pass over the events; one result per size, in the given order. Each
    result's `seconds` is the pass's wall time shared evenly among its sizes."""
    (results,) = replay_host_tier_for(
        workload,
        [gpu_trace],
        offload_spec,
        offload_sizes_tokens,
        settings,
        store_threshold,
        latency,
    )
    return results


def shares_host_pass(offload_spec: PolicySpec) -> bool:
    """Whether one CPU-tier pass of `offload_spec` serves every GPU replay that failed the
    same requests (`replay_host_tier_for`): its tier does not read its loads."""
    return not policy_reads_loads(cpu_policy_class(offload_spec))


def failed_requests(gpu_trace: GpuTrace) -> tuple[int, ...]:
    """The requests the GPU pool could not hold, which skip the CPU tier too."""
    return tuple(i for i, blocks in enumerate(gpu_trace.device_blocks) if blocks == FAILED)


def replay_host_tier_for(
    workload: PreparedWorkload,
    gpu_traces: Sequence[GpuTrace],
    offload_spec: PolicySpec,
    offload_sizes_tokens: Sequence[int],
    settings: ReplayConstants,
    store_threshold: int = 0,
    latency: TierLatency | None = None,
) -> list[list[TwoTierResult]]:
    """`replay_host_tier` for several GPU replays in one pass, one list of results per
    replay, in the given order.

    Under `HostTier`'s rules (`shares_host_pass`) the CPU tier's state never depends on the
    GPU tier's hits: every request offers its whole prompt, and its load records nothing its
    offer does not. So what the tier holds at each event is the same behind any GPU policy
    whose pool held the same requests; only the lookups differ, and a lookup reads the tier
    without changing it. One pass then keeps one tier per CPU size and looks each request up
    once per GPU replay, from that replay's GPU hit. (A tier that reads its loads, the
    policies run in their vLLM class, takes one replay per pass.) Each result's `seconds` is
    the pass's wall time shared evenly among its results."""
    started = time.perf_counter()
    if not gpu_traces:
        return []
    shared = len(gpu_traces) > 1
    reads_loads = not shares_host_pass(offload_spec)
    if shared and reads_loads:
        raise ValueError(f"the CPU policy {offload_spec.label} reads its loads: one GPU replay")
    if shared and len({failed_requests(trace) for trace in gpu_traces}) > 1:
        raise ValueError("GPU replays that failed different requests cannot share a pass")
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
    lookups = [trace.lookup_blocks for trace in gpu_traces]
    # the traces agree on which requests failed; the first one's device hits say which
    device_of = gpu_traces[0].device_blocks
    prompts: list[int] = []
    device_hits: list[list[int]] = [[] for _ in gpu_traces]
    host_hits: list[list[list[int]]] = [[[] for _ in hosts] for _ in gpu_traces]
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
                for t in range(len(gpu_traces)):
                    device_hits[t].append(0)
                    for hits in host_hits[t]:
                        hits.append(0)
            continue
        rid = request.request_id
        hashes = request.block_hashes
        assert hashes is not None, "a prepared workload carries every request's hashes"
        max_blocks = (num_prompt_tokens - 1) // block_size
        offered = hashes[: num_prompt_tokens // block_size]
        for k, host in enumerate(hosts):
            for t, lookup_of in enumerate(lookups):
                host_blocks = host.lookup(hashes, lookup_of[i], max_blocks)
                if counted:
                    host_hits[t][k].append(host_blocks * block_size)
            if reads_loads:  # one GPU replay (checked above)
                host.load(rid, hashes, device_blocks, host_blocks, time_s, request.conversation_id)
            counters = host.counters
            stored, evicted = counters.stored_chunks, counters.evictions
            host.offer(rid, offered, time_s, request.conversation_id)
            if counted:
                stores[k] += counters.stored_chunks - stored
                evictions[k] += counters.evictions - evicted
        if counted:
            prompts.append(num_prompt_tokens)
            for t, trace in enumerate(gpu_traces):
                device_hits[t].append(trace.device_blocks[i] * block_size)
    seconds = (time.perf_counter() - started) / max(1, len(hosts) * len(gpu_traces))
    return [
        [
            measured_result(
                workload,
                (trace.policy, offload_spec.label, trace.cache_tokens, offload_tokens),
                prompts,
                device_hits[t],
                host_hits[t][k],
                (stores[k], evictions[k], failures),
                latency,
                seconds,
            )
            for k, offload_tokens in enumerate(offload_sizes_tokens)
        ]
        for t, trace in enumerate(gpu_traces)
    ]


# Worker processes receive the workload once, through the pool initializer (inherited by
# fork, as in `lpc.replay.ab`); this module-level slot exists only inside those workers.
_worker_state: tuple[PreparedWorkload, ReplayConstants] | None = None


def _init_worker(workload: PreparedWorkload, settings: ReplayConstants) -> None:
    global _worker_state
    _worker_state = (workload, settings)


def _gpu_in_worker(spec: PolicySpec, cache_tokens: int) -> tuple[GpuTrace, float]:
    assert _worker_state is not None, "worker used before its initializer ran"
    workload, settings = _worker_state
    return _gpu_replay(workload, spec, cache_tokens, settings)


def _host_in_worker(
    gpu_traces: list[GpuTrace], offload_spec: PolicySpec, tiers: TierSettings
) -> tuple[list[list[TwoTierResult]], float]:
    assert _worker_state is not None, "worker used before its initializer ran"
    workload, settings = _worker_state
    return _host_pass(workload, gpu_traces, offload_spec, tiers, settings)


# A CPU-tier pass to run: the (GPU policy, GPU size, CPU policy) of each result list it
# gives, the GPU replays it reads (in that order), and the CPU policy.
_HostJob = tuple[list[tuple[int, int, int]], list[GpuTrace], PolicySpec]


def run_pair_grid(
    workload: PreparedWorkload,
    specs: Sequence[PolicySpec],
    cache_sizes_tokens: Sequence[int],
    tiers: TierSettings,
    settings: ReplayConstants,
    workers: int = 1,
    on_result: Callable[[TwoTierResult], None] | None = None,
) -> tuple[list[TwoTierResult], GridTiming]:
    """Every GPU policy × CPU policy × GPU size × CPU size, in that order (the order and
    figures of `two_tier.run_two_tier_grid`): one GPU replay per (GPU policy, GPU size); per
    CPU policy that reads its loads one CPU-tier pass per GPU replay, per other CPU policy one
    pass per GPU size and set of failed requests (`replay_host_tier_for`), in `workers`
    processes."""
    started = time.perf_counter()
    gpu_jobs = [(g, s) for g in range(len(specs)) for s in range(len(cache_sizes_tokens))]
    traces: dict[tuple[int, int], GpuTrace] = {}
    passes: dict[tuple[int, int, int], list[TwoTierResult]] = {}
    gpu_cpu_s: list[float] = []
    host_cpu_s: list[float] = []
    offload_specs = tiers.offload_policies
    shared = [shares_host_pass(spec) for spec in offload_specs]

    def host_jobs(g: int, s: int) -> list[_HostJob]:
        """The passes GPU replay (g, s) makes possible: its own, of every CPU policy that
        reads its loads; and, once it is the last of its GPU size, one of every other CPU
        policy per group of that size's replays that failed the same requests."""
        jobs = [
            ([(g, s, c)], [traces[(g, s)]], spec)
            for c, spec in enumerate(offload_specs)
            if not shared[c]
        ]
        if any((other, s) not in traces for other in range(len(specs))):
            return jobs
        groups: dict[tuple[int, ...], list[int]] = {}
        for other in range(len(specs)):
            groups.setdefault(failed_requests(traces[(other, s)]), []).append(other)
        for c, spec in enumerate(offload_specs):
            if shared[c]:
                for members in groups.values():
                    keys = [(other, s, c) for other in members]
                    jobs.append((keys, [traces[(other, s)] for other in members], spec))
        return jobs

    def done(
        keys: list[tuple[int, int, int]], outcome: tuple[list[list[TwoTierResult]], float]
    ) -> None:
        per_trace, cpu_s = outcome
        host_cpu_s.append(cpu_s)
        for key, results in zip(keys, per_trace, strict=True):
            passes[key] = results
            if on_result is not None:
                for result in results:
                    on_result(result)

    serial = workers <= 1 or "fork" not in multiprocessing.get_all_start_methods()
    if serial:
        for g, s in gpu_jobs:
            traces[(g, s)], cpu_s = _gpu_replay(workload, specs[g], cache_sizes_tokens[s], settings)
            gpu_cpu_s.append(cpu_s)
            for keys, gpu_traces, offload_spec in host_jobs(g, s):
                done(keys, _host_pass(workload, gpu_traces, offload_spec, tiers, settings))
    else:
        with ProcessPoolExecutor(
            max_workers=workers,
            mp_context=multiprocessing.get_context("fork"),
            initializer=_init_worker,
            initargs=(workload, settings),
        ) as pool:
            gpu_pending: dict[Future, tuple[int, int]] = {
                pool.submit(_gpu_in_worker, specs[g], cache_sizes_tokens[s]): (g, s)
                for g, s in gpu_jobs
            }
            host_pending: dict[Future, list[tuple[int, int, int]]] = {}
            while gpu_pending or host_pending:
                finished, _ = wait([*gpu_pending, *host_pending], return_when=FIRST_COMPLETED)
                for future in finished:
                    if future in gpu_pending:  # a GPU replay: its CPU-tier passes can start
                        g, s = gpu_pending.pop(future)
                        traces[(g, s)], cpu_s = future.result()
                        gpu_cpu_s.append(cpu_s)
                        for keys, gpu_traces, offload_spec in host_jobs(g, s):
                            host = pool.submit(_host_in_worker, gpu_traces, offload_spec, tiers)
                            host_pending[host] = keys
                    else:
                        done(host_pending.pop(future), future.result())
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
        host_passes=len(host_cpu_s),
        host_replay_cpu_s=sum(host_cpu_s),
        workers=1 if serial else workers,
    )
    return results, timing


def _gpu_replay(
    workload: PreparedWorkload, spec: PolicySpec, cache_tokens: int, settings: ReplayConstants
) -> tuple[GpuTrace, float]:
    """A GPU replay and the processor seconds it took."""
    started = time.process_time()
    trace = replay_gpu_tier(workload, spec, cache_tokens, settings)
    return trace, time.process_time() - started


def _host_pass(
    workload: PreparedWorkload,
    gpu_traces: list[GpuTrace],
    offload_spec: PolicySpec,
    tiers: TierSettings,
    settings: ReplayConstants,
) -> tuple[list[list[TwoTierResult]], float]:
    """A CPU-tier pass (every CPU size, every GPU replay given) and the processor seconds it
    took."""
    started = time.process_time()
    results = replay_host_tier_for(
        workload,
        gpu_traces,
        offload_spec,
        tiers.offload_sizes_tokens,
        settings,
        tiers.store_threshold,
        tiers.latency,
    )
    return results, time.process_time() - started
