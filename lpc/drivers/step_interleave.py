"""The whole scheduler step, stock vLLM and LPC interleaved in one process.

`lpc vllm-ab --time-steps --interleave`: a speed ratio against vLLM means something on a
shared machine only when both sides run side by side (load moves separate runs by 10-20 %).
The scheduler driver (scripts/vllm_scheduler_replay.py, in vLLM's venv) builds stock vLLM's
`Scheduler` beside the plugin's `LPCScheduler` over the same requests; `interleave` steps the
two in turn, one `schedule()` call each, the order swapped every pair so neither always finds
the caches the other left; each step is the scheduler thread's CPU in vLLM's calls (the
arrivals added before it, `schedule`, `update_from_output` with the release and the scoring),
with the garbage collector off while they run. `step_report` gives the ratio of the two totals,
of the per-step p50 and p99, and a 95 % interval for the totals' ratio: a paired bootstrap
(`training.paired_bootstrap`) over blocks of consecutive steps, step k of both engines in the
same block. The two engines evict differently, so after a while their step k are not the same
work: the total's ratio is the figure, the per-step ones describe its shape.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from training.paired_bootstrap import (
    CONFIDENCE,
    N_RESAMPLES,
    SEED,
    paired_gain,
    percentile_interval,
    resample_weights,
)

BLOCK_STEPS = 1000  # consecutive steps per bootstrap block (~1 s of the run)
COLLECT_EVERY = 1000  # pairs between two garbage collections, outside the timed calls
STOCK_SCHEDULER = "vllm.v1.core.sched.scheduler.Scheduler"


@dataclass
class StepTimes:
    """Each engine's CPU per step (ns), in step order."""

    stock_ns: list[int] = field(default_factory=list)
    lpc_ns: list[int] = field(default_factory=list)
    stock_first: int = 0  # pairs in which stock stepped first
    alone: int = 0  # steps one engine made after the other had finished


def interleave(
    stock: Iterator[int], lpc: Iterator[int], collect_every: int = COLLECT_EVERY
) -> StepTimes:
    """Step two engines in turn (each iterator yields one step's CPU in ns) until both are
    done: stock first in even pairs, LPC first in odd ones."""
    times = StepTimes()
    engines = [(stock, times.stock_ns), (lpc, times.lpc_ns)]
    live = [True, True]
    pair = 0
    gc.collect()
    gc.disable()
    try:
        while any(live):
            order = (0, 1) if pair % 2 == 0 else (1, 0)
            stepped = []
            for i in order:
                if not live[i]:
                    continue
                steps, out = engines[i]
                spent = next(steps, None)
                if spent is None:
                    live[i] = False
                    continue
                out.append(spent)
                stepped.append(i)
            if len(stepped) == 1:
                times.alone += 1
            elif stepped and stepped[0] == 0:
                times.stock_first += 1
            pair += 1
            if pair % collect_every == 0:
                gc.collect()
    finally:
        gc.enable()
    return times


def _percentile_us(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) / 1e3 if values.size else 0.0


def _ratio(ours: float, theirs: float) -> float | None:
    return ours / theirs if theirs > 0 else None


def step_report(
    times: StepTimes,
    block_steps: int = BLOCK_STEPS,
    n_resamples: int = N_RESAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = SEED,
) -> dict[str, Any]:
    """Totals, per-step p50/p99, their ratios (LPC over stock), and the bootstrap interval of
    the totals' ratio (None with fewer than two blocks or no stock CPU)."""
    if block_steps < 1:
        raise ValueError(f"block_steps must be >= 1, got {block_steps}")
    stock = np.asarray(times.stock_ns, dtype=np.float64)
    lpc = np.asarray(times.lpc_ns, dtype=np.float64)
    count = -(-max(stock.size, lpc.size) // block_steps)
    theirs = np.bincount(np.arange(stock.size) // block_steps, weights=stock, minlength=count)
    ours = np.bincount(np.arange(lpc.size) // block_steps, weights=lpc, minlength=count)
    interval = None
    if count >= 2 and theirs.sum() > 0:
        weights = resample_weights(np.arange(count), n_resamples, seed, count=count)
        draws = 1.0 + paired_gain(ours, theirs, weights)
        interval = percentile_interval(draws, confidence)
    side = {
        name: {
            "steps": int(values.size),
            "cpu_s": round(float(values.sum()) / 1e9, 6),
            "step_p50_us": round(_percentile_us(values, 50), 3),
            "step_p99_us": round(_percentile_us(values, 99), 3),
        }
        for name, values in (("stock", stock), ("lpc", lpc))
    }
    return {
        **side,
        "ratio": {
            key: _ratio(side["lpc"][field_], side["stock"][field_])
            for key, field_ in (("total", "cpu_s"), ("p50", "step_p50_us"), ("p99", "step_p99_us"))
        },
        "total_ratio_interval": interval,
        "pairs": int(min(stock.size, lpc.size)),
        "stock_first_pairs": times.stock_first,
        "steps_alone": times.alone,
        "bootstrap": {
            "unit": "blocks of consecutive steps, paired by step index",
            "block_steps": block_steps,
            "blocks": count,
            "resamples": n_resamples,
            "confidence": confidence,
            "seed": seed,
        },
    }


def interleaved_check(summary: dict[str, Any]) -> dict[str, Any]:
    """What must hold of an interleaved run (the driver's summary): both engines served the
    same requests, all of them, and the stock engine is vLLM's own, intact at the end."""
    report = summary["interleaved"]
    stock, lpc = report["stock_engine"], summary["totals"]
    checks = {
        "same_requests": report["request_digests"]["stock"] == report["request_digests"]["lpc"]
        and stock["totals"]["requests"] == lpc["requests"],
        "every_request_finished": stock["totals"]["finished"] == stock["totals"]["requests"],
        "stock_is_vllm_scheduler": stock["scheduler"] == STOCK_SCHEDULER
        and stock["invariants"]["queue"] == "FreeKVCacheBlockQueue",
        "stock_invariants": stock["invariants"]["ok"],
    }
    return {"ok": all(checks.values()), **checks}


def floor_check(summary: dict[str, Any]) -> dict[str, Any]:
    """The floor queue evicts in vLLM's LRU order: beside stock, every total (steps, hit and
    scheduled tokens, evictions) must be the same. `equal` and the first total that differs."""
    stock = summary["interleaved"]["stock_engine"]["totals"]
    floor = summary["totals"]
    differs = next((k for k in sorted(stock) if stock[k] != floor.get(k)), None)
    return {
        "equal": differs is None,
        "first_divergence": None
        if differs is None
        else f"{differs}: {stock[differs]} vs {floor.get(differs)}",
        "steps_compared": floor["steps"],
    }


def _times(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.3f}x"


def print_interleaved(label: str, report: dict[str, Any]) -> None:
    """One policy's interleaved figures (`step_report`'s, as the driver's summary holds them)."""
    stock, lpc, ratio = report["stock"], report["lpc"], report["ratio"]
    interval = report["total_ratio_interval"]
    within = f" (95 % interval {interval[0]:.3f}-{interval[1]:.3f})" if interval else ""
    print(
        f"{label} vs stock, interleaved in one process ({report['pairs']} step pairs): "
        f"scheduler CPU {lpc['cpu_s']:.3f} s vs {stock['cpu_s']:.3f} s, "
        f"{_times(ratio['total'])} in all{within}; per step p50 {lpc['step_p50_us']:.0f} vs "
        f"{stock['step_p50_us']:.0f} us ({_times(ratio['p50'])}), p99 "
        f"{lpc['step_p99_us']:.0f} vs {stock['step_p99_us']:.0f} us ({_times(ratio['p99'])})"
    )
