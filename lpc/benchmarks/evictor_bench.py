"""Nanoseconds per free-queue operation: our lru and lpc evictors vs vLLM's queue.

Each policy is first driven through a seeded multi-turn chat plan to record the exact calls
it receives; then fresh instances replay those calls in a tight loop, and the loop's own
dispatch cost is subtracted. vLLM's `FreeKVCacheBlockQueue` replays the calls recorded for our
lru (identical by construction: our lru reproduces vLLM's queue block for block) inside vLLM's
own virtual environment (its pins clash with ours), through `scripts/vllm_queue_bench.py`.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from eviction import Evictor, FreedBlocks, LPCEvictor, LRUEvictor, Release
from lpc.benchmarks.evictor_ops import (
    PUSH,
    Call,
    best_of,
    count_block_ops,
    dispatch_seconds,
    make_plan,
    record,
    time_calls,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
VLLM_BENCH_SCRIPT = REPO_ROOT / "scripts" / "vllm_queue_bench.py"
POLICIES = {"lru": LRUEvictor, "lpc": LPCEvictor}


@dataclass
class EvictorBenchResult:
    block_ops: dict[str, int]
    runs: int
    ns_per_op: dict[str, float]
    ratios: dict[str, float]
    vllm_status: str
    instructions_per_op: dict[str, float] | None = None
    instruction_ratios: dict[str, float] | None = None
    instruction_block_ops: int | None = None


def _fresh(name: str, num_blocks: int) -> Evictor:
    evictor = POLICIES[name](num_blocks)
    evictor.reset(range(num_blocks))
    return evictor


def _push_args(block_ids: list[int], meta: tuple) -> tuple[FreedBlocks, Release]:
    n = len(block_ids)
    return FreedBlocks(block_ids, range(n - 1, -1, -1), [None] * n), Release(*meta)


def record_policy(name: str, plan) -> list[Call]:
    """The calls `name` receives on the plan, with PUSH arguments prepared for our evictors."""
    evictor = _fresh(name, plan.num_blocks)
    calls = record(plan, evictor, lambda ids, meta: evictor.push_cached(*_push_args(ids, meta)))
    return [(k, a, _push_args(a, b) if k == PUSH else b) for k, a, b in calls]  # type: ignore[arg-type]


def time_policy(name: str, calls: list[Call], num_blocks: int) -> float:
    def once() -> float:
        evictor = _fresh(name, num_blocks)
        return time_calls(calls, evictor.pop_n, evictor.remove, evictor.push_cached)

    return once()


def run_vllm_queue(calls: list[Call], num_blocks: int, runs: int, python: Path) -> float:
    """Net ns/op of vLLM's FreeKVCacheBlockQueue replaying our lru's calls."""
    plain = [[k, a if k != PUSH else list(a)] for k, a, _ in calls]
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump({"num_blocks": num_blocks, "calls": plain}, handle)
        path = handle.name
    try:
        out = subprocess.run(
            [str(python), str(VLLM_BENCH_SCRIPT), path, "--runs", str(runs)],
            check=True,
            capture_output=True,
            text=True,
        )
    finally:
        Path(path).unlink(missing_ok=True)
    return float(json.loads(out.stdout.strip().splitlines()[-1])["ns_per_op"])


def run(
    block_ops: int = 1_000_000,
    num_blocks: int = 20_000,
    seed: int = 0,
    runs: int = 3,
    vllm_python: Path | None = None,
    instruction_ops: int = 0,
) -> EvictorBenchResult:
    plan = make_plan(block_ops, num_blocks, seed)
    ns: dict[str, float] = {}
    ops: dict[str, int] = {}
    recorded: dict[str, list[Call]] = {}
    for name in POLICIES:
        calls = recorded[name] = record_policy(name, plan)
        ops[name] = count_block_ops(calls)
        seconds = best_of(runs, lambda c=calls, n=name: time_policy(n, c, num_blocks))
        loop = best_of(runs, lambda c=calls: dispatch_seconds(c))
        ns[name] = max(seconds - loop, 0.0) * 1e9 / ops[name]
    status = "not measured: no vLLM venv (run scripts/setup_vllm_venv.sh)"
    if vllm_python is not None and vllm_python.exists():
        ns["vllm_free_queue"] = run_vllm_queue(recorded["lru"], num_blocks, runs, vllm_python)
        ops["vllm_free_queue"] = ops["lru"]
        status = f"measured with {vllm_python}"
    ratios = {"lpc_over_lru": ns["lpc"] / ns["lru"]}
    if "vllm_free_queue" in ns:
        ratios["lru_over_vllm"] = ns["lru"] / ns["vllm_free_queue"]
    result = EvictorBenchResult(ops, runs, ns, ratios, status)
    if instruction_ops > 0:
        per_op, instruction_ratios, counted = count_instructions(
            instruction_ops, num_blocks, seed, vllm_python
        )
        result.instructions_per_op = per_op
        result.instruction_ratios = instruction_ratios
        result.instruction_block_ops = counted
    return result


def count_instructions(
    block_ops: int, num_blocks: int, seed: int, vllm_python: Path | None
) -> tuple[dict[str, float], dict[str, float], int]:
    """Queue instructions per block operation (callgrind), our policies and vLLM's queue."""
    import sys

    from lpc.benchmarks.instruction_count import net_instructions

    plan_args = ["--ops", str(block_ops), "--blocks", str(num_blocks), "--seed", str(seed)]
    per_op: dict[str, float] = {}
    ops = {
        name: count_block_ops(record_policy(name, make_plan(block_ops, num_blocks, seed)))
        for name in POLICIES
    }
    for name in POLICIES:

        def argv(mode: str, name: str = name) -> list[str]:
            return [
                sys.executable,
                "-m",
                "lpc.benchmarks.evictor_worker",
                "--policy",
                name,
                "--mode",
                mode,
                *plan_args,
            ]

        queue, _ = net_instructions(argv)
        per_op[name] = queue / ops[name]
    if vllm_python is not None and vllm_python.exists():
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as handle:
            dump = handle.name
        try:
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "lpc.benchmarks.evictor_worker",
                    "--policy",
                    "lru",
                    "--mode",
                    "setup",
                    "--dump",
                    dump,
                    *plan_args,
                ],
                check=True,
                capture_output=True,
            )

            def vllm_argv(mode: str) -> list[str]:
                return [str(vllm_python), str(VLLM_BENCH_SCRIPT), dump, "--mode", mode]

            queue, _ = net_instructions(vllm_argv)
            per_op["vllm_free_queue"] = queue / ops["lru"]
        finally:
            Path(dump).unlink(missing_ok=True)
    ratios = {"lpc_over_lru": per_op["lpc"] / per_op["lru"]}
    if "vllm_free_queue" in per_op:
        ratios["lru_over_vllm"] = per_op["lru"] / per_op["vllm_free_queue"]
    return per_op, ratios, ops["lru"]


def to_json(result: EvictorBenchResult) -> str:
    return json.dumps(asdict(result), indent=2)
