"""Prefix closure: an LPC evictor never evicts a cached block while a cached descendant stays.

A later, less likely release by the same conversation lowers a shared parent's key below its
children's (a branch: an edited or regenerated turn). Keys alone would then evict the parent
and keep the children, which no request can reach again. The run heap holds such a parent
back until its subtree is gone (`eviction.run_heap`), and the brute-force references take the
smallest value among the leaves: the two must agree victim for victim.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given

from eviction import FreedBlocks, LPCEvictor, Release, make_evictor
from eviction.lpc_pooled import PooledLPCEvictor
from lpc.blocks.block_manager import CacheRequest, PrefixCacheBlockManager
from tests.eviction.reference import BruteForceLPC
from tests.eviction.reference_pooled import BruteForcePooledLPC
from tests.properties import SEEDS, examples, exercised

BLOCK = 16


def orphan_case_hits(evictor) -> int:
    """The issue's case: turn 1 is X+Y at p = 0.9, turn 2 is X+Z at p = 0.05, then another
    conversation needs eight blocks; turn 3's hit on X (4 blocks, 64 tokens)."""
    manager = PrefixCacheBlockManager(14, block_size=BLOCK, evictor=evictor)
    x, y, z = (list(range(base, base + 4 * BLOCK)) for base in (1000, 2000, 3000))

    def turn(request_id: str, tokens: list[int], now_s: float, p: float) -> None:
        request = CacheRequest(request_id, [*tokens, 7], len(tokens) + 1, conversation_id="A")
        manager.allocate(request, None, now_s)
        manager.check_invariants()
        manager.free(request_id, now_s + 1.0, p)
        manager.check_invariants()

    turn("t1", x + y, 0.0, 0.9)
    turn("t2", x + z, 10.0, 0.05)
    turn("other", list(range(5000, 5000 + 7 * BLOCK)), 20.0, 0.5)  # 8 blocks: the pressure
    third = CacheRequest("t3", [*x, *[9] * BLOCK], 5 * BLOCK, conversation_id="A")
    return manager.find_computed_prefix(third).num_tokens


@pytest.mark.parametrize(
    "make",
    [
        lambda n: LPCEvictor(n),
        lambda n: PooledLPCEvictor(n, model_min_labels=None),  # the predicted p, ungated
    ],
    ids=["lpc", "lpc-pooled"],
)
def test_the_orphan_case_gives_lrus_hits(make) -> None:
    lru = orphan_case_hits(make_evictor("lru", 14))
    assert lru == 4 * BLOCK
    assert orphan_case_hits(make(14)) == lru


def test_a_parent_waits_for_a_child_branch_with_a_higher_key() -> None:
    """Blocks 1-4 are X, 5-8 Y (released with X at p = 0.9), 9-12 Z (released with X again
    at p = 0.05, the same conversation: X takes the lower key). Y's blocks go before X's
    last block, whose descendant they are, though X's key is lower."""
    evictor = LPCEvictor(13)
    evictor.reset(range(13))
    assert evictor.pop_n(13) == list(range(13))
    x, y, z = [1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]
    evictor.push_cached(
        FreedBlocks((x + y)[::-1], list(range(7, -1, -1)), [None] * 8, chain=True),
        Release(1.0, 0.9, "A"),
    )
    for block_id in x:  # turn 2 hits X
        evictor.remove(block_id)
    evictor.push_cached(
        FreedBlocks((x + z)[::-1], list(range(7, -1, -1)), [None] * 8, chain=True),
        Release(2.0, 0.05, "A"),
    )
    evictor.check_invariants()
    order = evictor.pop_n(12)
    assert order == [12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1]
    assert evictor.free_block_ids() == []


def branching_stream(seed: int, num_steps: int = 240) -> list[tuple]:
    """Conversations whose turns sometimes branch (an edit: the next prompt keeps only part
    of the history) with random p, so a parent's newest release is often less likely than a
    cached branch's. Steps: ("alloc", request, t) and ("free", request id, t, p)."""
    rng = random.Random(seed)
    history: dict[str, list[int]] = {}
    steps: list[tuple] = []
    in_flight: dict[str, str] = {}
    now = 0.0
    count = 0
    while len(steps) < num_steps:
        now += rng.random()
        if in_flight and (len(in_flight) >= 3 or rng.random() < 0.5):
            request_id = rng.choice(sorted(in_flight))
            del in_flight[request_id]
            steps.append(("free", request_id, now, rng.choice([None, rng.random()])))
            continue
        idle = sorted(set(history) - set(in_flight.values()))
        if idle and rng.random() < 0.7:
            conv = rng.choice(idle)
            kept = history[conv]
            if rng.random() < 0.4:  # a branch: keep only whole blocks of the history
                kept = kept[: BLOCK * rng.randint(0, len(kept) // BLOCK)]
        else:
            conv = f"c{len(history)}"
            kept = [rng.randrange(4) for _ in range(BLOCK)]  # few system prompts: shared
        prompt = kept + [rng.randrange(1000) for _ in range(rng.randint(1, 3 * BLOCK))]
        output = [rng.randrange(1000) for _ in range(rng.randint(1, BLOCK))]
        count += 1
        request_id = f"r{count}"
        history[conv] = prompt + output
        in_flight[request_id] = conv
        request = CacheRequest(request_id, prompt + output, len(prompt), conversation_id=conv)
        steps.append(("alloc", request, now))
    return steps


def replay(manager: PrefixCacheBlockManager, steps: list[tuple], check: bool) -> list:
    trace = []
    for step in steps:
        if step[0] == "alloc":
            trace.append(manager.allocate(step[1], None, step[2]))
        elif step[1] in manager.active_request_ids():
            manager.free(step[1], step[2], step[3])
        if check:
            manager.check_invariants()
    return trace


PAIRS = {
    "lpc": (lambda n: LPCEvictor(n, fallback_probability=0.3), BruteForceLPC),
    "lpc-pooled": (
        lambda n: PooledLPCEvictor(n, fallback_probability=0.3, model_min_labels=None),
        BruteForcePooledLPC,
    ),
}


def reference(name: str, n: int):
    if name == "lpc":
        return BruteForceLPC(n, fallback_probability=0.3)
    return BruteForcePooledLPC(n, fallback_probability=0.3, model_min_labels=None)


@pytest.mark.parametrize("name", sorted(PAIRS))
@examples(8)
@given(seed=SEEDS)
def test_leaves_first_matches_the_reference_and_never_orphans(name: str, seed: int) -> None:
    """Not vacuous: the stream is kept only if the heap held a parent back there (where keys
    alone would orphan blocks), as it does on most branching streams."""
    evictor = PAIRS[name][0](40)
    held_back = 0
    defer = evictor._defer

    def counting(run, j) -> None:
        nonlocal held_back
        held_back += 1
        defer(run, j)

    evictor._defer = counting
    steps = branching_stream(seed)
    fast = PrefixCacheBlockManager(40, block_size=BLOCK, evictor=evictor)
    slow = PrefixCacheBlockManager(40, block_size=BLOCK, evictor=reference(name, 40))
    fast_trace = replay(fast, steps, check=True)  # the manager's check: no orphan
    slow_trace = replay(slow, steps, check=False)
    for i, (a, b) in enumerate(zip(fast_trace, slow_trace, strict=True)):
        assert a == b, f"seed {seed}, allocation {i}: heap {a} != reference {b}"
    exercised("parents held back", held_back, 0)


@pytest.mark.parametrize("copy_of", ["deepcopy", "pickle"])
def test_a_copy_keeps_its_own_chain_positions(copy_of: str) -> None:
    """The positions a hit reads (`RunHeap._pos`, read through a memoryview) belong to each
    copy: hits and a new release in a copy leave the original's chain and order intact."""
    import copy
    import pickle

    evictor = LPCEvictor(8)
    evictor.reset(range(8))
    evictor.pop_n(8)
    evictor.push_cached(
        FreedBlocks([3, 2, 1, 0], [3, 2, 1, 0], [None] * 4, chain=True), Release(0.0, 0.5, "a")
    )
    twin = copy.deepcopy(evictor) if copy_of == "deepcopy" else pickle.loads(pickle.dumps(evictor))
    twin.remove(1)  # a hit: block 0 becomes 1's explicit parent, 1 block 2's
    twin.push_cached(FreedBlocks([1], [1], [None], 0, chain=True), Release(1.0, 0.9, "b"))
    twin.check_invariants()
    evictor.check_invariants()
    assert evictor._pos_of[1] == 2 and twin._pos_of[1] == 0  # its own run now
    assert twin.pop_n(4) == [3, 2, 1, 0] and evictor.pop_n(4) == [3, 2, 1, 0]
