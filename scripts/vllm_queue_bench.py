"""Replay recorded free-queue calls against vLLM's FreeKVCacheBlockQueue and time them.

Runs inside the vLLM virtual environment (see scripts/setup_vllm_venv.sh); `lpc bench evictor`
writes the calls its lru evictor received to a JSON file, calls this script on it, and reads
the last line of its output, a JSON object with the net ns per block operation.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lpc.benchmarks.evictor_ops import (
    PUSH,
    best_of,
    count_block_ops,
    dispatch_seconds,
    time_calls,
)


def main() -> None:
    from vllm.v1.core.kv_cache_utils import FreeKVCacheBlockQueue, KVCacheBlock

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("calls", type=Path, help="JSON file written by lpc bench evictor")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--mode",
        choices=["time", "setup", "replay", "dispatch"],
        default="time",
        help="time (default): print ns/op; the others run once, for instruction counting",
    )
    args = parser.parse_args()
    spec = json.loads(args.calls.read_text())
    num_blocks = spec["num_blocks"]
    blocks = [KVCacheBlock(i) for i in range(num_blocks)]
    # BlockPool hands the queue block objects: prepare them outside the timed loop.
    calls = [
        (k, blocks[a] if k == 1 else a, ([blocks[i] for i in a],) if k == PUSH else None)
        for k, a in spec["calls"]
    ]

    def once() -> float:
        for block in blocks:
            block.prev_free_block = block.next_free_block = None
        queue = FreeKVCacheBlockQueue(blocks)
        return time_calls(calls, queue.popleft_n, queue.remove, queue.append_n)

    if args.mode != "time":
        if args.mode == "replay":
            once()
        elif args.mode == "dispatch":
            dispatch_seconds(calls)
        return
    seconds = best_of(args.runs, once)
    loop = best_of(args.runs, lambda: dispatch_seconds(calls))
    ops = count_block_ops([(k, a if k != 1 else 0, None) for k, a in spec["calls"]])
    print(json.dumps({"ns_per_op": max(seconds - loop, 0.0) * 1e9 / ops, "block_ops": ops}))


if __name__ == "__main__":
    main()
