"""The queue benchmark's side outside vLLM's venv: run `lpc.benchmarks.queue_bench` in that
venv's python, read the record it prints on its last line, and lay it out as text."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPOSITORY = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class QueueBenchOptions:
    """The worker's flags (`lpc bench queue --help` says what each does)."""

    sizes: str  # comma-separated token counts, checked
    budget_blocks: int
    evictor: str
    mode: str
    free_blocks: int
    scan_blocks: int
    walks: int
    switch: bool
    scan: bool
    manager: bool = False
    pooled_memory: str = "content"


def worker_command(python: Path, options: QueueBenchOptions) -> list[str]:
    return [
        str(python),
        "-m",
        "lpc.benchmarks.queue_bench",
        "--sizes",
        options.sizes,
        "--budget-blocks",
        str(options.budget_blocks),
        "--evictor",
        options.evictor,
        "--pooled-memory",
        options.pooled_memory,
        "--mode",
        options.mode,
        "--free-blocks",
        str(options.free_blocks),
        "--scan-blocks",
        str(options.scan_blocks),
        "--walks",
        str(options.walks),
        *(["--switch"] if options.switch else []),
        *(["--scan"] if options.scan else []),
        *(["--manager"] if options.manager else []),
    ]


def run_worker(python: Path, options: QueueBenchOptions) -> tuple[int, dict[str, Any] | None]:
    """The worker's exit status and record; no record when it failed or printed nothing. Its
    progress lines go to our stderr as they come; its record is its last line."""
    done = subprocess.run(
        worker_command(python, options), cwd=REPOSITORY, stdout=subprocess.PIPE, text=True
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return done.returncode, None
    return done.returncode, json.loads(lines[-1])


def summary_lines(record: dict[str, Any]) -> list[str]:
    """The record as text: p50 per call and size against vLLM's, then the switch and the walk."""
    lines = [
        f"free queue, {record['evictor']} (memory by {record.get('pooled_memory', 'content')}, "
        f"{record['mode']} mode) against vLLM's "
        "FreeKVCacheBlockQueue "
        "(µs per request, interleaved in one process)",
        f"  {'tokens':>8} {'call':<6} {'vLLM p50':>9} {'LPC p50':>9} {'×':>6} {'p99 ×':>6}",
    ]
    for size in record["sizes"]:
        for op in ("touch", "alloc", "free"):
            lines.append(
                f"  {size['tokens']:>8,} {op:<6} {size['stock'][op]['p50_us']:9.1f} "
                f"{size['lpc'][op]['p50_us']:9.1f} {size['ratio_p50'][op]:6.2f} "
                f"{size['ratio_p99'][op]:6.2f}"
            )
    for size in record["sizes"]:
        lines.extend(_extra_lines(size))
    return lines


def _extra_lines(size: dict[str, Any]) -> list[str]:
    """The switch's, the offload walk's and vLLM's whole manager's lines of one size, when
    they were timed."""
    lines = []
    switch = size.get("switch")
    if switch:
        lines.append(
            f"  {size['tokens']:>8,} switch at {switch['free_blocks']:,} free blocks: off "
            f"{switch['switch_off_us']:.0f} µs, on {switch['switch_on_us']:.0f} µs (the "
            f"asking thread); {switch['drain_allocations']} allocations drain, p50 "
            f"{switch['drain_alloc']['p50_us']:.1f} µs ({switch['ratio_p50']:.2f}× vLLM's), "
            f"max {switch['drain_alloc_max_us']:.0f} µs"
        )
    scan = size.get("scan")
    if scan:
        lines.append(
            f"  {size['tokens']:>8,} offload walk of ≤{scan['scan_blocks']} blocks: p50 "
            f"{scan['stock']['p50_us']:.1f} µs vLLM, {scan['lpc']['p50_us']:.1f} µs LPC "
            f"({scan['ratio_p50']:.2f}×, p99 {scan['ratio_p99']:.2f}×); per block "
            f"{scan['ratio_per_block']:.2f}×"
        )
    manager = size.get("manager")
    if manager:
        lines.append(
            f"  {size['tokens']:>8,} vLLM's KVCacheManager: allocate (get_computed_blocks + "
            f"allocate_slots) p50 {manager['stock']['allocate']['p50_us']:.1f} µs vLLM, "
            f"{manager['lpc']['allocate']['p50_us']:.1f} µs LPC "
            f"({manager['ratio_p50']['allocate']:.2f}×); free p50 "
            f"{manager['stock']['free']['p50_us']:.1f} µs vLLM, "
            f"{manager['lpc']['free']['p50_us']:.1f} µs LPC ({manager['ratio_p50']['free']:.2f}×, "
            f"p99 {manager['ratio_p99']['free']:.2f}×)"
        )
        lines.append(
            f"  {size['tokens']:>8,} the floor (a queue keyed per release, nothing else): "
            f"allocate p50 {manager['floor']['allocate']['p50_us']:.1f} µs "
            f"({manager['floor_ratio_p50']['allocate']:.2f}×); free p50 "
            f"{manager['floor']['free']['p50_us']:.1f} µs "
            f"({manager['floor_ratio_p50']['free']:.2f}×, "
            f"p99 {manager['floor_ratio_p99']['free']:.2f}×)"
        )
        if "pooled_floor" in manager:
            lines.append(
                f"  {size['tokens']:>8,} the pooled floor (and each block's key, as pooling "
                f"needs): allocate p50 {manager['pooled_floor']['allocate']['p50_us']:.1f} µs "
                f"({manager['pooled_floor_ratio_p50']['allocate']:.2f}×); free p50 "
                f"{manager['pooled_floor']['free']['p50_us']:.1f} µs "
                f"({manager['pooled_floor_ratio_p50']['free']:.2f}×, "
                f"p99 {manager['pooled_floor_ratio_p99']['free']:.2f}×)"
            )
    return lines
