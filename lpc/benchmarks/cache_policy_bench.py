"""ns per operation of vLLM's CPU-tier cache policies: ours beside vLLM's lru and arc.

One seeded plan (`cache_policy_plan`) goes to a fresh process per policy and round, inside
vLLM's venv (`cache_policy_worker`: real vLLM's `CPUOffloadingManager` drives the policy,
the calls it made are replayed and timed net of a no-op loop). Rounds interleave the
policies so that a change in the machine's load hits them alike; each policy keeps its best
round. The figure of merit is `LPCCachePolicy`'s ns per operation over `lru`'s, against the
target `TARGET_RATIO`.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from lpc.benchmarks.cache_policy_plan import make_plan

REPO_ROOT = Path(__file__).resolve().parents[2]
LPC_MODULE = "lpc.integrations.vllm_cache_policy"
# label -> (vLLM's policy name, module path or None for vLLM's own)
POLICIES: dict[str, tuple[str, str | None]] = {
    "lru": ("lru", None),
    "arc": ("arc", None),
    "lpc": ("LPCCachePolicy", LPC_MODULE),
    "lpc-pooled": ("LPCPooledCachePolicy", LPC_MODULE),
}
BASELINE = "lru"
TARGET_RATIO = 1.5


@dataclass
class CachePolicyBenchResult:
    requests: int
    num_chunks: int
    runs: int
    ops: dict[str, int]  # policy calls per policy (evictions differ, so calls do too)
    ns_per_op: dict[str, float]  # best round
    ratios: dict[str, float | None]  # each policy over lru; None: lru's time vanished
    target_ratio: float
    meets_target: dict[str, bool]  # lpc and lpc-pooled


def worker_argv(python: Path, plan_file: Path, label: str, repeats: int) -> list[str]:
    name, module = POLICIES[label]
    argv = [str(python), "-m", "lpc.benchmarks.cache_policy_worker", str(plan_file), name]
    return argv + ([module] if module else []) + ["--repeats", str(repeats)]


def summarise(
    rounds: list[dict[str, dict]], requests: int, num_chunks: int
) -> CachePolicyBenchResult:
    """Best ns per operation of each policy over the rounds, and the ratios to lru."""
    labels = list(rounds[0])
    best = {label: min(r[label]["ns_per_op"] for r in rounds) for label in labels}
    base = best[BASELINE]
    ratios = {
        label: (best[label] / base if base > 0 else None) for label in labels if label != BASELINE
    }
    meets = {
        label: ratio is not None and ratio <= TARGET_RATIO
        for label, ratio in ratios.items()
        if label.startswith("lpc")
    }
    return CachePolicyBenchResult(
        requests=requests,
        num_chunks=num_chunks,
        runs=len(rounds),
        ops={label: rounds[0][label]["ops"] for label in labels},
        ns_per_op=best,
        ratios=ratios,
        target_ratio=TARGET_RATIO,
        meets_target=meets,
    )


def run(
    requests: int,
    num_chunks: int,
    seed: int,
    runs: int,
    vllm_python: Path,
    repeats: int = 3,
    labels: tuple[str, ...] = tuple(POLICIES),
) -> CachePolicyBenchResult:
    if BASELINE not in labels:
        labels = (BASELINE, *labels)
    plan = make_plan(requests, num_chunks=num_chunks, seed=seed)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    rounds: list[dict[str, dict]] = []
    with tempfile.TemporaryDirectory() as folder:
        plan_file = Path(folder) / "plan.json"
        plan_file.write_text(json.dumps(plan.to_dict()))
        for _ in range(runs):
            measured: dict[str, dict] = {}
            for label in labels:
                argv = worker_argv(vllm_python, plan_file, label, repeats)
                done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
                if done.returncode != 0:
                    tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
                    raise RuntimeError(f"{label}: the worker failed ({done.returncode}): {tail}")
                measured[label] = json.loads(done.stdout.strip().splitlines()[-1])
            rounds.append(measured)
    return summarise(rounds, requests, num_chunks)


def to_json(result: CachePolicyBenchResult) -> str:
    return json.dumps(asdict(result), indent=2)


def summary_lines(result: CachePolicyBenchResult) -> list[str]:
    """The figures as text: ns per operation and the ratio to lru, then each target's verdict."""
    lines = [
        f"{result.requests} requests, {result.num_chunks} CPU chunks, best of {result.runs} "
        "rounds (a fresh process each)",
        f"  {'':<12} {'ns/op':>8} {'/ lru':>7}  policy calls",
    ]
    for label, ns in result.ns_per_op.items():
        ratio = result.ratios.get(label)
        shown = "" if label == "lru" else ("n/a" if ratio is None else f"{ratio:.2f}x")
        lines.append(f"  {label:<12} {ns:8.1f} {shown:>7}  {result.ops[label]:,}")
    for label, met in result.meets_target.items():
        verdict = "meets" if met else "misses"
        lines.append(f"  {label} {verdict} the target of {result.target_ratio}x lru")
    return lines
