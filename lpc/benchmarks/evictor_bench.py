"""Nanoseconds per free-queue operation: our evictors (lru and lpc by default) vs vLLM's queue.

Each policy is first driven through a seeded multi-turn chat plan to record the exact calls it
receives; every implementation then replays its file in a fresh process of its own, in
interleaved rounds: our evictors through `evictor_worker`, vLLM's `FreeKVCacheBlockQueue`
through `evictor_vllm_worker` inside vLLM's virtual environment (its pins clash with
ours), replaying the calls recorded for our lru (identical by construction: our lru
reproduces vLLM's queue block for block). Both sides run the same timing code, so the only
difference left is the queue. The method and the two figures (with and without the call):
docs/design.md, "Evictor speed".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from tqdm import tqdm

from eviction import FreedBlocks, Release
from lpc.benchmarks.evictor_ops import (
    Call,
    OpPlan,
    ReplayTiming,
    count_block_ops,
    make_plan,
    record,
    write_calls,
)
from lpc.benchmarks.evictor_worker import DEFAULT_TIMED_POLICIES, new_evictor

REPO_ROOT = Path(__file__).resolve().parents[2]
VLLM = "vllm_free_queue"
REPEATS_PER_PROCESS = 3


@dataclass
class EvictorBenchResult:
    block_ops: dict[str, int]
    runs: int
    ns_per_op: dict[str, float]
    ratios: dict[str, float | None]  # None: the denominator's time vanished (see _ratio)
    body_ns_per_op: dict[str, float]
    body_ratios: dict[str, float | None]
    vllm_status: str
    instructions_per_op: dict[str, float] | None = None
    instruction_ratios: dict[str, float | None] | None = None
    body_instructions_per_op: dict[str, float] | None = None
    body_instruction_ratios: dict[str, float | None] | None = None
    instruction_block_ops: int | None = None


def record_policy(name: str, plan: OpPlan) -> list[Call]:
    """The calls `name` receives on the plan; PUSH keeps (time, p, conversation)."""
    evictor = new_evictor(name, plan.num_blocks)

    def push(block_ids: list[int], meta: tuple) -> None:
        n = len(block_ids)
        freed = FreedBlocks(block_ids, range(n - 1, -1, -1), [None] * n)
        evictor.push_cached(freed, Release(*meta))

    return record(plan, evictor, push)


def record_at_least(
    block_ops: int,
    num_blocks: int,
    seed: int,
    attempts: int = 8,
    policies: Sequence[str] = DEFAULT_TIMED_POLICIES,
) -> tuple[int, dict[str, list[Call]]]:
    """Each policy's calls on the smallest plan (grown from `block_ops`) giving every policy
    at least `block_ops` block operations: a plan's size is an upper bound on its operations
    (hits end at the first evicted block), so it is scaled by what it fell short."""
    target = block_ops
    for _ in range(attempts):
        plan = make_plan(target, num_blocks, seed)
        recorded = {name: record_policy(name, plan) for name in policies}
        fewest = min(count_block_ops(calls) for calls in recorded.values())
        if fewest >= block_ops:
            return num_blocks, recorded
        target = int(target * block_ops / max(fewest, 1) * 1.02) + 1
    raise RuntimeError(f"could not reach {block_ops} block operations in {attempts} plans")


def checkout_env() -> dict[str, str]:
    """Our environment with the checkout first on the path: vLLM's venv need not have the
    project installed to run `evictor_vllm_worker`."""
    path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


def _run_json(argv: Sequence[str]) -> dict:
    completed = subprocess.run(
        list(argv), capture_output=True, text=True, check=False, env=checkout_env()
    )
    if completed.returncode != 0:
        tail = " | ".join((completed.stderr or completed.stdout).strip().splitlines()[-3:])
        raise RuntimeError(f"{' '.join(argv[:4])} … failed ({completed.returncode}): {tail}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def worker_argv(policy: str, calls_file: Path, mode: str = "time") -> list[str]:
    return [
        sys.executable,
        "-m",
        "lpc.benchmarks.evictor_worker",
        "--policy",
        policy,
        "--calls",
        str(calls_file),
        "--mode",
        mode,
    ]


def vllm_argv(python: Path, calls_file: Path, mode: str = "time") -> list[str]:
    return [
        str(python),
        "-m",
        "lpc.benchmarks.evictor_vllm_worker",
        str(calls_file),
        "--mode",
        mode,
    ]


def _ratio(numerator: float, denominator: float) -> float | None:
    """None when the denominator's time vanished: on a loaded machine a body time (the
    call minus a no-op call) can come out at or below zero and is clamped to 0."""
    return numerator / denominator if denominator > 0 else None


def _ratios(per_op: dict[str, float]) -> dict[str, float | None]:
    """Each policy over lru (lru is always timed), and lru over vLLM's queue when measured."""
    ratios = {
        f"{n}_over_lru": _ratio(v, per_op["lru"])
        for n, v in per_op.items()
        if n not in ("lru", VLLM)
    }
    if VLLM in per_op:
        ratios["lru_over_vllm"] = _ratio(per_op["lru"], per_op[VLLM])
    return ratios


def _write_call_files(directory: Path, num_blocks: int, recorded: dict[str, list[Call]]):
    files = {}
    for name, calls in recorded.items():
        files[name] = directory / f"{name}-calls.json"
        write_calls(files[name], num_blocks, calls)
    return files


def run(
    block_ops: int = 1_000_000,
    num_blocks: int = 20_000,
    seed: int = 0,
    runs: int = 3,
    vllm_python: Path | None = None,
    instruction_ops: int = 0,
    progress: bool = True,
    policies: Sequence[str] = DEFAULT_TIMED_POLICIES,
) -> EvictorBenchResult:
    """`runs` rounds; each round replays every implementation in a fresh process.

    lru is always timed: it is the baseline of every ratio, and vLLM's queue replays its calls.
    """
    policies = ["lru", *(name for name in policies if name != "lru")]
    num_blocks, recorded = record_at_least(block_ops, num_blocks, seed, policies=policies)
    has_vllm = vllm_python is not None and vllm_python.exists()
    with tempfile.TemporaryDirectory(prefix="lpc-bench-") as tmp:
        files = _write_call_files(Path(tmp), num_blocks, recorded)
        argvs = {name: worker_argv(name, files[name]) for name in policies}
        if has_vllm:
            argvs[VLLM] = vllm_argv(vllm_python, files["lru"])  # type: ignore[arg-type]
        best: dict[str, ReplayTiming] = {}
        replays = [(name, argv) for _ in range(runs) for name, argv in argvs.items()]
        for name, argv in tqdm(replays, desc="replays", unit="process", disable=not progress):
            timing = ReplayTiming(**_run_json([*argv, "--repeats", str(REPEATS_PER_PROCESS)]))
            old = best.get(name)
            if old is not None:
                timing = ReplayTiming(
                    min(old.seconds, timing.seconds),
                    min(old.loop_seconds, timing.loop_seconds),
                    min(old.noop_call_seconds, timing.noop_call_seconds),
                    timing.block_ops,
                )
            best[name] = timing
    ops = {name: timing.block_ops for name, timing in best.items()}
    ns = {n: max(t.seconds - t.loop_seconds, 0.0) * 1e9 / t.block_ops for n, t in best.items()}
    body = {
        n: max(t.seconds - t.noop_call_seconds, 0.0) * 1e9 / t.block_ops for n, t in best.items()
    }
    status = (
        f"measured with {vllm_python}"
        if has_vllm
        else "not measured: no vLLM venv (run scripts/setup_vllm_venv.sh)"
    )
    result = EvictorBenchResult(ops, runs, ns, _ratios(ns), body, _ratios(body), status)
    if instruction_ops > 0:
        count_instructions(
            result, instruction_ops, num_blocks, seed, vllm_python, progress, policies
        )
    return result


def count_instructions(
    result: EvictorBenchResult,
    block_ops: int,
    num_blocks: int,
    seed: int,
    vllm_python: Path | None,
    progress: bool = True,
    policies: Sequence[str] = DEFAULT_TIMED_POLICIES,
) -> None:
    """Instructions per block operation (callgrind), ours and vLLM's queue, into `result`."""
    from lpc.benchmarks.instruction_count import callgrind_instructions

    num_blocks, recorded = record_at_least(block_ops, num_blocks, seed, policies=policies)
    ops = {name: count_block_ops(calls) for name, calls in recorded.items()}
    with tempfile.TemporaryDirectory(prefix="lpc-bench-") as tmp:
        files = _write_call_files(Path(tmp), num_blocks, recorded)
        argv_for = {
            name: (lambda mode, n=name: worker_argv(n, files[n], mode)) for name in policies
        }
        if vllm_python is not None and vllm_python.exists():
            argv_for[VLLM] = lambda mode: vllm_argv(vllm_python, files["lru"], mode)
            ops[VLLM] = ops["lru"]
        jobs = [(name, mode) for name in argv_for for mode in ("replay", "loop", "dispatch")]
        counts: dict[str, dict[str, int]] = {name: {} for name in argv_for}
        for name, mode in tqdm(jobs, desc="callgrind", unit="process", disable=not progress):
            counts[name][mode] = callgrind_instructions(argv_for[name](mode), checkout_env())
    per_op = {n: (c["replay"] - c["loop"]) / ops[n] for n, c in counts.items()}
    body = {n: (c["replay"] - c["dispatch"]) / ops[n] for n, c in counts.items()}
    result.instructions_per_op = per_op
    result.instruction_ratios = _ratios(per_op)
    result.body_instructions_per_op = body
    result.body_instruction_ratios = _ratios(body)
    result.instruction_block_ops = ops["lru"]


def to_json(result: EvictorBenchResult) -> str:
    return json.dumps(asdict(result), indent=2)


def summary_lines(result: EvictorBenchResult) -> list[str]:
    """The figures as text: ns per operation and ratios, then instruction counts if taken."""
    lines = [
        f"multi-turn chat plan, best of {result.runs} rounds (a fresh process each)",
        f"  {'':<18} {'ns/op':>8} {'body ns/op':>11}  block operations",
    ]
    for name, ns in result.ns_per_op.items():
        body = result.body_ns_per_op[name]
        lines.append(f"  {name:<18} {ns:8.1f} {body:11.1f}  {result.block_ops[name]:,}")
    for name, ratio in result.ratios.items():
        lines.append(f"  {name:<18} {_times(ratio):>9} {_times(result.body_ratios[name]):>11}")
    lines.append(f"  vLLM: {result.vllm_status}")
    if result.instructions_per_op:
        body_counts = result.body_instructions_per_op or {}
        lines.append(
            f"instructions per operation (callgrind, {result.instruction_block_ops:,} operations)"
        )
        for name, count in result.instructions_per_op.items():
            lines.append(f"  {name:<18} {count:8.0f} {body_counts.get(name, 0.0):11.0f}")
        body_ratios = result.body_instruction_ratios or {}
        for name, ratio in (result.instruction_ratios or {}).items():
            lines.append(f"  {name:<18} {_times(ratio):>9} {_times(body_ratios.get(name)):>11}")
    return lines


def _times(ratio: float | None) -> str:
    """A ratio as "1.23x", or "n/a" when it could not be measured (a vanished time)."""
    return "n/a" if ratio is None else f"{ratio:.2f}x"
