"""One evictor replay in its own process, for instruction counting (see instruction_count).

    python -m lpc.benchmarks.evictor_worker --policy lpc --mode replay --ops 300000

`--mode setup` records the policy's calls and stops; `replay` then replays them on a fresh
evictor; `dispatch` runs the same loop into functions that do nothing. With `--dump FILE` the
recorded calls are written as JSON for vLLM's queue to replay.
"""

from __future__ import annotations

import argparse
import json

from lpc.benchmarks.evictor_bench import POLICIES, record_policy, time_policy
from lpc.benchmarks.evictor_ops import PUSH, dispatch_seconds, make_plan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--policy", choices=sorted(POLICIES), required=True)
    parser.add_argument("--mode", choices=["setup", "replay", "dispatch"], default="replay")
    parser.add_argument("--ops", type=int, default=300_000)
    parser.add_argument("--blocks", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dump", help="write the recorded calls as JSON to this file")
    args = parser.parse_args()
    calls = record_policy(args.policy, make_plan(args.ops, args.blocks, args.seed))
    if args.dump:
        plain = [[k, a if k != PUSH else list(a)] for k, a, _ in calls]
        with open(args.dump, "w") as handle:
            json.dump({"num_blocks": args.blocks, "calls": plain}, handle)
    if args.mode == "replay":
        time_policy(args.policy, calls, args.blocks)
    elif args.mode == "dispatch":
        dispatch_seconds(calls)


if __name__ == "__main__":
    main()
