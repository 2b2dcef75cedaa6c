"""A seeded stream of mixed free-queue operations, replayable against any evictor.

Pure Python with no dependency beyond the standard library, so the same stream can be
replayed inside vLLM's own environment against its `FreeKVCacheBlockQueue`.

The stream is a plan of counts (how many blocks to allocate, free, or touch), so it is the
same for every policy: which blocks are popped depends on the policy, but how many are free
never does. Operations are counted per block: popping 8 blocks is 8 operations.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

ALLOCATE, FREE, TOUCH = 0, 1, 2


@dataclass(frozen=True)
class OpPlan:
    num_blocks: int
    steps: list[tuple[int, int, float]]  # (kind, count, probability)
    num_block_ops: int


class QueueAdapter(Protocol):
    def warm(self, num_blocks: int) -> None: ...
    def pop_n(self, n: int) -> list[int]: ...
    def push(self, block_ids: list[int], time_s: float, probability: float) -> None: ...
    def remove(self, block_id: int) -> None: ...
    def is_free(self, block_id: int) -> bool: ...


def make_plan(num_block_ops: int, num_blocks: int = 20_000, seed: int = 0) -> OpPlan:
    """Allocations and frees of 1–16 blocks and single-block touches, ~40/40/20 by count."""
    rng = random.Random(seed)
    free = num_blocks
    steps: list[tuple[int, int, float]] = []
    ops = 0
    while ops < num_block_ops:
        r = rng.random()
        if r < 0.2 and free > 0:
            steps.append((TOUCH, rng.randrange(16), 0.0))
            free -= 1
            ops += 1
            continue
        k = rng.randint(1, 16)
        held = num_blocks - free
        if (r < 0.6 and k <= free and free > num_blocks // 4) or k > held:
            steps.append((ALLOCATE, k, 0.0))
            free -= k
        else:
            steps.append((FREE, k, rng.random()))
            free += k
        ops += k
    return OpPlan(num_blocks, steps, ops)


def replay(plan: OpPlan, adapter: QueueAdapter) -> tuple[float, int]:
    """Run the plan; returns (seconds, block operations actually performed)."""
    adapter.warm(plan.num_blocks)
    held: list[int] = []
    last_freed: list[int] = []
    now = 0.0
    done = 0
    pop_n, push, remove, is_free = adapter.pop_n, adapter.push, adapter.remove, adapter.is_free
    clock = time.perf_counter
    start = clock()
    for kind, count, p in plan.steps:
        if kind == ALLOCATE:
            held.extend(pop_n(count))
            done += count
        elif kind == FREE:
            now += 0.01
            last_freed = held[-count:]
            del held[-count:]
            push(last_freed, now, p)
            done += count
        else:
            # A hit on a recently freed block; if the policy already reused it, the
            # request allocates one block instead, so the free count stays policy-independent.
            block = last_freed[count % len(last_freed)] if last_freed else -1
            if block >= 0 and is_free(block):
                remove(block)
                held.append(block)
            else:
                held.extend(pop_n(1))
            done += 1
    return clock() - start, done


class NullAdapter:
    """Does the driver's bookkeeping with no queue behind it: the loop's own cost."""

    def warm(self, num_blocks: int) -> None:
        self._next = 0
        self._free: set[int] = set()

    def pop_n(self, n: int) -> list[int]:
        out = list(range(self._next, self._next + n))
        self._next += n
        return out

    def push(self, block_ids: list[int], time_s: float, probability: float) -> None:
        return None

    def remove(self, block_id: int) -> None:
        return None

    def is_free(self, block_id: int) -> bool:
        return block_id >= 0


def best_of(runs: int, fn: Callable[[], tuple[float, int]]) -> tuple[float, int]:
    """The fastest of `runs` timings (the least disturbed by the rest of the machine)."""
    results = [fn() for _ in range(runs)]
    return min(results)
