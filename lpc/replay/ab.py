"""The A/B grid: every policy at every cache size on one prepared workload, and comparisons.

Replays are independent, so they run in worker processes (forked: the prepared workload is
inherited, not copied through pipes). The comparisons are the paper's: relative gain over
LRU, the share of the LRU→oracle (and LRU→Belady) gap closed, and the cache size each policy
needs to match LRU's hit ratio, read off its measured curve by linear interpolation.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from lpc.replay.intervals import paired_gain_interval
from lpc.replay.policies import PolicySpec
from lpc.replay.simulator import PreparedWorkload, ReplayResult, RequestHits, replay

DEFAULT_CACHE_SIZES_TOKENS = (60_000, 80_000, 100_000, 120_000, 140_000, 160_000)
# Production traces hold far more tokens. On the bundled Mooncake trace (block size 512) these
# take LRU from 10.9 % to 35.4 % on the evaluation half. Each is at least twice the peak
# in-flight tokens (1.21M with the default latency model), which rules out the ~1M where LRU
# would be at 5 %.
TRACE_CACHE_SIZES_TOKENS = (2_500_000, 4_000_000, 6_000_000, 8_000_000, 12_000_000, 16_000_000)


@dataclass(frozen=True)
class ReplayConstants:
    """What every replay of one workload shares once resolved: LPC's decay scale and fallback
    p (the flags', or fitted), and the fitted policies' constants."""

    scale_per_s: float = 1e-2
    fallback_probability: float = 0.5
    # evictor name -> the constants its training-part fit gave (`lpc.replay.fitted_policies`)
    policy_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def replay_one(
        self, workload: PreparedWorkload, spec: PolicySpec, cache_tokens: int
    ) -> ReplayResult:
        return replay(
            workload,
            spec,
            cache_tokens,
            self.scale_per_s,
            self.fallback_probability,
            policy_options=self.policy_options.get(spec.evictor),
        )


# Worker processes receive the workload once, through the pool initializer (inherited by
# fork); this module-level slot exists only inside those workers.
_worker_state: tuple[PreparedWorkload, ReplayConstants] | None = None


def _init_worker(workload: PreparedWorkload, settings: ReplayConstants) -> None:
    global _worker_state
    _worker_state = (workload, settings)


def _replay_in_worker(spec: PolicySpec, cache_tokens: int) -> ReplayResult:
    assert _worker_state is not None, "worker used before its initializer ran"
    workload, settings = _worker_state
    return settings.replay_one(workload, spec, cache_tokens)


def default_workers() -> int:
    return max(1, min(4, os.cpu_count() or 1))


def run_grid(
    workload: PreparedWorkload,
    specs: Sequence[PolicySpec],
    cache_sizes_tokens: Sequence[int],
    settings: ReplayConstants,
    workers: int = 1,
    on_result: Callable[[ReplayResult], None] | None = None,
) -> list[ReplayResult]:
    """All (policy, size) replays, in policy-then-size order."""
    jobs = [(spec, size) for spec in specs for size in cache_sizes_tokens]
    results: dict[tuple[str, int], ReplayResult] = {}
    if workers <= 1 or len(jobs) == 1 or "fork" not in multiprocessing.get_all_start_methods():
        for spec, size in jobs:
            result = settings.replay_one(workload, spec, size)
            results[(spec.label, size)] = result
            if on_result:
                on_result(result)
    else:
        context = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(
            max_workers=workers,
            mp_context=context,
            initializer=_init_worker,
            initargs=(workload, settings),
        ) as pool:
            futures = [pool.submit(_replay_in_worker, spec, size) for spec, size in jobs]
            for future in futures:
                result = future.result()
                results[(result.policy, result.cache_tokens)] = result
                if on_result:
                    on_result(result)
    return [results[(spec.label, size)] for spec, size in jobs]


@dataclass
class Comparison:
    """Per policy and cache size: hit ratio and how it compares with LRU and the oracle."""

    sizes: list[int]
    hit_ratio: dict[str, dict[int, float]]
    gain_over_lru: dict[str, dict[int, float | None]] = field(default_factory=dict)
    gap_closed: dict[str, dict[int, float | None]] = field(default_factory=dict)
    gap_closed_belady: dict[str, dict[int, float | None]] = field(default_factory=dict)
    # tokens a policy needs to match LRU's hit ratio at each size; None when it never does
    size_for_lru_ratio: dict[str, dict[int, float | None]] = field(default_factory=dict)
    # the gain's 95 % interval, [low, high] (paired bootstrap over conversations,
    # `lpc.replay.intervals`); None where the replay kept no per-request hits (closed loop)
    gain_over_lru_ci95: dict[str, dict[int, list[float] | None]] = field(default_factory=dict)

    def cache_saving(self, policy: str, size: int) -> float | None:
        needed = self.size_for_lru_ratio.get(policy, {}).get(size)
        return None if needed is None else 1.0 - needed / size


def size_to_reach(sizes: Sequence[int], ratios: Sequence[float], target: float) -> float | None:
    """The smallest cache size at which a measured (piecewise linear) curve reaches `target`.

    Below the smallest measured size the curve is extended to the origin (an empty cache hits
    nothing), so a policy that beats the target everywhere still gets a size, not a bound.
    """
    points = [(0.0, 0.0), *zip(sizes, ratios, strict=True)]
    for (s0, r0), (s1, r1) in itertools.pairwise(points):
        if r1 >= target:
            if r1 == r0:
                return float(s1)
            return s0 + (s1 - s0) * max(0.0, target - r0) / (r1 - r0)
    return None


def _interval(ours: RequestHits | None, theirs: RequestHits | None) -> list[float] | None:
    if ours is None or theirs is None:
        return None
    interval = paired_gain_interval(ours, theirs)
    return None if interval is None else interval.to_list()


def compare(results: Sequence[ReplayResult], baseline: str = "lru") -> Comparison:
    sizes = sorted({r.cache_tokens for r in results})
    hit: dict[str, dict[int, float]] = {}
    per_request = {}
    for r in results:
        hit.setdefault(r.policy, {})[r.cache_tokens] = r.token_hit_ratio
        per_request[(r.policy, r.cache_tokens)] = r.per_request
    comparison = Comparison(sizes, hit)
    if baseline not in hit:
        return comparison
    base = hit[baseline]
    oracle = hit.get("oracle")
    belady = hit.get("belady")

    def share_of_gap(curve: dict[int, float], bound: dict[int, float]) -> dict[int, float | None]:
        return {
            s: ((curve[s] - base[s]) / (bound[s] - base[s]))
            if s in bound and bound[s] - base[s] > 1e-12
            else None
            for s in curve
        }

    for policy, curve in hit.items():
        comparison.gain_over_lru[policy] = {
            s: (curve[s] / base[s] - 1.0) if base.get(s) else None for s in curve
        }
        if policy != baseline:
            comparison.gain_over_lru_ci95[policy] = {
                s: _interval(per_request.get((policy, s)), per_request.get((baseline, s)))
                for s in curve
            }
        if oracle is not None:
            comparison.gap_closed[policy] = share_of_gap(curve, oracle)
        if belady is not None:
            comparison.gap_closed_belady[policy] = share_of_gap(curve, belady)
        own_sizes = sorted(curve)
        comparison.size_for_lru_ratio[policy] = {
            s: size_to_reach(own_sizes, [curve[x] for x in own_sizes], base[s]) for s in base
        }
    return comparison
