"""A preempted request's blocks (`push_protected`) go after every block queued so far.

LRU appends a preempted request's blocks at its tail: they are evicted last among the free
blocks of that moment, and blocks released later go after them. `push_protected` gives LPC the
same place whatever the predictions were: after every queued block, including blocks raised by
max pooling (`lpc`) or by OR pooling and the shared floor (`lpc-pooled`); and with one p for
every release it is exactly an ordinary release at that time, so `lpc-const` stays LRU.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import assume, given

from eviction import FreedBlocks, Release
from eviction.lpc import LPCEvictor
from eviction.lpc_pooled import PooledLPCEvictor
from tests.properties import SEEDS, examples

NUM_BLOCKS = 60


def freed(block_ids: list[int], conversation: int) -> FreedBlocks:
    """Blocks of one request, tail first (deepest first), with content hashes that repeat
    across conversations for the first blocks (a shared system prompt). The random histories
    below draw them from any blocks, so they are no real sequence's tail: not a chain (prefix
    closure is tested in test_prefix_closure.py)."""
    depths = list(range(len(block_ids), 0, -1))
    hashes = [b"system" if d == 1 else f"c{conversation}-{d}".encode() for d in depths]
    return FreedBlocks(block_ids, depths, hashes)


def random_history(
    evictor: LPCEvictor, rng: random.Random, constant_p: float | None
) -> tuple[float, set[int]]:
    """Random releases, hits and evictions; returns the clock and the blocks held now."""
    evictor.reset(range(NUM_BLOCKS))
    held: set[int] = set()
    now = 0.0
    for _ in range(300):
        now += rng.random() * 20
        free = NUM_BLOCKS - len(held)
        if held and (rng.random() < 0.5 or free == 0):
            ids = rng.sample(sorted(held), rng.randint(1, min(4, len(held))))
            held.difference_update(ids)
            p = constant_p if constant_p is not None else rng.choice([None, rng.random()])
            release = Release(now, p, f"c{rng.randrange(5)}")
            if rng.random() < 0.2:  # others still hold some of them: pooling metadata only
                evictor.note_shared_release(freed(ids, rng.randrange(5)), release)
                held.update(ids)
            else:
                evictor.push_cached(freed(ids, rng.randrange(5)), release)
        else:
            n = rng.randint(1, min(4, free))
            if rng.random() < 0.3:  # hits: blocks leave the queue without being evicted
                queued = evictor.free_block_ids()
                for block_id in rng.sample(queued, min(n, len(queued))):
                    evictor.remove(block_id)
                    held.add(block_id)
            else:
                held.update(evictor.pop_n(n, now))
    return now, held


@pytest.mark.parametrize("evictor_class", [LPCEvictor, PooledLPCEvictor])
@examples(12)
@given(seed=SEEDS)
def test_protected_blocks_go_after_every_queued_block(
    evictor_class: type[LPCEvictor], seed: int
) -> None:
    rng = random.Random(seed)
    evictor = evictor_class(NUM_BLOCKS)
    now, held = random_history(evictor, rng, constant_p=None)
    assume(held)  # a history that ends holding blocks, to preempt some of them
    preempted = sorted(held)[: rng.randint(1, len(held))]
    evictor.push_protected(freed(preempted, 99), Release(now + 1.0, 0.0, "preempted"))
    evictor.check_invariants()
    order = evictor.pop_n(len(evictor), now + 2.0)
    assert set(order[-len(preempted) :]) == set(preempted)
    # Within the request, LRU's order too: the tail (deepest block) before the head.
    assert order[-len(preempted) :] == preempted


@examples(8)
@given(seed=SEEDS)
def test_with_one_p_a_protected_release_is_an_ordinary_one(seed: int) -> None:
    """`lpc-const`: the same victims, in the same order, as a release at the same time."""
    orders = []
    for protect in (False, True):
        rng = random.Random(seed)
        evictor = LPCEvictor(NUM_BLOCKS, fallback_probability=0.5)
        now, held = random_history(evictor, rng, constant_p=0.5)
        ids = sorted(held)
        release = Release(now + 1.0, None, "c1")
        if protect:
            evictor.push_protected(freed(ids, 1), release)
        else:
            evictor.push_cached(freed(ids, 1), release)
        later = Release(now + 2.0, None, "c2")
        evictor.push_cached(freed(evictor.pop_n(3, now + 2.0), 2), later)
        orders.append(evictor.pop_n(len(evictor), now + 3.0))
    assert orders[0] == orders[1]


def test_blocks_released_later_rank_by_their_own_keys() -> None:
    """Protection is LRU's tail, not a pin: a later release with the same p goes after."""
    evictor = LPCEvictor(4)
    evictor.reset(range(4))
    held = evictor.pop_n(4, 0.0)
    evictor.push_cached(FreedBlocks([held[0]], [1], [b"a"]), Release(1.0, 0.9, "a"))
    evictor.push_protected(FreedBlocks([held[1]], [1], [b"b"]), Release(2.0, 0.01, "b"))
    evictor.push_cached(FreedBlocks([held[2]], [1], [b"c"]), Release(3.0, 0.9, "c"))
    evictor.push_cached(FreedBlocks([held[3]], [1], [b"d"]), Release(4.0, 0.2, "d"))
    assert evictor.pop_n(4, 5.0) == [held[3], held[0], held[1], held[2]]
