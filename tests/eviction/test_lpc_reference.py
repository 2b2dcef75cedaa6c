"""The heap-based LPC evictor picks exactly the victims of the paper's brute-force formula."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given

from eviction import FreedBlocks, LPCEvictor, Release
from eviction.run_heap import Ghost, Run
from lpc.blocks.block_manager import CacheRequest, PrefixCacheBlockManager
from tests.eviction.reference import BruteForceLPC
from tests.lpc.streams import Allocate, Free, random_stream
from tests.properties import SEEDS, examples, exercised

# request id() -> (the request, block size, algorithm, its block hashes): a stream is replayed
# by two managers (the fast evictor's and the reference's) with the same hasher, and hashing
# is the same for both, so it is done once. The entry holds the request, so its id() cannot be
# reused while the entry stands.
_HASHES: dict[int, tuple[CacheRequest, int, str, list]] = {}


def hashes_of(manager: PrefixCacheBlockManager, request: CacheRequest) -> list:
    """`manager.block_hashes_of(request)`, computed once per request and hasher."""
    hasher = manager.hasher
    entry = _HASHES.get(id(request))
    if (
        entry is not None
        and entry[0] is request
        and (entry[1], entry[2]) == (hasher.block_size, hasher.algorithm)
    ):
        return entry[3]
    hashes = manager.block_hashes_of(request)
    if len(_HASHES) > 20_000:
        _HASHES.clear()
    _HASHES[id(request)] = (request, hasher.block_size, hasher.algorithm, hashes)
    return hashes


def replay(manager: PrefixCacheBlockManager, steps) -> list:
    trace = []
    for step in steps:
        if isinstance(step, Allocate):
            prefix = manager.find_computed_prefix(step.request, hashes_of(manager, step.request))
            trace.append(manager.allocate(step.request, prefix, step.now_s))
        elif step.request_id in manager.active_request_ids():
            manager.free(step.request_id, step.now_s, step.probability)
    return trace


def with_tied_keys(steps: list) -> list:
    """The stream with releases at whole seconds and only two probabilities (one of them the
    fallback), so that many runs share a key and the tie rules decide the victims."""
    return [
        dataclasses.replace(
            step,
            now_s=float(int(step.now_s)),
            probability=None if int(step.now_s) % 2 else 0.3,
        )
        if isinstance(step, Free)
        else step
        for step in steps
    ]


@pytest.mark.parametrize("tied", [False, True], ids=["distinct-keys", "tied-keys"])
@examples(20)
@given(seed=SEEDS)
def test_lpc_matches_brute_force_reference(seed: int, tied: bool) -> None:
    steps = random_stream(seed, 400)
    if tied:
        steps = with_tied_keys(steps)
    fast = PrefixCacheBlockManager(
        48, block_size=4, evictor=LPCEvictor(48, fallback_probability=0.3)
    )
    slow = PrefixCacheBlockManager(
        48, block_size=4, evictor=BruteForceLPC(48, fallback_probability=0.3)
    )
    fast_trace = replay(fast, steps)
    slow_trace = replay(slow, steps)
    for i, (a, b) in enumerate(zip(fast_trace, slow_trace, strict=True)):
        assert a == b, f"seed {seed}, allocation {i}: heap {a} != reference {b}"
    assert fast.counters == slow.counters
    evictions = sum(len(a.evicted_block_ids) for a in fast_trace if a is not None)
    exercised("evictions", evictions, 20)  # the stream puts the pool under pressure


def test_max_pooling_keeps_a_shared_block_alive() -> None:
    """A block shared with a likely-to-continue conversation outlives an unshared peer."""
    evictor = LPCEvictor(8)
    manager = PrefixCacheBlockManager(8, block_size=2, evictor=evictor)
    a = CacheRequest("a", [1, 2, 3, 4, 5], 4, conversation_id="A")
    b = CacheRequest("b", [1, 2, 7, 8, 9], 4, conversation_id="B")
    table_a = manager.allocate(a, manager.find_computed_prefix(a), 0.0).block_ids
    table_b = manager.allocate(b, manager.find_computed_prefix(b), 0.0).block_ids
    shared = table_a[0]
    assert table_b[0] == shared
    manager.free("a", 1.0, probability=0.9)  # b still holds the shared block
    manager.free("b", 1.0, probability=0.05)
    assert evictor.pooled_key(shared) == pytest.approx(evictor.key_for(Release(1.0, 0.9, "A")))
    assert evictor.pooled_key(table_b[1]) == pytest.approx(evictor.key_for(Release(1.0, 0.05, "B")))
    cached_order = [blk for blk in evictor.free_block_ids() if manager.block_hash(blk)]
    assert cached_order.index(table_b[1]) < cached_order.index(shared)


def test_a_conversations_newest_prediction_replaces_its_older_one() -> None:
    evictor = LPCEvictor(8)
    manager = PrefixCacheBlockManager(8, block_size=2, evictor=evictor)
    first = CacheRequest("t1", [1, 2, 3], 2, conversation_id="A")
    manager.allocate(first, None, 0.0)
    manager.free("t1", 1.0, probability=0.9)
    second = CacheRequest("t2", [1, 2, 3, 4, 5], 4, conversation_id="A")
    table = manager.allocate(second, None, 2.0).block_ids
    manager.free("t2", 3.0, probability=0.1)
    assert evictor.pooled_key(table[0]) == pytest.approx(evictor.key_for(Release(3.0, 0.1, "A")))


def test_released_runs_and_their_ghosts_have_every_slot_set() -> None:
    """The release and hit paths build Run and Ghost slot by slot (no __init__ frame): none
    may be missed."""
    evictor = LPCEvictor(8)
    evictor.reset(range(8))
    blocks = evictor.pop_n(3)
    evictor.push_cached(FreedBlocks(blocks, [2, 1, 0], [None] * 3), Release(1.0, 0.4, "A"))
    run = evictor._state[blocks[0]]
    assert type(run) is Run
    reference = Run(run.key, "A", blocks, [2, 1, 0], run.seq)
    for slot in Run.__slots__:
        assert getattr(run, slot) == getattr(reference, slot), slot
    evictor.remove(blocks[0])
    ghost = evictor._state[blocks[0]]
    assert type(ghost) is Ghost and run.ghost is ghost
    for slot in Ghost.__slots__:
        assert getattr(ghost, slot) == getattr(Ghost(run.key, "A"), slot), slot
