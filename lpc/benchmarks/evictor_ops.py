"""A seeded multi-turn chat workload at the level of free-queue operations.

Pure Python with no dependency beyond the standard library, so the same plan can be replayed
inside vLLM's own environment against its `FreeKVCacheBlockQueue`. A turn starts (its
conversation's cached chain is hit block by block from the root until the first block the
policy already evicted, then new blocks are popped) and ends (the whole chain is released,
deepest block first, with the conversation's id and a continuation probability). Which blocks
are popped depends on the policy, so each policy's operations are counted and timed on its own
replay; operations are counted per block. docs/design.md, "Evictor speed".
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

START_TURN, END_TURN = 0, 1


@dataclass(frozen=True)
class OpPlan:
    num_blocks: int
    steps: list[tuple[int, int, int, float]]  # (kind, conversation slot, new blocks, p)
    approx_block_ops: int


POP, REMOVE, PUSH = 0, 1, 2
# A recorded call: (POP, n, None) | (REMOVE, block id, None) | (PUSH, block ids, (t, p, conv))
Call = tuple[int, object, object]


class Queue(Protocol):
    """The three free-queue calls a block manager makes, by block id."""

    def pop_n(self, n: int) -> list[int]: ...
    def remove(self, block_id: int) -> None: ...


def make_plan(
    num_block_ops: int,
    num_blocks: int = 20_000,
    seed: int = 0,
    max_active: int = 64,
    max_new_blocks: int = 64,
) -> OpPlan:
    """Conversations of a few turns, each turn adding 1..max_new_blocks blocks to its chain."""
    rng = random.Random(seed)
    steps: list[tuple[int, int, int, float]] = []
    in_flight: dict[int, int] = {}  # slot -> blocks its chain will hold
    idle: dict[int, int] = {}
    turns_left: dict[int, int] = {}
    next_slot = 0
    ops = 0
    while ops < num_block_ops:
        if in_flight and (rng.random() < 0.5 or len(in_flight) >= max_active):
            slot = rng.choice(list(in_flight))
            chain = in_flight.pop(slot)
            steps.append((END_TURN, slot, 0, rng.random()))
            ops += chain
            turns_left[slot] -= 1
            if turns_left[slot] > 0:
                idle[slot] = chain
            else:
                del turns_left[slot]
            continue
        if idle and rng.random() < 0.7:
            slot = rng.choice(list(idle))
            chain = idle.pop(slot)
        else:
            slot, chain = next_slot, 0
            next_slot += 1
            turns_left[slot] = rng.randint(1, 8)
        new = rng.randint(1, max_new_blocks)
        if chain + new > num_blocks // (2 * max_active):
            new = 1
        steps.append((START_TURN, slot, new, 0.0))
        in_flight[slot] = chain + new
        ops += chain + new  # hits (removals) plus pops, at most
    return OpPlan(num_blocks, steps, ops)


def record(plan: OpPlan, queue: Queue, push: Callable[[list[int], tuple], None]) -> list[Call]:
    """Drive `queue` through the plan and return the exact calls made, in order.

    Like a block manager, the driver decides from its own book-keeping (reference counts and
    whether a block was handed out again since) which chain blocks are still cached; the queue
    is only asked to remove, pop and append. The calls depend on the policy (which blocks it
    pops), so each policy is recorded on its own and then timed replaying its own calls.
    """
    num_blocks = plan.num_blocks
    content = [0] * num_blocks  # bumped each time a block is handed out again
    in_use = [False] * num_blocks
    chains: dict[int, list[tuple[int, int]]] = {}
    names: dict[int, str] = {}  # one id object per conversation, as a server would hold it
    calls: list[Call] = []
    now = 0.0
    free = num_blocks
    for kind, slot, new, p in plan.steps:
        if kind == START_TURN:
            hits: list[tuple[int, int]] = []
            for block, version in chains.get(slot, ()):
                if in_use[block] or content[block] != version:
                    break
                queue.remove(block)
                calls.append((REMOVE, block, None))
                in_use[block] = True
                hits.append((block, version))
            free -= len(hits)
            new = min(new, free)
            if new:
                calls.append((POP, new, None))
                for block in queue.pop_n(new):
                    in_use[block] = True
                    content[block] += 1
                    hits.append((block, content[block]))
            free -= new
            chains[slot] = hits
        else:
            now += 0.05
            released = [block for block, _ in reversed(chains[slot])]
            for block in released:
                in_use[block] = False
            free += len(released)
            if released:
                name = names.get(slot)
                if name is None:
                    name = names[slot] = f"c{slot}"
                meta = (now, p, name)
                push(released, meta)
                calls.append((PUSH, released, meta))
    return calls


def count_block_ops(calls: list[Call]) -> int:
    """Blocks touched by the calls: a pop of n or a push of n blocks counts n."""
    total = 0
    for kind, arg, _ in calls:
        total += arg if kind == POP else 1 if kind == REMOVE else len(arg)  # type: ignore[arg-type]
    return total


def time_calls(
    calls: list[Call],
    pop_n: Callable[[int], object],
    remove: Callable[[object], object],
    push: Callable[..., object],
) -> float:
    """Seconds to replay prepared calls: PUSH carries the target's own argument tuple."""
    clock = time.perf_counter
    start = clock()
    for kind, arg, prepared in calls:
        if kind == POP:
            pop_n(arg)
        elif kind == REMOVE:
            remove(arg)
        else:
            push(*prepared)  # type: ignore[misc]
    return clock() - start


def loop_seconds(calls: list[Call]) -> float:
    """The replay loop alone: the same iteration and branches, no call."""
    clock = time.perf_counter
    start = clock()
    for kind, _arg, _prepared in calls:
        if kind == POP:  # noqa: SIM114 (the same branches as time_calls, without the calls)
            pass
        elif kind == REMOVE:
            pass
        else:
            pass
    return clock() - start


def dispatch_seconds(calls: list[Call]) -> float:
    """The loop plus a call per operation into a function that does nothing."""

    def nothing(*_: object) -> None:
        return None

    return time_calls(calls, nothing, nothing, nothing)


def best_of(runs: int, fn: Callable[[], float]) -> float:
    """The fastest of `runs` timings (the one least disturbed by the rest of the machine)."""
    return min(fn() for _ in range(runs))


@dataclass(frozen=True)
class ReplayTiming:
    """Best-of-n seconds for one replay, for the bare loop, and for the loop with no-op calls.

    `seconds − loop_seconds` is the operations' cost as a block manager pays it, the Python
    call included; `seconds − noop_call_seconds` is their bodies alone.
    """

    seconds: float
    loop_seconds: float
    noop_call_seconds: float
    block_ops: int


Methods = tuple[Callable[[int], object], Callable[[object], object], Callable[..., object]]


def measure(calls: list[Call], fresh: Callable[[], Methods], repeats: int) -> ReplayTiming:
    """Time `repeats` replays, each on a fresh queue from `fresh()`, and both baselines."""

    def once() -> float:
        return time_calls(calls, *fresh())

    return ReplayTiming(
        seconds=best_of(repeats, once),
        loop_seconds=best_of(repeats, lambda: loop_seconds(calls)),
        noop_call_seconds=best_of(repeats, lambda: dispatch_seconds(calls)),
        block_ops=count_block_ops(calls),
    )


REPLAY_MODES = ("time", "replay", "loop", "dispatch")


def run_mode(mode: str, calls: list[Call], fresh: Callable[[], Methods], repeats: int) -> None:
    """What a replay process does: `time` prints its `ReplayTiming` as one JSON line; the
    others run once, for instruction counting: after a fresh queue (in every counted mode
    alike) `replay` replays the calls, `loop` runs the replay loop alone, `dispatch` the loop
    with a no-op call per operation."""
    if mode == "time":
        print(json.dumps(asdict(measure(calls, fresh, repeats))))
        return
    methods = fresh()
    if mode == "replay":
        time_calls(calls, *methods)
    elif mode == "loop":
        loop_seconds(calls)
    else:
        dispatch_seconds(calls)


def write_calls(path: str | Path, num_blocks: int, calls: list[Call]) -> None:
    """Recorded calls as JSON: PUSH keeps its block ids and (time, p, conversation)."""
    plain = [
        [kind, list(arg) if kind == PUSH else arg, list(meta) if kind == PUSH else None]  # type: ignore[call-overload,arg-type]
        for kind, arg, meta in calls
    ]
    Path(path).write_text(json.dumps({"num_blocks": num_blocks, "calls": plain}))


def read_calls(path: str | Path) -> tuple[int, list[Call]]:
    """(pool size, calls) from a file `write_calls` wrote, checked as it is read."""
    try:
        spec = json.loads(Path(path).read_text())
        num_blocks = int(spec["num_blocks"])
        calls: list[Call] = []
        for kind, arg, meta in spec["calls"]:
            if kind not in (POP, REMOVE, PUSH):
                raise ValueError(f"unknown call kind {kind!r}")
            calls.append((kind, arg, tuple(meta) if kind == PUSH else None))
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{path}: not a recorded call file ({error})") from error
    return num_blocks, calls
