"""Replay recorded free-queue calls against vLLM's FreeKVCacheBlockQueue and time them.

    .vllm-venv/bin/python -m lpc.benchmarks.evictor_vllm_worker lru-calls.json

Runs inside the vLLM virtual environment (see scripts/setup_vllm_venv.sh); `lpc bench evictor`
writes the calls its lru evictor received to a JSON file, runs this module on it, and reads
the last line of its output: the same JSON timing record our evictors' worker prints
(`lpc/benchmarks/evictor_worker.py`), so both sides are timed by the same code, each in a
process of its own.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from lpc.benchmarks.evictor_ops import (
    PUSH,
    REMOVE,
    REPLAY_MODES,
    read_calls,
    run_mode,
)


def main() -> None:
    from vllm.v1.core.kv_cache_utils import FreeKVCacheBlockQueue, KVCacheBlock

    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__)
    parser.add_argument("calls", type=Path, help="JSON file written by lpc bench evictor")
    parser.add_argument("--repeats", type=int, default=3, help="replays per timing; best kept")
    parser.add_argument(
        "--mode",
        choices=REPLAY_MODES,
        default="time",
        help="time (default): print the timing; the others run once, for instruction counting",
    )
    args = parser.parse_args()
    num_blocks, raw = read_calls(args.calls)
    blocks = [KVCacheBlock(i) for i in range(num_blocks)]
    # BlockPool hands the queue block objects: prepare them outside the timed loop.
    calls = [
        (
            kind,
            blocks[arg] if kind == REMOVE else arg,
            ([blocks[i] for i in arg],) if kind == PUSH else None,
        )
        for kind, arg, _ in raw
    ]

    def fresh():
        for block in blocks:
            block.prev_free_block = block.next_free_block = None
        queue = FreeKVCacheBlockQueue(blocks)
        return queue.popleft_n, queue.remove, queue.append_n

    run_mode(args.mode, calls, fresh, args.repeats)


if __name__ == "__main__":
    main()
