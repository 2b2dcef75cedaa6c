"""The LPC free queue without vLLM: its contract, and LRU order under one constant p.

The queue only reads `block_id`, `block_hash` and `block_hash_num_tokens` from vLLM's
blocks, so plain objects with those fields stand in for `KVCacheBlock` here; the tests
against real vLLM are in test_vllm_plugin.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eviction import LRUEvictor, PooledLPCEvictor, Release
from eviction.base import FreedBlocks
from lpc.integrations.config import PluginConfig
from lpc.integrations.stats import PluginStats
from lpc.integrations.vllm_queue import SAMPLED_AGES, QueueRuntime, bind_queue_class


@dataclass
class Block:
    block_id: int
    block_hash: bytes | None = None
    block_hash_num_tokens: int | None = None


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make_queue(num_blocks: int = 10, clock: Clock | None = None, **config):
    """A queue on the plain `lpc` evictor unless `evictor` says otherwise (the plugin's
    default is `lpc-pooled`, whose OR pooling and trust gate these tests do not describe)."""
    config.setdefault("evictor", "lpc")
    runtime = QueueRuntime(PluginConfig(**config), PluginStats(), clock or Clock())
    blocks = [Block(i) for i in range(num_blocks)]
    return bind_queue_class(runtime)(blocks), blocks, runtime


def ids(blocks) -> list[int]:
    return [b.block_id for b in blocks]


def cache(block: Block, depth: int) -> Block:
    block.block_hash = bytes([block.block_id, depth])
    block.block_hash_num_tokens = (depth + 1) * 16
    return block


def test_starts_in_id_order_and_pops_from_the_front() -> None:
    queue, blocks, _ = make_queue(5)
    assert queue.num_free_blocks == 5 and ids(queue.get_all_free_blocks()) == [0, 1, 2, 3, 4]
    assert queue.popleft() is blocks[0]
    assert ids(queue.popleft_n(2)) == [1, 2] and queue.popleft_n(0) == []
    assert queue.num_free_blocks == 2


def test_errors_match_vllms() -> None:
    queue, blocks, _ = make_queue(2)
    queue.popleft_n(2)
    with pytest.raises(ValueError, match="No free blocks"):
        queue.popleft()
    with pytest.raises(ValueError, match="cannot pop 1"):
        queue.popleft_n(1)
    with pytest.raises(RuntimeError, match="not free"):
        queue.remove(blocks[0])
    with pytest.raises(ValueError, match="ids equal to their positions"):
        bind_queue_class(QueueRuntime(PluginConfig(), PluginStats()))([Block(1), Block(0)])


def test_uncached_blocks_go_first_cached_ones_by_release() -> None:
    clock = Clock()
    queue, blocks, runtime = make_queue(8, clock)
    taken = queue.popleft_n(8)
    a = [cache(taken[i], d) for i, d in ((2, 1), (1, 0))]  # one request, tail first
    with runtime.releasing(Release(10.0, 0.9, "conv-a")):
        queue.append_n(a)
    with runtime.releasing(Release(20.0, 0.1, "conv-b")):
        queue.append_n([cache(taken[3], 0)])
    queue.prepend_n([taken[5], taken[6]])
    # Uncached first (as prepended), then LPC's key: logit(0.1) + 0.2 < logit(0.9) + 0.1.
    assert ids(queue.get_all_free_blocks()) == [5, 6, 3, 2, 1]
    assert ids(queue.iter_blocks_after(None)) == [5, 6, 3, 2, 1]
    assert ids(queue.iter_blocks_after(blocks[3])) == [2, 1]
    assert list(queue.iter_blocks_after(blocks[7])) == [], "a cursor that is not free ends it"
    queue.remove(blocks[3])
    popped = queue.popleft_n(4)
    assert ids(popped) == [5, 6, 2, 1]
    assert runtime.stats.evictions == 2 and runtime.stats.cached_blocks_released == 3
    assert runtime.stats.uncached_blocks_released == 2


def test_outside_a_release_blocks_get_the_fallback_at_the_clock() -> None:
    clock = Clock()
    queue, _, runtime = make_queue(4, clock, fallback_probability=0.5)
    taken = queue.popleft_n(4)
    with runtime.releasing(Release(100.0, 0.5, "c")):
        queue.append_n([cache(taken[0], 0)])
    clock.now = 50.0
    queue.append(cache(taken[1], 0))  # e.g. BlockPool.unpin_blocks: no release context
    assert ids(queue.get_all_free_blocks()) == [1, 0]
    assert queue.evictor.pooled_key(1) == pytest.approx(0.5)


def test_shared_releases_pool_by_max() -> None:
    queue, _, runtime = make_queue(4)
    taken = queue.popleft_n(4)
    shared = cache(taken[0], 0)
    queue.note_shared_release([shared], Release(100.0, 0.99, "conv-a"))  # still held by b
    with runtime.releasing(Release(101.0, 0.01, "conv-b")):
        queue.append_n([shared])
    key_a = queue.evictor.key_for(Release(100.0, 0.99, "x"))
    assert queue.evictor.pooled_key(0) == pytest.approx(key_a)
    assert runtime.stats.shared_blocks_released == 1


def test_the_pooled_evictor_ors_shared_releases_and_remembers_content() -> None:
    """LPC_EVICTOR=lpc-pooled: the queue drives `PooledLPCEvictor`, which ORs two
    conversations' p and sees the block's hash, so its memory knows the content is shared.
    No release was judged yet, so its trust gate keys both at the fallback p (0.5)."""
    queue, _, runtime = make_queue(
        4, evictor="lpc-pooled", scale_per_s=0.0, fallback_probability=0.5
    )
    assert isinstance(queue.evictor, PooledLPCEvictor)
    taken = queue.popleft_n(4)
    shared = cache(taken[0], 0)
    queue.note_shared_release([shared], Release(100.0, 0.6, "conv-a"))  # still held by b
    with runtime.releasing(Release(101.0, 0.5, "conv-b")):
        queue.append_n([shared])
    assert not queue.evictor.model_trusted
    assert queue.evictor.pooled_key(0) == pytest.approx(math.log(0.75 / 0.25))  # 1 − 0.5·0.5
    assert queue.evictor.memory_size() == 1


class SlotBlock:
    """vLLM 0.33's `KVCacheBlock` layout: `block_hash` is a property over a slot."""

    __slots__ = (
        "_block_hash",
        "block_hash_num_tokens",
        "block_id",
        "next_free_block",
        "prev_free_block",
    )

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.prev_free_block: SlotBlock | None = None
        self.next_free_block: SlotBlock | None = None
        self._block_hash: bytes | None = None
        self.block_hash_num_tokens: int | None = None

    @property
    def block_hash(self) -> bytes | None:
        return self._block_hash


def test_hashes_are_read_from_vllms_slot_and_only_by_evictors_that_use_them() -> None:
    """The pooled memory sees the same contents through the slot as through the property,
    across conversations and as one chain; plain LPC reads no hash at all."""
    runtime = QueueRuntime(
        PluginConfig(evictor="lpc-pooled", scale_per_s=0.0, fallback_probability=0.1),
        PluginStats(),
        Clock(),
    )
    blocks = [SlotBlock(i) for i in range(6)]
    queue = bind_queue_class(runtime)(blocks)
    assert repr(queue._hash_of) == "operator.attrgetter('_block_hash')" and queue._reads_hashes
    taken = queue.popleft_n(6)
    for depth, block in enumerate(taken[:3]):
        block._block_hash = b"doc-%d" % depth
        block.block_hash_num_tokens = (depth + 1) * 16
    with runtime.releasing(Release(1.0, 0.5, "conv-a")):
        queue.append_n(taken[:3][::-1])
    assert queue.evictor.memory_size() == 3
    for depth, block in enumerate(taken[3:]):  # the same contents, computed again by b
        block._block_hash = b"doc-%d" % depth
        block.block_hash_num_tokens = (depth + 1) * 16
    with runtime.releasing(Release(2.0, 0.5, "conv-b")):
        queue.append_n(taken[3:][::-1])
    assert queue.evictor.memory_size() == 3  # one entry per content, now shared
    # Untrusted model: releases take the fallback p 0.1; shared content its floor (prior 0.5).
    assert queue.evictor.pooled_key(3) == pytest.approx(0.0)
    assert queue.evictor.pooled_key(0) == pytest.approx(math.log(0.1 / 0.9))
    plain, _, _ = make_queue(2)
    assert not plain._reads_hashes


def test_activation_runs_once_per_runtime() -> None:
    calls = []
    runtime = QueueRuntime(PluginConfig(), PluginStats(), activate=lambda: calls.append(1))
    queue_class = bind_queue_class(runtime)
    queue_class([Block(0)])
    queue_class([Block(0), Block(1)])
    assert calls == [1]


# -- with one constant p and strictly increasing release times, LPC is LRU ---------------------
operation = st.one_of(
    st.tuples(st.just("alloc"), st.integers(1, 6)),
    st.tuples(st.just("free"), st.integers(0, 10**6)),
    st.tuples(st.just("hit"), st.integers(0, 10**6)),
)


@settings(max_examples=200, deadline=None)
@given(ops=st.lists(operation, max_size=120), p=st.floats(0.0, 1.0))
def test_constant_p_orders_like_vllms_lru(ops, p: float) -> None:
    """Drive the queue and LRUEvictor (vLLM's queue, block for block) with the same calls."""
    clock = Clock()
    queue, _, runtime = make_queue(24, clock)
    lru = LRUEvictor(24)
    lru.reset(range(24))
    held: list[list[Block]] = []  # "requests": their blocks, in allocation order
    for step, (kind, arg) in enumerate(ops, 1):
        clock.now = float(step)
        if kind == "alloc" and arg <= queue.num_free_blocks:
            got = queue.popleft_n(arg)
            assert ids(got) == lru.pop_n(arg)
            for b in got:
                b.block_hash = None  # lazy eviction: a popped block loses its content
            # The full blocks get a hash: a prefix of the request's blocks, as in vLLM (a
            # free then hands the queue a chain's tail, which prefix closure links).
            for depth, b in enumerate(got[: len(got) - (got[0].block_id + step) % 2]):
                cache(b, depth)
            held.append(got)
        elif kind == "free" and held:
            table = held.pop(arg % len(held))
            tail_first = table[::-1]
            uncached = [b for b in tail_first if b.block_hash is None]
            cached = [b for b in tail_first if b.block_hash is not None]
            with runtime.releasing(Release(clock.now, p, f"c{arg % 3}")):
                queue.prepend_n(uncached)
                queue.append_n(cached)
            lru.push_uncached(ids(uncached))
            lru.push_cached(
                FreedBlocks(ids(cached), [0] * len(cached), [None] * len(cached)), Release(0)
            )
        elif kind == "hit":
            # A hit is a prefix: here a chain's first block (vLLM's hits hold every parent).
            free_cached = [b for b in queue.get_all_free_blocks() if b.block_hash_num_tokens == 16]
            if free_cached:
                block = free_cached[arg % len(free_cached)]
                queue.remove(block)
                lru.remove(block.block_id)
                held.append([block])
        assert ids(queue.get_all_free_blocks()) == lru.free_block_ids()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 900), min_size=1, max_size=12), st.randoms(use_true_random=False))
def test_a_large_pop_samples_the_eviction_ages_within_one_stride(lengths, rng) -> None:
    """A pop of more than `SAMPLED_AGES` cached blocks reads every k-th block's release time,
    each standing for k blocks: the histogram's count is the pop's exactly, every age observed
    is a run's, and each run's count is off by less than k (a run shorter than k may be
    missed)."""
    n = sum(lengths)
    clock = Clock()
    clock.now = 10_000.0
    queue, _, runtime = make_queue(n, clock)
    ids_ = list(range(n))
    rng.shuffle(ids_)  # the pop's order, not the ids', makes the runs
    runs: dict[float, int] = {}
    start = 0
    for run, length in enumerate(lengths):
        for block_id in ids_[start : start + length]:
            queue._released_s[block_id] = float(run)
        runs[clock.now - run] = length
        start += length
    calls = []
    recorder = SimpleNamespace(observe_n=lambda age, count: calls.append((age, count)))
    runtime.histograms = SimpleNamespace(eviction_age_s=recorder)
    queue._observe_many_eviction_ages(ids_, None)
    stride = -(-n // SAMPLED_AGES) if n > SAMPLED_AGES else 1
    observed = dict(calls)
    assert len(observed) == len(calls) and sum(observed.values()) == n
    assert set(observed) <= set(runs)
    for age, length in runs.items():
        assert abs(observed.get(age, 0) - length) < stride, (age, length, stride)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 39), st.sampled_from([0.0, 5.0, 12.5]), st.booleans()),
        min_size=1,
        max_size=30,
    ),
)
def test_a_small_pop_observes_the_eviction_ages_numpy_does(popped) -> None:
    """The eviction-age histogram of a small pop, read block by block, gets the observations
    of the numpy path: one per run of equal release times, in order, cached blocks only."""
    if not any(held for _, _, held in popped):
        popped = [(popped[0][0], popped[0][1], True), *popped[1:]]
    clock = Clock()
    clock.now = 100.0
    observed = {}
    for path in ("_observe_few_eviction_ages", "_observe_many_eviction_ages"):
        queue, _, runtime = make_queue(40, clock)
        for block_id, time_s, _ in popped:
            queue._released_s[block_id] = time_s
        calls = []
        recorder = SimpleNamespace(observe_n=lambda age, n, calls=calls: calls.append((age, n)))
        runtime.histograms = SimpleNamespace(eviction_age_s=recorder)
        ids_ = [block_id for block_id, _, _ in popped]
        cached = [held for _, _, held in popped]
        getattr(queue, path)(ids_, None if all(cached) else cached)
        observed[path] = calls
    assert observed["_observe_few_eviction_ages"] == observed["_observe_many_eviction_ages"]
    assert sum(n for _, n in observed["_observe_few_eviction_ages"]) == sum(
        held for _, _, held in popped
    )
