"""The free queue's share of vLLM's free and allocation paths: LPC's queue against vLLM's own.

Times, per request size, the three calls vLLM's `BlockPool` makes on its free queue for one
multi-turn request (`touch`, `alloc`, `free`) on real vLLM 0.33 `KVCacheBlock`s, vLLM's queue
and the plugin's interleaved request by request; `--switch` adds the kill switch, `--scan`
vLLM's lazy CPU offload walk and `--manager` vLLM's whole `KVCacheManager` calls
(`manager_bench`). Runs in vLLM's venv (`python -m lpc.benchmarks.queue_bench`, as
`lpc bench queue` calls it): it prints one JSON record on its last line.

What is timed and how: docs/design.md, "The queue benchmark"; the figures: docs/serving.md,
"The free queue against vLLM's own (`lpc bench queue`)".
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

from eviction.base import Release
from eviction.lpc_pooled import DEFAULT_MEMORY, MEMORIES
from lpc.benchmarks.per_request import (
    BLOCK_SIZE,
    WARMUP_REQUESTS,
    Figure,
    compare_sides,
    figure_of,
)
from lpc.integrations.config import PluginConfig
from lpc.integrations.kill_switch import DEFAULT_MODE, MODES, ModeSwitch
from lpc.integrations.stats import PluginStats
from lpc.integrations.vllm_queue import QueueRuntime, bind_queue_class

DEFAULT_FREE_BLOCKS = 100_000
DEFAULT_SCAN_BLOCKS = 1_024  # vLLM's lazy target at max_num_batched_tokens 8192

DEFAULT_SIZES = (1_024, 11_264, 131_072)  # 1K, 11K, 128K tokens per request
OPERATIONS = ("touch", "alloc", "free")


@dataclass(frozen=True)
class SizeResult:
    tokens: int
    blocks_per_request: int
    requests: int
    stock: dict[str, Figure]
    lpc: dict[str, Figure]
    ratio_p50: dict[str, float]
    ratio_p99: dict[str, float]


class StepClock:
    """One second per request: the keys do not depend on the machine's speed."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def run_size(
    tokens: int,
    requests: int,
    evictor: str,
    seed: int = 0,
    mode: str = DEFAULT_MODE,
    pooled_memory: str = DEFAULT_MEMORY,
) -> SizeResult:
    """Both queues through the same `requests` requests of `tokens` tokens; the plugin's
    queue in `mode` (`lpc`, or `lru`/`shadow`: the kill switch thrown)."""
    from vllm.v1.core.kv_cache_utils import FreeKVCacheBlockQueue, KVCacheBlock

    n = tokens // BLOCK_SIZE
    hit = n // 2  # blocks each request hits: the first half of its previous turn
    num_blocks = 4 * n + 64
    clock = StepClock()
    runtime = QueueRuntime(
        PluginConfig(evictor=evictor, pooled_memory=pooled_memory, stats_log_interval_s=0.0),
        PluginStats(),
        clock,
        mode=ModeSwitch(mode),
    )
    sides: dict[str, dict[str, Any]] = {}
    for name in ("stock", "lpc"):
        pool = PoolStandIn()
        blocks = [KVCacheBlock(i, pool=pool) for i in range(num_blocks)]
        pool.free_block_queue = (
            FreeKVCacheBlockQueue(blocks)
            if name == "stock"
            else bind_queue_class(runtime, FreeKVCacheBlockQueue)(blocks)
        )
        sides[name] = {"pool": pool, "previous": None, "ns": {op: [] for op in OPERATIONS}}
    rng = random.Random(seed)
    for r in range(WARMUP_REQUESTS + requests):
        clock.now = float(r)
        release = Release(clock.now, rng.random(), "chat")  # the same conversation's turns
        hashes = [f"{r}-{i}".encode() for i in range(n)]
        order = ("stock", "lpc") if r % 2 else ("lpc", "stock")
        for name in order:
            side = sides[name]
            pool, previous, ns = side["pool"], side["previous"], side["ns"]
            touched = previous[:hit] if previous is not None else []
            t0 = time.thread_time_ns()
            for block in touched:  # BlockPool.touch: `self.free_block_queue.remove(block)`
                pool.free_block_queue.remove(block)
            t1 = time.thread_time_ns()
            fresh = pool.free_block_queue.popleft_n(n - len(touched))
            t2 = time.thread_time_ns()
            for i, block in enumerate(fresh):  # vLLM's pool: evicted content goes, new comes
                if block.block_hash is not None:
                    block.reset_hash()
                block.set_block_hash(hashes[i], (len(touched) + i + 1) * BLOCK_SIZE)
            chain = touched + fresh
            tail_first = chain[::-1]
            with runtime.releasing(release):
                t3 = time.thread_time_ns()
                pool.free_block_queue.append_n(tail_first)
                t4 = time.thread_time_ns()
            side["previous"] = chain
            if r >= WARMUP_REQUESTS:
                if touched:
                    ns["touch"].append(t1 - t0)
                ns["alloc"].append(t2 - t1)
                ns["free"].append(t4 - t3)
    samples = {name: side["ns"] for name, side in sides.items()}
    figures, ratio_p50, ratio_p99 = compare_sides(samples, OPERATIONS)
    return SizeResult(
        tokens=tokens,
        blocks_per_request=n,
        requests=requests,
        stock=figures["stock"],
        lpc=figures["lpc"],
        ratio_p50=ratio_p50,
        ratio_p99=ratio_p99,
    )


class PoolStandIn:
    """What the queue sees of vLLM's `BlockPool`: the attribute that holds its free queue,
    which vLLM reads at every call and the kill switch may point at vLLM's own queue."""

    free_block_queue: Any = None


@dataclass(frozen=True)
class SwitchResult:
    """The kill switch at `free_blocks` free blocks, requests of `tokens` tokens (µs)."""

    tokens: int
    free_blocks: int
    switch_off_us: float  # the switch itself, on the thread that asks
    switch_on_us: float
    drain_allocations: int  # allocations until the learned blocks were gone
    drain_alloc: Figure  # those allocations, the plugin's queue
    drain_alloc_max_us: float
    stock_alloc: Figure  # vLLM's allocation of as many blocks from its own full queue
    ratio_p50: float
    first_alloc_after_on_us: float


@dataclass(frozen=True)
class ScanResult:
    """vLLM's lazy-offload walk of `scan_blocks` blocks after its cursor (µs per walk)."""

    tokens: int
    free_blocks: int
    scan_blocks: int
    walks: int
    stock: Figure
    lpc: Figure
    ratio_p50: float
    ratio_p99: float
    # A walk stops at `scan_blocks` or at the queue's end: vLLM's cursor sits near its
    # list's tail (new releases join behind it), LPC's new releases land anywhere in its
    # order, so the walks differ in length; per block visited they compare like for like.
    stock_blocks_per_walk: float  # medians over the walks
    lpc_blocks_per_walk: float
    stock_ns_per_block: float
    lpc_ns_per_block: float
    ratio_per_block: float


def _fill(pool: Any, runtime: QueueRuntime, free_blocks: int, n: int, rng: random.Random) -> None:
    """Release `free_blocks` cached blocks in requests of `n`, each under its own p."""
    for r in range(max(1, free_blocks // n)):
        queue = pool.free_block_queue
        chain = queue.popleft_n(n)
        for i, block in enumerate(chain):
            if block.block_hash is not None:
                block.reset_hash()
            block.set_block_hash(f"fill-{r}-{i}".encode(), (i + 1) * BLOCK_SIZE)
        with runtime.releasing(Release(float(r), rng.random(), f"c{r}")):
            queue.append_n(chain[::-1])


def run_switch(
    tokens: int, evictor: str, free_blocks: int, seed: int = 0, pooled_memory: str = DEFAULT_MEMORY
) -> SwitchResult:
    """Switch off with `free_blocks` learned blocks, allocate requests of `tokens` tokens
    until they are drained (each allocation timed, and vLLM's own allocation of as many
    blocks from its queue beside it), then switch back on with every block in vLLM's list."""
    from vllm.v1.core.kv_cache_utils import FreeKVCacheBlockQueue, KVCacheBlock

    n = tokens // BLOCK_SIZE
    num_blocks = free_blocks + n
    clock = StepClock()
    runtime = QueueRuntime(
        PluginConfig(evictor=evictor, pooled_memory=pooled_memory, stats_log_interval_s=0.0),
        PluginStats(),
        clock,
    )
    rng = random.Random(seed)
    pool = PoolStandIn()
    queue = bind_queue_class(runtime, FreeKVCacheBlockQueue)(
        [KVCacheBlock(i, pool=pool) for i in range(num_blocks)]
    )
    pool.free_block_queue = queue
    stock = FreeKVCacheBlockQueue([KVCacheBlock(i) for i in range(num_blocks)])
    _fill(pool, runtime, free_blocks, n, rng)
    t0 = time.thread_time_ns()
    runtime.mode.set("lru", "queue bench")
    switch_off_ns = time.thread_time_ns() - t0
    drain_ns: list[int] = []
    stock_ns: list[int] = []
    taken: list[Any] = []
    while len(queue.evictor) and queue.num_free_blocks >= n:
        t0 = time.thread_time_ns()
        taken += pool.free_block_queue.popleft_n(n)
        t1 = time.thread_time_ns()
        allocated = stock.popleft_n(n)  # vLLM's allocation of as many blocks
        t2 = time.thread_time_ns()
        stock.append_n(allocated)  # untimed: keeps vLLM's queue full
        drain_ns.append(t1 - t0)
        stock_ns.append(t2 - t1)
    for start in range(0, len(taken), n):  # freed while off: into vLLM's list
        pool.free_block_queue.append_n(taken[start : start + n][::-1])
    t0 = time.thread_time_ns()
    runtime.mode.set("lpc", "queue bench")
    switch_on_ns = time.thread_time_ns() - t0
    t0 = time.thread_time_ns()
    pool.free_block_queue.popleft_n(n)
    first_on_ns = time.thread_time_ns() - t0
    drain, stock_figure = figure_of(drain_ns), figure_of(stock_ns)
    return SwitchResult(
        tokens=tokens,
        free_blocks=free_blocks,
        switch_off_us=switch_off_ns / 1e3,
        switch_on_us=switch_on_ns / 1e3,
        drain_allocations=len(drain_ns),
        drain_alloc=drain,
        drain_alloc_max_us=max(drain_ns) / 1e3,
        stock_alloc=stock_figure,
        ratio_p50=drain.p50_us / stock_figure.p50_us,
        first_alloc_after_on_us=first_on_ns / 1e3,
    )


def run_scan(
    tokens: int,
    evictor: str,
    free_blocks: int,
    scan_blocks: int,
    walks: int,
    seed: int = 0,
    pooled_memory: str = DEFAULT_MEMORY,
) -> ScanResult:
    """Both queues hold `free_blocks` cached blocks; each step walks `scan_blocks` blocks
    after the cursor as vLLM's lazy offload does (`SimpleCPUOffloadScheduler`: from the last
    block it visited; from the front when that block was allocated since, or at the end),
    then allocates and frees one request of `tokens` tokens."""
    from vllm.v1.core.kv_cache_utils import FreeKVCacheBlockQueue, KVCacheBlock

    n = tokens // BLOCK_SIZE
    num_blocks = free_blocks + n
    clock = StepClock()
    runtime = QueueRuntime(
        PluginConfig(evictor=evictor, pooled_memory=pooled_memory, stats_log_interval_s=0.0),
        PluginStats(),
        clock,
    )
    sides: dict[str, dict[str, Any]] = {}
    for name in ("stock", "lpc"):
        rng = random.Random(seed)
        pool = PoolStandIn()
        blocks = [KVCacheBlock(i, pool=pool) for i in range(num_blocks)]
        pool.free_block_queue = (
            FreeKVCacheBlockQueue(blocks)
            if name == "stock"
            else bind_queue_class(runtime, FreeKVCacheBlockQueue)(blocks)
        )
        _fill(pool, runtime, free_blocks, n, rng)
        sides[name] = {"pool": pool, "cursor": None, "ns": [], "visited": []}
    rng = random.Random(seed + 1)
    for step in range(walks):
        release = Release(float(10_000 + step), rng.random(), f"w{step}")
        for name in ("stock", "lpc") if step % 2 else ("lpc", "stock"):
            side = sides[name]
            queue, cursor = side["pool"].free_block_queue, side["cursor"]
            last = cursor
            covered = 0
            t0 = time.thread_time_ns()
            for covered, block in enumerate(queue.iter_blocks_after(cursor)):
                if covered >= scan_blocks:
                    break
                last = block
            t1 = time.thread_time_ns()
            side["ns"].append(t1 - t0)
            side["visited"].append(covered + 1)
            chain = queue.popleft_n(n)
            side["cursor"] = None if last is cursor or any(b is last for b in chain) else last
            for i, block in enumerate(chain):
                if block.block_hash is not None:
                    block.reset_hash()
                block.set_block_hash(f"walk-{step}-{i}".encode(), (i + 1) * BLOCK_SIZE)
            with runtime.releasing(release):
                queue.append_n(chain[::-1])
    stock, lpc = figure_of(sides["stock"]["ns"]), figure_of(sides["lpc"]["ns"])
    per_block = {  # the median walk's ns per block visited
        name: statistics.median(ns / v for ns, v in zip(side["ns"], side["visited"], strict=True))
        for name, side in sides.items()
    }
    return ScanResult(
        tokens=tokens,
        free_blocks=free_blocks,
        scan_blocks=scan_blocks,
        walks=walks,
        stock=stock,
        lpc=lpc,
        ratio_p50=lpc.p50_us / stock.p50_us,
        ratio_p99=lpc.p99_us / stock.p99_us,
        stock_blocks_per_walk=statistics.median(sides["stock"]["visited"]),
        lpc_blocks_per_walk=statistics.median(sides["lpc"]["visited"]),
        stock_ns_per_block=per_block["stock"],
        lpc_ns_per_block=per_block["lpc"],
        ratio_per_block=per_block["lpc"] / per_block["stock"],
    )


def requests_for(tokens: int, budget_blocks: int) -> int:
    """Requests per size: about `budget_blocks` blocks released, at least 20 requests."""
    return max(20, budget_blocks // max(1, tokens // BLOCK_SIZE))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)))
    parser.add_argument("--budget-blocks", type=int, default=400_000)
    parser.add_argument("--evictor", default="lpc-pooled")
    parser.add_argument("--pooled-memory", choices=MEMORIES, default=DEFAULT_MEMORY)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mode", choices=MODES, default=DEFAULT_MODE)
    parser.add_argument("--switch", action="store_true")
    parser.add_argument("--scan", action="store_true")
    parser.add_argument("--free-blocks", type=int, default=DEFAULT_FREE_BLOCKS)
    parser.add_argument("--scan-blocks", type=int, default=DEFAULT_SCAN_BLOCKS)
    parser.add_argument("--walks", type=int, default=200)
    parser.add_argument("--manager", action="store_true")
    args = parser.parse_args(argv)
    sizes = [int(part) for part in args.sizes.split(",") if part.strip()]
    results = []
    gc.collect()
    gc.disable()
    try:
        for tokens in sizes:
            requests = requests_for(tokens, args.budget_blocks)
            print(f"queue bench: {tokens:,} tokens, {requests} requests", file=sys.stderr)
            result = asdict(
                run_size(tokens, requests, args.evictor, args.seed, args.mode, args.pooled_memory)
            )
            gc.collect()
            if args.switch:
                print(
                    f"queue bench: the switch at {args.free_blocks:,} free blocks", file=sys.stderr
                )
                switch = run_switch(
                    tokens, args.evictor, args.free_blocks, args.seed, args.pooled_memory
                )
                result["switch"] = asdict(switch)
                gc.collect()
            if args.scan:
                print(f"queue bench: the offload walk, {args.walks} walks", file=sys.stderr)
                scan = run_scan(
                    tokens,
                    args.evictor,
                    args.free_blocks,
                    args.scan_blocks,
                    args.walks,
                    args.seed,
                    args.pooled_memory,
                )
                result["scan"] = asdict(scan)
                gc.collect()
            if args.manager:
                from lpc.benchmarks.manager_bench import run_manager

                print(f"queue bench: vLLM's KVCacheManager, {requests} requests", file=sys.stderr)
                result["manager"] = asdict(
                    run_manager(tokens, requests, args.evictor, args.pooled_memory)
                )
                gc.collect()
            results.append(result)
    finally:
        gc.enable()
    record = {
        "evictor": args.evictor,
        "pooled_memory": args.pooled_memory,
        "mode": args.mode,
        "block_size": BLOCK_SIZE,
        "free_blocks": args.free_blocks if args.switch or args.scan else None,
    }
    print(json.dumps({**record, "sizes": results}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
