"""`lpc bench queue`: the LPC free queue against vLLM's own, per request size, in one process."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from lpc.cli.arg_types import positive_int
from lpc.integrations.kill_switch import DEFAULT_MODE, MODES

DEFAULT_VLLM_PYTHON = Path(".vllm-venv/bin/python")
REPOSITORY = Path(__file__).resolve().parents[2]


def register(targets: argparse._SubParsersAction) -> None:
    parser = targets.add_parser(
        "queue",
        help="µs per request on the free queue: LPC's against vLLM's, at 1K, 11K and 128K tokens",
        description=(
            "Times the three calls vLLM's BlockPool makes on its free queue for one multi-turn "
            "request (touch: remove of the blocks it hits; alloc: popleft_n of the blocks it "
            "computes; free: append_n of its chain, tail first, under its release) on real "
            "vLLM 0.33 KVCacheBlocks, with vLLM's FreeKVCacheBlockQueue and the plugin's "
            "LPCFreeBlockQueue interleaved request by request in one process (vLLM's venv). "
            "Prints p50 and p99 per request and their ratio to vLLM's "
            "(lpc/benchmarks/queue_bench.py). Timer: the thread's CPU time (time.thread_time_ns), "
            "garbage collector off."
        ),
    )
    parser.add_argument(
        "--sizes",
        default="1024,11264,131072",
        help="request sizes in tokens, comma-separated (default 1024,11264,131072)",
    )
    parser.add_argument(
        "--budget-blocks",
        type=positive_int,
        default=400_000,
        help="blocks released per size and queue, at least 20 requests (default 400000)",
    )
    parser.add_argument(
        "--evictor",
        choices=("lpc-pooled", "lpc"),
        default="lpc-pooled",
        help="the queue's evictor (default lpc-pooled, the plugin's default)",
    )
    parser.add_argument(
        "--mode",
        choices=MODES,
        default=DEFAULT_MODE,
        help="the plugin's mode: lpc (default), or lru/shadow, the kill switch thrown (the "
        "queue is vLLM's own FreeKVCacheBlockQueue)",
    )
    parser.add_argument(
        "--switch",
        action="store_true",
        help="also time the kill switch at --free-blocks learned blocks: the switch's CPU "
        "time, each allocation while they drain against vLLM's, the switch back on",
    )
    parser.add_argument(
        "--scan",
        action="store_true",
        help="also time vLLM's lazy CPU-offload walk (iter_blocks_after from its cursor, "
        "--scan-blocks blocks) with --free-blocks free blocks, both queues",
    )
    parser.add_argument(
        "--free-blocks",
        type=positive_int,
        default=100_000,
        help="free blocks for --switch and --scan (default 100000)",
    )
    parser.add_argument(
        "--scan-blocks",
        type=positive_int,
        default=1_024,
        help="blocks per walk for --scan (default 1024: vLLM's lazy target at "
        "max_num_batched_tokens 8192)",
    )
    parser.add_argument(
        "--walks", type=positive_int, default=200, help="walks per size for --scan (default 200)"
    )
    parser.add_argument(
        "--vllm-python",
        type=Path,
        default=DEFAULT_VLLM_PYTHON,
        help="python of the vLLM venv (default .vllm-venv/bin/python)",
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.set_defaults(run=run)


def _sizes(text: str) -> str:
    from lpc.errors import CommandError

    try:
        sizes = [int(part) for part in text.split(",")]
    except ValueError:
        raise CommandError(f"--sizes must be comma-separated token counts, got {text!r}") from None
    for size in sizes:
        if size < 32:
            raise CommandError(f"--sizes: {size} tokens is below two blocks of 16 tokens")
    return ",".join(map(str, sizes))


def run(args: argparse.Namespace) -> int:
    from lpc.errors import CommandError

    sizes = _sizes(args.sizes)
    python = args.vllm_python
    if not python.exists():
        raise CommandError(
            f"--vllm-python: {python} does not exist; create vLLM's venv with "
            "scripts/setup_vllm_venv.sh or point --vllm-python at one"
        )
    command = [
        str(python),
        "-m",
        "lpc.benchmarks.queue_bench",
        "--sizes",
        sizes,
        "--budget-blocks",
        str(args.budget_blocks),
        "--evictor",
        args.evictor,
        "--mode",
        args.mode,
        "--free-blocks",
        str(args.free_blocks),
        "--scan-blocks",
        str(args.scan_blocks),
        "--walks",
        str(args.walks),
        *(["--switch"] if args.switch else []),
        *(["--scan"] if args.scan else []),
    ]
    # The worker's progress lines go to our stderr as they come; its record is its last line.
    done = subprocess.run(command, cwd=REPOSITORY, stdout=subprocess.PIPE, text=True)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise CommandError(f"the queue benchmark failed in {python} (exit {done.returncode})")
    record = json.loads(lines[-1])
    if args.json:
        print(json.dumps(record))
        return 0
    print(
        f"free queue, {record['evictor']} ({record['mode']} mode) against vLLM's "
        "FreeKVCacheBlockQueue "
        "(µs per request, interleaved in one process)"
    )
    print(f"  {'tokens':>8} {'call':<6} {'vLLM p50':>9} {'LPC p50':>9} {'×':>6} {'p99 ×':>6}")
    for size in record["sizes"]:
        for op in ("touch", "alloc", "free"):
            print(
                f"  {size['tokens']:>8,} {op:<6} {size['stock'][op]['p50_us']:9.1f} "
                f"{size['lpc'][op]['p50_us']:9.1f} {size['ratio_p50'][op]:6.2f} "
                f"{size['ratio_p99'][op]:6.2f}"
            )
    for size in record["sizes"]:
        switch = size.get("switch")
        if switch:
            print(
                f"  {size['tokens']:>8,} switch at {switch['free_blocks']:,} free blocks: off "
                f"{switch['switch_off_us']:.0f} µs, on {switch['switch_on_us']:.0f} µs (the "
                f"asking thread); {switch['drain_allocations']} allocations drain, p50 "
                f"{switch['drain_alloc']['p50_us']:.1f} µs ({switch['ratio_p50']:.2f}× vLLM's), "
                f"max {switch['drain_alloc_max_us']:.0f} µs"
            )
        scan = size.get("scan")
        if scan:
            print(
                f"  {size['tokens']:>8,} offload walk of ≤{scan['scan_blocks']} blocks: p50 "
                f"{scan['stock']['p50_us']:.1f} µs vLLM, {scan['lpc']['p50_us']:.1f} µs LPC "
                f"({scan['ratio_p50']:.2f}×, p99 {scan['ratio_p99']:.2f}×); per block "
                f"{scan['ratio_per_block']:.2f}×"
            )
    sys.stdout.flush()
    return 0
