"""session-ref (`eviction/session_ref.py`) evicts exactly what the plain reading of SGLang's
session references evicts: unreferenced free blocks first, then referenced ones, each in
release order, a session referencing its latest chain until it is idle past the timeout."""

from __future__ import annotations

import pytest
from hypothesis import given

from eviction import FreedBlocks, Release, SessionRefEvictor
from lpc.blocks.block_manager import PrefixCacheBlockManager
from tests.eviction.kv_policy_streams import drive, exercised_enough
from tests.eviction.reference_kv_policies import PlainSessionRef
from tests.eviction.test_lpc_reference import replay
from tests.lpc.streams import random_stream
from tests.properties import SEEDS, examples, exercised


@pytest.mark.parametrize("timeout_s", [0.0, 4.0, 15.0, 1e9])
@examples(10)
@given(seed=SEEDS)
def test_victims_match_the_plain_reference_on_random_streams(seed: int, timeout_s: float) -> None:
    fast = SessionRefEvictor(24, timeout_s)
    plain = PlainSessionRef(24, timeout_s)
    exercised_enough(drive(fast, plain, seed, 24))


@pytest.mark.parametrize("timeout_s", [3.0, 30.0])
@examples(8)
@given(seed=SEEDS)
def test_block_manager_allocations_match_the_plain_reference(seed: int, timeout_s: float) -> None:
    steps = random_stream(seed, 400)
    fast = PrefixCacheBlockManager(48, block_size=4, evictor=SessionRefEvictor(48, timeout_s))
    plain = PrefixCacheBlockManager(48, block_size=4, evictor=PlainSessionRef(48, timeout_s))
    fast_trace = replay(fast, steps)
    plain_trace = replay(plain, steps)
    assert fast_trace == plain_trace
    assert fast.counters == plain.counters
    exercised("evictions", sum(len(a.evicted_block_ids) for a in fast_trace if a is not None), 20)


def chain(ids: list[int]) -> FreedBlocks:
    return FreedBlocks(ids[::-1], list(range(len(ids) - 1, -1, -1)), [None] * len(ids))


def test_a_live_session_outranks_older_and_newer_unreferenced_blocks() -> None:
    ev = SessionRefEvictor(9, timeout_s=100.0)
    ev.reset(range(9))
    b = ev.pop_n(9)
    ev.push_cached(chain(b[0:3]), Release(0.0, None, "s1"))  # s1, live until 100 s
    ev.push_cached(chain(b[3:6]), Release(5.0, None, None))  # no session
    ev.push_cached(chain(b[6:9]), Release(8.0, None, "s2"))
    ev.remove(b[6])  # s2's next turn hits its prefix...
    ev.push_cached(chain([b[6]]), Release(20.0, None, "s2"))  # ...and moves its reference
    # unreferenced first (the anonymous chain, then s2's abandoned tail), then s1, then s2
    assert ev.free_block_ids(30.0) == [b[5], b[4], b[3], b[8], b[7], b[2], b[1], b[0], b[6]]
    # past s1's timeout (idle > 100 s) its blocks are ordinary unreferenced ones again
    assert ev.free_block_ids(101.0)[:6] == [b[2], b[1], b[0], b[5], b[4], b[3]]


def test_both_calls_of_one_release_make_one_chain() -> None:
    ev = SessionRefEvictor(6, timeout_s=50.0)
    ev.reset(range(6))
    b = ev.pop_n(6)
    release = Release(1.0, None, "s")
    ev.push_cached(chain(b[2:4]), release)
    ev.note_shared_release(FreedBlocks([b[1], b[0]], [1, 0], [None, None]), release)
    assert all(ev.referenced(x) for x in b[0:4])
    ev.push_cached(FreedBlocks([b[1], b[0]], [1, 0], [None, None]), Release(2.0, None, "t"))
    assert ev.referenced(b[0]) and ev.referenced(b[1])  # s still holds them
    ev.push_cached(chain(b[4:6]), Release(3.0, None, "s"))  # s moves on: b0..b3 keep only t's
    assert [ev.referenced(x) for x in b] == [True, True, False, False, True, True]


def test_an_evicted_block_takes_no_reference_to_its_new_content() -> None:
    ev = SessionRefEvictor(2, timeout_s=1e9)
    ev.reset(range(2))
    b = ev.pop_n(2)
    ev.push_cached(chain(b), Release(0.0, None, "s"))
    popped = ev.pop_n(1, 1.0)
    ev.push_cached(chain(popped), Release(2.0, None, None))  # new content, no session
    assert not ev.referenced(popped[0])
    ev.check_invariants()


def test_session_ref_rejects_a_bad_timeout() -> None:
    for bad in (-1.0, float("nan"), "300"):
        with pytest.raises(ValueError, match="timeout_s"):
            SessionRefEvictor(4, bad)
