"""Replays one policy's recorded calls in a process of its own, and prints the timing as JSON.

    python -m lpc.benchmarks.evictor_worker --policy lpc --calls lpc-calls.json

`lpc bench evictor` runs every implementation this way, ours here and vLLM's queue through
`evictor_vllm_worker` in vLLM's venv, so each is timed in a fresh interpreter that holds only
its own calls. The other modes run once, for instruction counting (see instruction_count): after
the same setup and a fresh evictor, `replay` replays the calls, `loop` runs the replay loop
alone, and `dispatch` the loop with a no-op call per operation.
"""

from __future__ import annotations

import argparse

from eviction import POLICIES, Evictor, FreedBlocks, Release, make_evictor
from lpc.benchmarks.evictor_ops import (
    PUSH,
    REMOVE,
    REPLAY_MODES,
    Call,
    Methods,
    read_calls,
    run_mode,
)

# Every registered policy a deployment could run (upper bounds need a trace's future).
TIMEABLE_POLICIES = tuple(name for name, e in POLICIES.items() if e.kind != "upper bound")
DEFAULT_TIMED_POLICIES = ("lru", "lpc")


def new_evictor(policy: str, num_blocks: int) -> Evictor:
    """The policy's evictor with every block free and uncached."""
    evictor = make_evictor(policy, num_blocks)
    evictor.reset(range(num_blocks))
    return evictor


class Replayer:
    """One evictor, reset before each replay, and the calls prepared for it.

    A block manager's block ids are the evictor's own int objects: it pops them, holds them
    in block tables and hands the same objects back, just as vLLM's queue sees only its own
    block objects. So the prepared calls use the ids this evictor hands out, not ids parsed
    from JSON (a million distinct objects) nor a second copy of the pool's ids. PUSH calls
    carry the blocks deepest first and the release.
    """

    def __init__(self, policy: str, num_blocks: int, calls: list[Call]) -> None:
        self.evictor = new_evictor(policy, num_blocks)
        self.pool_ids = sorted(self.evictor.pop_n(num_blocks))
        self.calls = self._prepare(calls)

    def _prepare(self, calls: list[Call]) -> list[Call]:
        pool_ids = self.pool_ids
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

    def fresh(self) -> Methods:
        """The evictor with every block free and uncached again; its three free-queue calls."""
        evictor = self.evictor
        evictor.reset(self.pool_ids)
        return evictor.pop_n, evictor.remove, evictor.push_cached


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__)
    parser.add_argument("--policy", choices=TIMEABLE_POLICIES, required=True)
    parser.add_argument("--calls", required=True, help="JSON file of recorded calls")
    parser.add_argument("--mode", choices=REPLAY_MODES, default="time")
    parser.add_argument("--repeats", type=int, default=3, help="replays per timing; best kept")
    args = parser.parse_args(argv)
    num_blocks, raw = read_calls(args.calls)
    replayer = Replayer(args.policy, num_blocks, raw)
    run_mode(args.mode, replayer.calls, replayer.fresh, args.repeats)


if __name__ == "__main__":
    main()
