"""`lpc bench queue`: the LPC free queue against vLLM's own, per request size, in one process."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from eviction.lpc_pooled import DEFAULT_MEMORY, MEMORIES
from lpc.cli.arg_types import positive_int
from lpc.integrations.kill_switch import DEFAULT_MODE, MODES

DEFAULT_VLLM_PYTHON = Path(".vllm-venv/bin/python")


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
        "--pooled-memory",
        choices=MEMORIES,
        default=DEFAULT_MEMORY,
        help=f"where lpc-pooled keeps what it knows of sharing, the plugin's pooled_memory "
        f"setting (default {DEFAULT_MEMORY}, the plugin's)",
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
        "--manager",
        action="store_true",
        help="also time vLLM's whole KVCacheManager for the same requests: get_computed_blocks "
        "+ allocate_slots, and the free (KVCacheManager.free against the LPC scheduler class's "
        "free path, which announces the release first), with a trusted p on every request, "
        "and a third manager holding the floor queue, the least a queue keyed once per "
        "release does, and a fourth the pooled floor, the floor plus the per-block keys "
        "pooling reads and writes (lpc/benchmarks/manager_bench.py, floor_queue.py)",
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
    from lpc.benchmarks.queue_driver import QueueBenchOptions, run_worker, summary_lines
    from lpc.errors import CommandError

    options = QueueBenchOptions(
        sizes=_sizes(args.sizes),
        budget_blocks=args.budget_blocks,
        evictor=args.evictor,
        pooled_memory=args.pooled_memory,
        mode=args.mode,
        free_blocks=args.free_blocks,
        scan_blocks=args.scan_blocks,
        walks=args.walks,
        switch=args.switch,
        scan=args.scan,
        manager=args.manager,
    )
    python = args.vllm_python
    if not python.exists():
        raise CommandError(
            f"--vllm-python: {python} does not exist; create vLLM's venv with "
            "scripts/setup_vllm_venv.sh or point --vllm-python at one"
        )
    exit_code, record = run_worker(python, options)
    if record is None:
        raise CommandError(f"the queue benchmark failed in {python} (exit {exit_code})")
    if args.json:
        print(json.dumps(record))
    else:
        print("\n".join(summary_lines(record)))
    sys.stdout.flush()
    return 0
