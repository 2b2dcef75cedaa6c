"""A prediction that arrives after its release re-keys the release's own runs (`rekey_late`).

The release is queued at the fallback p (LRU's place); when its p comes, each of its runs
still queued takes the key the p would have given it at the release. Before any pop, the
order is then the one of an evictor that had every p in time, whatever hits came between;
blocks pooled with another conversation keep their pooled key.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from eviction import FreedBlocks, LPCEvictor, Release
from eviction.lpc_pooled import PooledLPCEvictor

NUM_BLOCKS = 96

release_plans = st.lists(
    st.tuples(
        st.integers(1, 6),  # blocks in the chain
        st.floats(0.0, 1.0),  # p
        st.booleans(),  # late: pushed without a p, re-keyed afterwards
        st.lists(st.integers(0, 5), max_size=2),  # blocks of the chain hit before the re-key
    ),
    min_size=1,
    max_size=14,
)


def evictors(kind: str) -> tuple[LPCEvictor, LPCEvictor]:
    if kind == "lpc":
        return LPCEvictor(NUM_BLOCKS), LPCEvictor(NUM_BLOCKS)
    # The p ungated, and blocks without a hash: every release keeps its own runs.
    return (
        PooledLPCEvictor(NUM_BLOCKS, model_min_labels=None),
        PooledLPCEvictor(NUM_BLOCKS, model_min_labels=None),
    )


def chain(block_ids: list[int]) -> FreedBlocks:
    """A request's blocks as it frees them: the tail first, each block's parent the next."""
    n = len(block_ids)
    return FreedBlocks(block_ids[::-1], list(range(n))[::-1], [None] * n, chain=True)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(plans=release_plans, kind=st.sampled_from(["lpc", "lpc-pooled"]))
def test_a_late_p_gives_the_order_of_a_p_in_time(plans, kind) -> None:
    in_time, late = evictors(kind)
    for evictor in (in_time, late):
        evictor.reset(range(NUM_BLOCKS))
    waiting = []
    for i, (size, p, is_late, hits) in enumerate(plans):
        blocks = in_time.pop_n(size)
        assert late.pop_n(size) == blocks
        freed = chain(blocks)
        release = Release(float(i), p, f"c{i}")
        in_time.push_cached(freed, release)
        late.push_cached(freed, Release(float(i), None, f"c{i}") if is_late else release)
        if is_late:
            waiting.append((late.own_runs(freed), release))
        for j in {h for h in hits if h < size}:
            in_time.remove(blocks[j])
            late.remove(blocks[j])
        late.check_invariants()
    for runs, release in waiting[::-1]:
        late.rekey_late(runs, release)
        late.check_invariants()
    assert late.free_block_ids() == in_time.free_block_ids()
    n = len(in_time)
    assert late.pop_n(n) == in_time.pop_n(n)


def test_a_late_p_spares_a_block_shared_with_another_conversation() -> None:
    """Conversation A releases block 0 at p = 0.9; B releases it with block 1 at the
    fallback p. B's p = 0.01 comes late: block 1 (B's own) falls below LRU's place, block 0
    keeps the key pooled with A's."""
    evictor = LPCEvictor(4)
    evictor.reset([])
    evictor.push_cached(chain([0]), Release(0.0, 0.9, "A"))
    evictor.remove(0)
    freed = chain([0, 1])
    late = Release(1.0, None, "B")
    evictor.push_cached(freed, late)
    shared_key = evictor.pooled_key(0)
    runs = evictor.own_runs(freed)
    assert [run.block_ids for run in runs] == [[1]]
    assert evictor.rekey_late(runs, Release(1.0, 0.01, "B")) == 1
    assert evictor.pooled_key(0) == shared_key
    assert evictor.pooled_key(1) < evictor.key_for(Release(1.0, None, "B"))
    evictor.check_invariants()
    assert evictor.pop_n(2) == [1, 0]


def test_a_gate_that_does_not_trust_the_model_keeps_the_fallback() -> None:
    evictor = PooledLPCEvictor(8)  # the gate's default: no labels judged yet, not trusted
    evictor.reset([])
    freed = chain([0, 1])
    release = Release(0.0, None, "A")
    evictor.push_cached(freed, release)
    key = evictor.pooled_key(0)
    assert not evictor.model_trusted
    assert evictor.rekey_late(evictor.own_runs(freed), Release(0.0, 0.99, "A")) == 0
    assert evictor.pooled_key(0) == key
