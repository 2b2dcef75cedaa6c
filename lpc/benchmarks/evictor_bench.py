"""Nanoseconds per free-queue operation: our lru and lpc evictors vs vLLM's queue.

vLLM's `FreeKVCacheBlockQueue` runs in vLLM's own virtual environment (its dependency pins
clash with ours), through `scripts/vllm_queue_bench.py`, on the same seeded plan.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from eviction import FreedBlocks, LPCEvictor, LRUEvictor, Release
from lpc.benchmarks.evictor_ops import NullAdapter, OpPlan, best_of, make_plan, replay

REPO_ROOT = Path(__file__).resolve().parents[2]
VLLM_BENCH_SCRIPT = REPO_ROOT / "scripts" / "vllm_queue_bench.py"


class EvictorAdapter:
    """Drives one of our evictors the way the block manager does."""

    def __init__(self, name: str) -> None:
        self.name = name

    def warm(self, num_blocks: int) -> None:
        self.evictor = LRUEvictor(num_blocks) if self.name == "lru" else LPCEvictor(num_blocks)
        self.evictor.reset(range(num_blocks))
        # Start from a pool of cached blocks, where eviction order matters.
        everything = self.evictor.pop_n(num_blocks)
        self.push(everything, 0.0, 0.5)

    def pop_n(self, n: int) -> list[int]:
        return self.evictor.pop_n(n)

    def push(self, block_ids: list[int], time_s: float, probability: float) -> None:
        depths = list(range(len(block_ids) - 1, -1, -1))
        self.evictor.push_cached(
            FreedBlocks(block_ids, depths, [None] * len(block_ids)),
            Release(time_s, probability, None),
        )

    def remove(self, block_id: int) -> None:
        self.evictor.remove(block_id)

    def is_free(self, block_id: int) -> bool:
        return block_id in self.evictor


@dataclass
class EvictorBenchResult:
    block_ops: int
    runs: int
    ns_per_op: dict[str, float]
    ratios: dict[str, float]
    vllm_status: str


def run_vllm_queue(plan_ops: int, num_blocks: int, seed: int, runs: int, python: Path) -> float:
    """ns/op of vLLM's FreeKVCacheBlockQueue on the same plan (driver cost included)."""
    out = subprocess.run(
        [str(python), str(VLLM_BENCH_SCRIPT), "--ops", str(plan_ops), "--blocks",
         str(num_blocks), "--seed", str(seed), "--runs", str(runs)],
        check=True, capture_output=True, text=True,
    )
    return float(json.loads(out.stdout.strip().splitlines()[-1])["ns_per_op_gross"])


def measure(plan: OpPlan, adapter, runs: int) -> float:
    seconds, done = best_of(runs, lambda: replay(plan, adapter))
    return seconds * 1e9 / done


def run(
    block_ops: int = 1_000_000,
    num_blocks: int = 20_000,
    seed: int = 0,
    runs: int = 3,
    vllm_python: Path | None = None,
) -> EvictorBenchResult:
    plan = make_plan(block_ops, num_blocks, seed)
    driver = measure(plan, NullAdapter(), runs)
    gross = {name: measure(plan, EvictorAdapter(name), runs) for name in ("lru", "lpc")}
    status = "not measured: no vLLM venv (run scripts/setup_vllm_venv.sh)"
    if vllm_python is not None and vllm_python.exists():
        gross["vllm_free_queue"] = run_vllm_queue(block_ops, num_blocks, seed, runs, vllm_python)
        status = f"measured with {vllm_python}"
    net = {name: max(value - driver, 0.0) for name, value in gross.items()}
    net["driver_loop_only"] = driver
    ratios = {"lpc_over_lru": net["lpc"] / net["lru"]}
    if "vllm_free_queue" in net:
        ratios["lru_over_vllm"] = net["lru"] / net["vllm_free_queue"]
    return EvictorBenchResult(plan.num_block_ops, runs, net, ratios, status)


def to_json(result: EvictorBenchResult) -> str:
    return json.dumps(asdict(result), indent=2)
