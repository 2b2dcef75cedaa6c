"""`lpc-pooled`: OR pooling, the shared-prefix floor and its online estimate, against a
brute-force reference and on small hand-made cases."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eviction import FreedBlocks, PooledLPCEvictor, Release, static_key
from lpc.blocks.block_manager import PrefixCacheBlockManager
from tests.eviction.reference_pooled import BruteForcePooledLPC
from tests.eviction.test_lpc_reference import replay
from tests.lpc.streams import random_stream


def _freed(blocks: list[int], hashes: list[bytes | None]) -> FreedBlocks:
    return FreedBlocks(blocks, list(range(len(blocks) - 1, -1, -1)), hashes)


# The trust gate: off; on after 8 judged releases; on from the start with a negative margin
# (the random stream's p carries no information, so only a margin lets the model back in).
GATES = [(None, 0.0), (8, 0.0), (0, -0.2)]


# The memory window and label horizon: short (many entries expire within a stream) and the
# shipped 600 s / 180 s.
WINDOWS = [(20.0, 10.0), (600.0, 180.0)]


@settings(max_examples=18, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    window=st.sampled_from(WINDOWS),
    gate=st.sampled_from(GATES),
    memory=st.sampled_from(["content", "blocks", "chains"]),
)
def test_lpc_pooled_matches_brute_force_reference(
    seed: int, window: tuple[float, float], gate: tuple[int | None, float], memory: str
) -> None:
    """On any random stream, the heap evictor hands out the reference's victims in the
    reference's order, for every memory window and trust gate, with either memory."""
    window_s, horizon_s = window
    min_labels, margin_nats = gate
    steps = random_stream(seed, 400)
    # The memory's size bound is left out of the reference (it has its own test below).
    fast_evictor = PooledLPCEvictor(
        48,
        fallback_probability=0.3,
        memory_window_s=window_s,
        horizon_s=horizon_s,
        memory_blocks_factor=1e6,
        model_min_labels=min_labels,
        model_margin_nats=margin_nats,
        memory=memory,
    )
    fast = PrefixCacheBlockManager(48, block_size=4, evictor=fast_evictor)
    slow = PrefixCacheBlockManager(
        48,
        block_size=4,
        evictor=BruteForcePooledLPC(
            48,
            fallback_probability=0.3,
            memory_window_s=window_s,
            horizon_s=horizon_s,
            model_min_labels=min_labels,
            model_margin_nats=margin_nats,
            memory=memory,
        ),
    )
    fast_trace = replay(fast, steps)
    slow_trace = replay(slow, steps)
    evictions = sum(len(a.evicted_block_ids) for a in fast_trace if a is not None)
    assert evictions > 20, "the stream must put the pool under pressure"
    assert fast_evictor.shared_releases_judged > 0, "the stream must share prefixes"
    if min_labels is not None:
        assert fast_evictor.model_labels_judged > 8, "the stream must judge the model"
    for i, (a, b) in enumerate(zip(fast_trace, slow_trace, strict=True)):
        assert a == b, f"seed {seed}, allocation {i}: heap {a} != reference {b}"
    assert fast.counters == slow.counters
    fast_evictor.check_invariants()


def test_or_pooling_combines_two_conversations() -> None:
    """Two conversations at p = 0.5 released together: either comes back with 0.75."""
    evictor = PooledLPCEvictor(8, scale_per_s=0.01, model_min_labels=None)
    evictor.reset(range(8))
    block = evictor.pop_n(1)
    evictor.note_shared_release(_freed(block, [b"h"]), Release(10.0, 0.5, "A"))
    evictor.push_cached(_freed(block, [b"h"]), Release(10.0, 0.5, "B"))
    assert evictor.pooled_key(block[0]) == pytest.approx(static_key(0.75, 10.0, 0.01, 1e-6))


def test_or_pooling_decays_the_older_release_first() -> None:
    evictor = PooledLPCEvictor(8, scale_per_s=0.01, model_min_labels=None)
    evictor.reset(range(8))
    block = evictor.pop_n(1)
    evictor.note_shared_release(_freed(block, [b"h"]), Release(0.0, 0.6, "A"))
    evictor.push_cached(_freed(block, [b"h"]), Release(100.0, 0.5, "B"))
    old_now = 0.6 * math.exp(-1.0) / (0.6 * math.exp(-1.0) + 0.4)
    expected = 1.0 - (1.0 - old_now) * 0.5  # above the floor (p_shared = 0.5)
    assert evictor.pooled_key(block[0]) == pytest.approx(static_key(expected, 100.0, 0.01, 1e-6))


def test_a_conversations_own_release_replaces_its_key() -> None:
    evictor = PooledLPCEvictor(8, scale_per_s=0.01, model_min_labels=None)
    evictor.reset(range(8))
    block = evictor.pop_n(1)
    evictor.push_cached(_freed(block, [b"h"]), Release(0.0, 0.9, "A"))
    evictor.remove(block[0])
    evictor.push_cached(_freed(block, [b"h"]), Release(5.0, 0.1, "A"))
    assert evictor.pooled_key(block[0]) == pytest.approx(static_key(0.1, 5.0, 0.01, 1e-6))


def test_requeue_puts_a_shared_block_back_with_its_key_and_learns_nothing() -> None:
    """A block taken out and requeued (vLLM's CPU tier: a store protects it, a load pins it)
    keeps its OR-pooled key and its place; pushing its last release again would pool that
    release with itself and raise the key."""
    evictor = PooledLPCEvictor(8, scale_per_s=0.01, model_min_labels=None)
    evictor.reset(range(2))  # no uncached block left once both are taken
    block, other = evictor.pop_n(2)
    evictor.note_shared_release(_freed([block], [b"h"]), Release(0.0, 0.5, "A"))
    last = Release(10.0, 0.5, "B")
    evictor.push_cached(_freed([block], [b"h"]), last)
    evictor.push_cached(_freed([other], [b"o"]), Release(10.0, 0.7, "C"))
    key, memory = evictor.pooled_key(block), evictor.memory_size()
    evictor.remove(block)
    evictor.requeue(_freed([block], [b"h"]))
    assert evictor.pooled_key(block) == key and evictor.memory_size() == memory
    assert evictor.pop_n(1, 20.0) == [other]  # 0.7 is below the block's pooled p (0.74)
    evictor.remove(block)
    evictor.push_cached(_freed([block], [b"h"]), last)  # the same release again
    assert evictor.pooled_key(block) > key
    with pytest.raises(ValueError, match="queued"):
        evictor.requeue(_freed([block], [b"h"]))


def test_the_memory_recognises_a_shared_prefix_computed_again_after_an_eviction() -> None:
    """Content released by A, evicted, then computed and released by B within the window is
    shared: it takes the floor p_shared (0.5 before any judgement), not B's own low p."""
    evictor = PooledLPCEvictor(
        4, scale_per_s=0.01, model_min_labels=None, memory_window_s=300.0, horizon_s=100.0
    )
    evictor.reset(range(4))
    first = evictor.pop_n(1)
    evictor.push_cached(_freed(first, [b"doc"]), Release(0.0, 0.1, "A"))
    assert evictor.pop_n(4)[-1] == first[0]  # evicted: the block forgets its metadata
    evictor.push_uncached([b for b in range(4) if b != first[0]])
    again = [first[0]]
    evictor.push_cached(_freed(again, [b"doc"]), Release(50.0, 0.1, "B"))
    assert evictor.pooled_key(again[0]) == pytest.approx(static_key(0.5, 50.0, 0.01, 1e-6))
    other = evictor.pop_n(1)
    evictor.push_cached(_freed(other, [b"private"]), Release(50.0, 0.1, "B"))
    assert evictor.pooled_key(other[0]) == pytest.approx(static_key(0.1, 50.0, 0.01, 1e-6))


def test_the_memory_by_block_knows_sharing_only_while_the_block_holds_the_content() -> None:
    """With the memory by block, content released by A, evicted, then computed and released by
    B is B's alone (no floor); a block B hits and releases after A is shared (the floor)."""
    evictor = PooledLPCEvictor(
        4, scale_per_s=0.01, model_min_labels=None, horizon_s=100.0, memory="blocks"
    )
    evictor.reset(range(4))
    first = evictor.pop_n(1)
    evictor.push_cached(_freed(first, [b"doc"]), Release(0.0, 0.1, "A"))
    assert evictor.pop_n(4)[-1] == first[0]  # evicted: the block forgets its metadata
    evictor.push_uncached([b for b in range(4) if b != first[0]])
    evictor.push_cached(_freed(first, [b"doc"]), Release(50.0, 0.1, "B"))
    assert evictor.pooled_key(first[0]) == pytest.approx(static_key(0.1, 50.0, 0.01, 1e-6))
    evictor.remove(first[0])  # C hits it, and releases it
    evictor.push_cached(_freed(first, [b"doc"]), Release(60.0, 0.1, "C"))
    assert evictor.pooled_key(first[0]) == pytest.approx(static_key(0.5, 60.0, 0.01, 1e-6))
    assert evictor.memory_size() == 0


def test_the_memory_by_block_judges_a_shared_release_at_the_blocks_next_release() -> None:
    """A shared release is judged reused at the block's next, strictly later release within
    the horizon; not reused if the block was evicted first, or at the horizon."""
    evictor = PooledLPCEvictor(8, horizon_s=10.0, model_min_labels=None, memory="blocks")
    evictor.reset(range(8))
    a, b, c = evictor.pop_n(3)
    for t, conv in ((0.0, "A"), (1.0, "B")):  # the second release of each block is shared
        evictor.note_shared_release(_freed([a, b, c], [b"x", b"y", b"z"]), Release(t, 0.2, conv))
    evictor.note_shared_release(_freed([a], [b"x"]), Release(1.0, 0.2, "C"))  # same instant
    assert evictor.shared_releases_judged == 0
    evictor.note_shared_release(_freed([a], [b"x"]), Release(5.0, 0.2, "C"))
    assert (evictor.shared_releases_judged, evictor.shared_releases_reused) == (1, 1)
    # b released again (and shared again: B's tag meets C's), then evicted with that
    # release pending, then given another content: not reused.
    evictor.push_cached(_freed([b], [b"y"]), Release(6.0, 0.2, "C"))
    assert (evictor.shared_releases_judged, evictor.shared_releases_reused) == (2, 2)
    assert evictor.pop_n(6)[-1] == b
    evictor.push_cached(_freed([b], [b"other"]), Release(7.0, 0.2, "D"))
    assert (evictor.shared_releases_judged, evictor.shared_releases_reused) == (3, 2)
    evictor.note_shared_release(_freed([a], [b"x"]), Release(20.0, 0.2, "E"))
    # Past the horizon, never released again: c's shared release at 1 s and a's at 5 s.
    assert (evictor.shared_releases_judged, evictor.shared_releases_reused) == (5, 2)


def test_the_memory_by_chain_recognises_a_shared_prefix_computed_again_after_an_eviction() -> None:
    """With the memory by chain, a chain released by A, evicted, then computed again under the
    same top and released by B within the window: the common prefix is shared (the floor
    p_shared, 0.5 before any judgement), B's own block below it is B's alone."""
    evictor = PooledLPCEvictor(
        4,
        scale_per_s=0.01,
        model_min_labels=None,
        memory_window_s=300.0,
        horizon_s=100.0,
        memory="chains",
    )
    evictor.reset(range(4))
    first = evictor.pop_n(2)
    evictor.push_cached(_freed(first, [b"doc/a", b"doc"]), Release(0.0, 0.1, "A"))
    assert set(evictor.pop_n(4)[-2:]) == set(first)  # evicted: the blocks forget their metadata
    evictor.push_uncached([b for b in range(4) if b not in first])
    evictor.push_cached(_freed(first, [b"doc/b", b"doc"]), Release(50.0, 0.1, "B"))
    own, top = first
    assert evictor.pooled_key(top) == pytest.approx(static_key(0.5, 50.0, 0.01, 1e-6))
    assert evictor.pooled_key(own) == pytest.approx(static_key(0.1, 50.0, 0.01, 1e-6))


def test_the_memory_by_chain_keeps_only_the_top_stretch_of_shared_blocks() -> None:
    """A release shared below its top but not at it (its deepest block pooled with another
    conversation's) remembers no shared block: the same conversation's next release under the
    same top, on fresh blocks, is its own."""
    evictor = PooledLPCEvictor(8, scale_per_s=0.01, model_min_labels=None, memory="chains")
    evictor.reset(range(8))
    deep, middle, top = evictor.pop_n(3)
    evictor.note_shared_release(_freed([deep], [b"x/y/z"]), Release(0.0, 0.2, "B"))
    evictor.push_cached(
        _freed([deep, middle, top], [b"x/y/z", b"x/y", b"x"]), Release(1.0, 0.2, "A")
    )
    assert evictor.pooled_key(deep) > evictor.pooled_key(top)  # shared below the top only
    fresh = evictor.pop_n(3)  # uncached blocks: no metadata
    evictor.push_cached(_freed(fresh, [b"x/y/w", b"x/y", b"x"]), Release(2.0, 0.2, "A"))
    assert [evictor.pooled_key(b) for b in fresh] == [static_key(0.2, 2.0, 0.01, 1e-6)] * 3


def test_the_memory_by_chain_judges_a_release_by_the_prefix_released_again() -> None:
    """A release's top stretch of shared blocks is judged once older than the horizon: reused
    as far as the last release under the same top since (within the horizon) shares it."""
    evictor = PooledLPCEvictor(8, horizon_s=10.0, model_min_labels=None, memory="chains")
    evictor.reset(range(8))
    a, b, c = evictor.pop_n(3)
    chain = [b"x/y/z", b"x/y", b"x"]
    evictor.note_shared_release(_freed([a, b, c], chain), Release(0.0, 0.2, "A"))
    evictor.note_shared_release(_freed([a, b, c], chain), Release(1.0, 0.2, "B"))  # 3 shared
    evictor.note_shared_release(_freed([b, c], chain[1:]), Release(5.0, 0.2, "C"))  # 2 of them
    assert evictor.shared_releases_judged == 0
    evictor.note_shared_release(_freed([a], [b"other"]), Release(12.0, 0.2, "D"))
    assert (evictor.shared_releases_judged, evictor.shared_releases_reused) == (3, 2)
    evictor.note_shared_release(_freed([a], [b"other"]), Release(16.0, 0.2, "D"))
    # C's release (2 shared) was never followed under its top: judged, not reused.
    assert (evictor.shared_releases_judged, evictor.shared_releases_reused) == (5, 2)


def test_the_memory_forgets_content_after_its_window() -> None:
    evictor = PooledLPCEvictor(
        4, scale_per_s=0.01, model_min_labels=None, memory_window_s=300.0, horizon_s=100.0
    )
    evictor.reset(range(4))
    a, b = evictor.pop_n(2)
    evictor.note_shared_release(_freed([a], [b"doc"]), Release(0.0, 0.1, "A"))
    assert evictor.memory_size() == 1
    evictor.note_shared_release(_freed([b], [b"x"]), Release(301.0, 0.1, "B"))
    assert evictor.memory_size() == 1  # "doc" expired, "x" is new
    evictor.push_cached(_freed([a], [b"doc"]), Release(302.0, 0.1, "B"))
    # Not shared through the memory any more, but its metadata still pools A with B.
    assert evictor.pooled_key(a) != pytest.approx(static_key(0.1, 302.0, 0.01, 1e-6))


def test_the_memory_keeps_at_most_its_bound_forgetting_the_oldest_content() -> None:
    """A memory of two contents (factor 0.5 on a four-block pool): a third content pushes out
    the oldest, which then no longer makes a fresh block's release shared."""
    evictor = PooledLPCEvictor(
        4,
        scale_per_s=0.0,
        memory_window_s=300.0,
        horizon_s=100.0,
        memory_blocks_factor=0.5,
        model_min_labels=None,
    )
    evictor.reset(range(4))
    a, _, c, d = evictor.pop_n(4)
    for t, content in ((0.0, b"first"), (1.0, b"second"), (2.0, b"third")):
        evictor.note_shared_release(_freed([a], [content]), Release(t, 0.1, "A"))
        assert evictor.memory_size() <= 2
    evictor.push_cached(_freed([c], [b"first"]), Release(4.0, 0.1, "B"))  # forgotten
    assert evictor.pooled_key(c) == pytest.approx(static_key(0.1, 4.0, 0.0, 1e-6))
    evictor.push_cached(_freed([d], [b"third"]), Release(5.0, 0.1, "B"))  # remembered
    assert evictor.pooled_key(d) == pytest.approx(static_key(0.5, 5.0, 0.0, 1e-6))


def test_shared_probability_counts_reuse_within_the_horizon() -> None:
    """The hash memory judges each content: released again within the horizon, or not."""
    evictor = PooledLPCEvictor(8, memory_window_s=100.0, horizon_s=10.0, memory="content")
    evictor.reset(range(8))
    blocks = evictor.pop_n(2)
    for t, conv in ((0.0, "A"), (1.0, "B")):  # the second release of each is shared
        evictor.note_shared_release(_freed(blocks, [b"reused", b"dropped"]), Release(t, 0.2, conv))
    assert evictor.shared_probability == 0.5  # nothing judged yet
    evictor.note_shared_release(_freed(blocks[:1], [b"reused"]), Release(5.0, 0.2, "C"))
    evictor.note_shared_release(_freed([blocks[1]], [b"other"]), Release(12.0, 0.2, "C"))
    # Judged at 12 s: "reused" (shared at 1 s, released again at 5 s) and "dropped" (not).
    assert evictor.shared_releases_judged == 2
    assert evictor.shared_releases_reused == 1
    assert evictor.shared_probability == pytest.approx(1.5 / 3)
    evictor.note_shared_release(_freed([blocks[1]], [b"other"]), Release(20.0, 0.2, "D"))
    # The shared release of "reused" at 5 s was not released again: judged at 20 s.
    assert evictor.shared_releases_judged == 3
    assert evictor.shared_probability == pytest.approx(1.5 / 4)


def test_reset_forgets_the_memory_and_the_estimate() -> None:
    evictor = PooledLPCEvictor(4, memory_window_s=100.0, horizon_s=10.0)
    evictor.reset(range(4))
    a = evictor.pop_n(1)
    evictor.note_shared_release(_freed(a, [b"h"]), Release(0.0, 0.2, "A"))
    evictor.note_shared_release(_freed(a, [b"h"]), Release(1.0, 0.2, "B"))
    evictor.note_shared_release(_freed(a, [b"h"]), Release(20.0, 0.2, "C"))
    assert evictor.shared_releases_judged == 1
    evictor.reset(range(4))
    assert evictor.memory_size() == 0 and evictor.shared_releases_judged == 0


@pytest.mark.parametrize(
    "options",
    [
        {"horizon_s": 0.0},
        {"horizon_s": math.inf},
        {"memory_window_s": 10.0, "horizon_s": 20.0},
        {"memory_blocks_factor": 0.0},
        {"memory": "hash"},
    ],
)
def test_bad_windows_are_refused(options: dict) -> None:
    with pytest.raises(
        ValueError, match=r"horizon_s|memory_window_s|memory_blocks_factor|memory must be"
    ):
        PooledLPCEvictor(4, **options)


def test_the_gate_keys_at_the_fallback_until_the_model_beats_a_constant() -> None:
    """Releases judged after the horizon: the model's p is used only once it has at least
    `model_min_labels` labels and a log-loss no worse than the running constant's."""
    evictor = PooledLPCEvictor(
        8, scale_per_s=0.0, fallback_probability=0.5, horizon_s=10.0, model_min_labels=2
    )
    evictor.reset(range(8))
    blocks = evictor.pop_n(8)
    # A continues (released again at 5 s), B does not: the model says 0.9 and 0.1, right both times.
    evictor.push_cached(_freed([blocks[0]], [None]), Release(0.0, 0.9, "A"))
    assert evictor.pooled_key(blocks[0]) == 0.0  # untrusted: the fallback 0.5
    evictor.push_cached(_freed([blocks[1]], [None]), Release(1.0, 0.1, "B"))
    evictor.push_cached(_freed([blocks[2]], [None]), Release(5.0, 0.3, "A"))
    assert not evictor.model_trusted and evictor.model_labels_judged == 0
    evictor.push_cached(_freed([blocks[3]], [None]), Release(12.0, 0.2, "C"))
    assert evictor.model_labels_judged == 2 and evictor.model_labels_continued == 1
    # model: −ln 0.9 − ln 0.9; constant: −ln 0.5 (prior) − ln(1 − 0.75)
    assert evictor.model_loss_nats == pytest.approx(-2 * math.log(0.9))
    assert evictor.constant_loss_nats == pytest.approx(-math.log(0.5) - math.log(0.25))
    assert evictor.model_trusted
    assert evictor.pooled_key(blocks[3]) == pytest.approx(static_key(0.2, 12.0, 0.0, 1e-6))
    assert evictor.fallbacks_used == 0  # the gate is not a missing prediction


def test_the_gate_falls_back_when_the_model_does_worse_than_a_constant() -> None:
    evictor = PooledLPCEvictor(8, scale_per_s=0.0, horizon_s=10.0, model_min_labels=0)
    evictor.reset(range(8))
    blocks = evictor.pop_n(8)
    assert evictor.model_trusted  # no labels needed: trusted until it falls behind
    # Confidently wrong: A (p 0.05) continues, B (p 0.95) does not.
    evictor.push_cached(_freed([blocks[0]], [None]), Release(0.0, 0.05, "A"))
    evictor.push_cached(_freed([blocks[1]], [None]), Release(1.0, 0.95, "B"))
    evictor.push_cached(_freed([blocks[2]], [None]), Release(5.0, 0.5, "A"))
    evictor.push_cached(_freed([blocks[3]], [None]), Release(12.0, 0.9, "C"))
    assert not evictor.model_trusted
    assert evictor.pooled_key(blocks[3]) == 0.0  # the fallback 0.5
    evictor.reset(range(8))
    assert evictor.model_trusted and evictor.model_labels_judged == 0


def test_a_bad_gate_is_refused() -> None:
    with pytest.raises(ValueError, match="model_min_labels"):
        PooledLPCEvictor(4, model_min_labels=-1)
    with pytest.raises(ValueError, match="model_margin_nats"):
        PooledLPCEvictor(4, model_margin_nats=math.nan)
