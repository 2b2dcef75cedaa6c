"""The free queue's share of vLLM's free and allocation paths: LPC's queue against vLLM's own.

Times, per request size, the three calls vLLM's `BlockPool` makes on its free queue for one
multi-turn request, on real vLLM 0.33 `KVCacheBlock`s:
- `touch`: the `remove` of each block the request hits, the first half of its conversation's
  previous turn (every request is the next turn of one conversation, so no block is shared
  across conversations);
- `alloc`: `popleft_n` of the blocks it computes, evicting older cached ones;
- `free`: `append_n` of its whole chain, tail first, under the request's release (p and
  conversation, as the plugin sets them while vLLM frees).
vLLM's `FreeKVCacheBlockQueue` and the plugin's `LPCFreeBlockQueue` (its default evictor,
`lpc-pooled`) run the same requests in one process, interleaved request by request (which
queue goes first alternates), each on its own blocks; hashes are given and evicted blocks reset
untimed, as vLLM's block pool does around these calls. `--mode lru` (or `shadow`) times the
plugin with its kill switch thrown: the queue evicts in vLLM's LRU order while the learned
evictor still sees every release. The timer is the thread's CPU time
(`time.thread_time_ns`), so that other processes on a loaded machine do not count; the
garbage collector is off while timing. Each figure is the median and 99th percentile of the
per-request times, in microseconds, and their ratio to vLLM's.

Runs in vLLM's venv (`python -m lpc.benchmarks.queue_bench`, as `lpc bench queue` calls it):
it prints one JSON record on its last line.
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
from lpc.integrations.config import PluginConfig
from lpc.integrations.mode import DEFAULT_MODE, MODES, ModeSwitch
from lpc.integrations.stats import PluginStats
from lpc.integrations.vllm_queue import QueueRuntime, bind_queue_class

DEFAULT_SIZES = (1_024, 11_264, 131_072)  # 1K, 11K, 128K tokens per request
BLOCK_SIZE = 16
OPERATIONS = ("touch", "alloc", "free")
WARMUP_REQUESTS = 8  # the pool fills with cached blocks before anything is timed


@dataclass(frozen=True)
class Figure:
    """One operation's per-request times, in microseconds."""

    p50_us: float
    p99_us: float


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


def _figure(samples_ns: list[int]) -> Figure:
    ordered = sorted(samples_ns)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return Figure(statistics.median(ordered) / 1e3, p99 / 1e3)


def run_size(
    tokens: int, requests: int, evictor: str, seed: int = 0, mode: str = DEFAULT_MODE
) -> SizeResult:
    """Both queues through the same `requests` requests of `tokens` tokens; the plugin's
    queue in `mode` (`lpc`, or `lru`/`shadow`: the kill switch thrown)."""
    from vllm.v1.core.kv_cache_utils import FreeKVCacheBlockQueue, KVCacheBlock

    n = tokens // BLOCK_SIZE
    hit = n // 2  # blocks each request hits: the first half of its previous turn
    num_blocks = 4 * n + 64
    clock = StepClock()
    runtime = QueueRuntime(
        PluginConfig(evictor=evictor, stats_log_interval_s=0.0),
        PluginStats(),
        clock,
        mode=ModeSwitch(mode),
    )
    sides: dict[str, dict[str, Any]] = {}
    for name in ("stock", "lpc"):
        blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        queue = (
            FreeKVCacheBlockQueue(blocks) if name == "stock" else bind_queue_class(runtime)(blocks)
        )
        sides[name] = {"queue": queue, "previous": None, "ns": {op: [] for op in OPERATIONS}}
    rng = random.Random(seed)
    for r in range(WARMUP_REQUESTS + requests):
        clock.now = float(r)
        release = Release(clock.now, rng.random(), "chat")  # the same conversation's turns
        hashes = [f"{r}-{i}".encode() for i in range(n)]
        order = ("stock", "lpc") if r % 2 else ("lpc", "stock")
        for name in order:
            side = sides[name]
            queue, previous, ns = side["queue"], side["previous"], side["ns"]
            touched = previous[:hit] if previous is not None else []
            t0 = time.thread_time_ns()
            for block in touched:
                queue.remove(block)
            t1 = time.thread_time_ns()
            fresh = queue.popleft_n(n - len(touched))
            t2 = time.thread_time_ns()
            for i, block in enumerate(fresh):  # vLLM's pool: evicted content goes, new comes
                if block.block_hash is not None:
                    block.reset_hash()
                block.set_block_hash(hashes[i], (len(touched) + i + 1) * BLOCK_SIZE)
            chain = touched + fresh
            tail_first = chain[::-1]
            with runtime.releasing(release):
                t3 = time.thread_time_ns()
                queue.append_n(tail_first)
                t4 = time.thread_time_ns()
            side["previous"] = chain
            if r >= WARMUP_REQUESTS:
                if touched:
                    ns["touch"].append(t1 - t0)
                ns["alloc"].append(t2 - t1)
                ns["free"].append(t4 - t3)
    figures = {name: {op: _figure(sides[name]["ns"][op]) for op in OPERATIONS} for name in sides}
    return SizeResult(
        tokens=tokens,
        blocks_per_request=n,
        requests=requests,
        stock=figures["stock"],
        lpc=figures["lpc"],
        ratio_p50={
            op: figures["lpc"][op].p50_us / figures["stock"][op].p50_us for op in OPERATIONS
        },
        ratio_p99={
            op: figures["lpc"][op].p99_us / figures["stock"][op].p99_us for op in OPERATIONS
        },
    )


def requests_for(tokens: int, budget_blocks: int) -> int:
    """Requests per size: about `budget_blocks` blocks released, at least 20 requests."""
    return max(20, budget_blocks // max(1, tokens // BLOCK_SIZE))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)))
    parser.add_argument("--budget-blocks", type=int, default=400_000)
    parser.add_argument("--evictor", default="lpc-pooled")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mode", choices=MODES, default=DEFAULT_MODE)
    args = parser.parse_args(argv)
    sizes = [int(part) for part in args.sizes.split(",") if part.strip()]
    results = []
    gc.collect()
    gc.disable()
    try:
        for tokens in sizes:
            requests = requests_for(tokens, args.budget_blocks)
            print(f"queue bench: {tokens:,} tokens, {requests} requests", file=sys.stderr)
            result = run_size(tokens, requests, args.evictor, args.seed, args.mode)
            results.append(asdict(result))
            gc.collect()
    finally:
        gc.enable()
    record = {"evictor": args.evictor, "mode": args.mode, "block_size": BLOCK_SIZE}
    print(json.dumps({**record, "sizes": results}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
