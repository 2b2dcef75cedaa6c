"""Replay the evictor benchmark's operation plan against vLLM's FreeKVCacheBlockQueue.

Runs inside the vLLM virtual environment (see scripts/setup_vllm_venv.sh); `lpc bench evictor`
calls it and reads the last line of its output, a JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lpc.benchmarks.evictor_ops import best_of, make_plan, replay  # noqa: E402


class VllmQueueAdapter:
    """Drives vLLM's queue the way BlockPool does: popleft_n, append_n, remove."""

    def __init__(self) -> None:
        from vllm.v1.core.kv_cache_utils import FreeKVCacheBlockQueue, KVCacheBlock

        self._queue_cls = FreeKVCacheBlockQueue
        self._block_cls = KVCacheBlock

    def warm(self, num_blocks: int) -> None:
        self.blocks = [self._block_cls(i) for i in range(num_blocks)]
        self.queue = self._queue_cls(self.blocks)
        everything = self.queue.popleft_n(num_blocks)
        self.queue.append_n(everything)

    def pop_n(self, n: int) -> list[int]:
        return [b.block_id for b in self.queue.popleft_n(n)]

    def push(self, block_ids: list[int], time_s: float, probability: float) -> None:
        blocks = self.blocks
        self.queue.append_n([blocks[i] for i in block_ids])

    def remove(self, block_id: int) -> None:
        self.queue.remove(self.blocks[block_id])

    def is_free(self, block_id: int) -> bool:
        return self.blocks[block_id].prev_free_block is not None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ops", type=int, default=1_000_000)
    parser.add_argument("--blocks", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    plan = make_plan(args.ops, args.blocks, args.seed)
    seconds, done = best_of(args.runs, lambda: replay(plan, VllmQueueAdapter()))
    print(json.dumps({"ns_per_op_gross": seconds * 1e9 / done, "block_ops": done}))


if __name__ == "__main__":
    main()
