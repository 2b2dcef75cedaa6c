"""Replays one policy's recorded calls in a process of its own, and prints the timing as JSON.

    python -m lpc.benchmarks.evictor_worker --policy lpc --calls lpc-calls.json

`lpc bench evictor` runs every implementation this way, ours here and vLLM's queue through
`scripts/vllm_queue_bench.py`, so each is timed in a fresh interpreter that holds only its own
calls. The other modes run once, for instruction counting (see instruction_count): `setup`
loads and prepares the calls and stops; after the same setup and a fresh evictor, `replay`
replays them, `loop` runs the replay loop alone, and `dispatch` the loop with a no-op call
per operation.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from eviction import Evictor, FreedBlocks, LPCEvictor, LRUEvictor, Release
from lpc.benchmarks.evictor_ops import (
    PUSH,
    REMOVE,
    Call,
    Methods,
    dispatch_seconds,
    loop_seconds,
    measure,
    read_calls,
    time_calls,
)

POLICIES: dict[str, type[Evictor]] = {"lru": LRUEvictor, "lpc": LPCEvictor}
MODES = ("time", "setup", "replay", "loop", "dispatch")


def prepare(calls: list[Call], num_blocks: int) -> list[Call]:
    """Our evictors' arguments, with every block id one of the pool's own int objects.

    A block manager's ids all come from its pool (popped, then held in block tables), so a
    queue sees the same few thousand int objects over and over, as vLLM's queue sees its
    block objects; ids parsed from JSON would be a million distinct objects instead.
    PUSH calls carry the blocks deepest first and the release.
    """
    pool_ids = list(range(num_blocks))
    prepared: list[Call] = []
    for kind, arg, meta in calls:
        if kind == PUSH:
            ids = [pool_ids[b] for b in arg]  # type: ignore[attr-defined]
            n = len(ids)
            freed = FreedBlocks(ids, range(n - 1, -1, -1), [None] * n)
            prepared.append((kind, ids, (freed, Release(*meta))))  # type: ignore[misc]
        elif kind == REMOVE:
            prepared.append((kind, pool_ids[arg], None))  # type: ignore[index]
        else:
            prepared.append((kind, arg, None))
    return prepared


def fresh_methods(policy: str, num_blocks: int) -> Methods:
    """A new evictor with every block free and uncached; its three free-queue calls."""
    evictor = POLICIES[policy](num_blocks)
    evictor.reset(range(num_blocks))
    return evictor.pop_n, evictor.remove, evictor.push_cached


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--policy", choices=sorted(POLICIES), required=True)
    parser.add_argument("--calls", required=True, help="JSON file of recorded calls")
    parser.add_argument("--mode", choices=MODES, default="time")
    parser.add_argument("--repeats", type=int, default=3, help="replays per timing; best kept")
    args = parser.parse_args(argv)
    num_blocks, raw = read_calls(args.calls)
    calls = prepare(raw, num_blocks)
    if args.mode == "time":
        timing = measure(calls, lambda: fresh_methods(args.policy, num_blocks), args.repeats)
        print(json.dumps(asdict(timing)))
    elif args.mode != "setup":
        methods = fresh_methods(args.policy, num_blocks)  # in every counted mode alike
        if args.mode == "replay":
            time_calls(calls, *methods)
        elif args.mode == "loop":
            loop_seconds(calls)
        else:
            dispatch_seconds(calls)


if __name__ == "__main__":
    main()
