"""LRB and 3L-Cache behind the evictor contract (`eviction/libcachesim_caches.py`): each pop
is the libCacheSim cache's own choice among free cached blocks, checked against the bare
libCacheSim cache driven plainly, and the contract holds on random streams."""

from __future__ import annotations

import gc
import pickle
import random
import sys
import weakref

import pytest

from eviction import FreedBlocks, LRUEvictor, Release, make_evictor
from eviction.libcachesim_caches import (
    LearnedCacheEvictor,
    LRBEvictor,
    ThreeLCacheEvictor,
    _candidate_offset,
    _CandidateSlot,
)
from lpc.blocks.block_manager import PrefixCacheBlockManager
from tests.eviction.test_lpc_reference import replay
from tests.lpc.streams import random_stream

libcachesim = pytest.importorskip("libcachesim", reason="needs lpc[rivals] (libcachesim)")

CLASSES = [LRBEvictor, ThreeLCacheEvictor]
# The adapter is one class: its mechanics are checked on 3L-Cache in the default suite (LRB
# costs 0.2-0.3 s per cache), on LRB too with the slow tests.
MECHANICS = [pytest.param(LRBEvictor, marks=pytest.mark.slow), ThreeLCacheEvictor]


class PlainLearnedCache:
    """The mapping of docs/design.md, "LRB and 3L-Cache through libCacheSim", written plainly
    over a bare libCacheSim cache: a dict of free cached blocks, one object id per content, and
    a choice that is not a free block (in use) evicted from the learned cache and the cache
    asked again."""

    def __init__(self, cache_class: str) -> None:
        self.cache = getattr(libcachesim, cache_class)(1 << 50, objective="object-miss-ratio")
        # freed safely when the test drops it (see the module under test)
        slot = _CandidateSlot(self.cache._cache, _candidate_offset(cache_class))
        weakref.finalize(self, slot.release)
        self.object_of_content: dict[bytes, int] = {}
        self.content_of_block: dict[int, bytes] = {}
        self.free: set[int] = set()

    def release(self, block_id: int, content: bytes, now: int) -> None:
        obj = self.object_of_content.setdefault(content, len(self.object_of_content))
        self.content_of_block[block_id] = content
        self.cache.get(libcachesim.Request(obj_size=1, obj_id=obj, clock_time=now))
        self.free.add(block_id)

    def evict(self, now: int) -> int:
        holder = {self.object_of_content[c]: b for b, c in self.content_of_block.items()}
        while True:
            request = libcachesim.Request(obj_size=1, obj_id=0, clock_time=now)
            obj = self.cache.to_evict(request).obj_id
            self.cache.evict(request)
            block_id = holder.get(obj)
            if block_id in self.free:
                self.free.discard(block_id)
                del self.content_of_block[block_id]
                return block_id


def run_stream(evictor: LearnedCacheEvictor, plain: PlainLearnedCache | None, seed: int) -> int:
    """A small block manager's life: each step a chain of contents hits what is cached and
    free, takes a block for each new content (pops), then releases the chain tail first.
    Returns the evictions; with `plain`, each victim is compared with its choice."""
    rng = random.Random(seed)
    num_blocks = 24
    evictor.reset(range(num_blocks))
    block_of: dict[bytes, int] = {}
    evictions = 0
    for step in range(150):
        prefix = rng.randrange(12)
        contents = [bytes([prefix, i]) for i in range(rng.randint(1, 5))]
        blocks = []
        for content in contents:
            block_id = block_of.get(content)
            if block_id is not None:
                evictor.remove(block_id)  # a hit: in use until the release
                if plain is not None:
                    plain.free.discard(block_id)
            else:
                (block_id,) = evictor.pop_n(1, float(step))
                gone = [c for c, b in block_of.items() if b == block_id]
                if gone:
                    evictions += 1
                    del block_of[gone[0]]
                    if plain is not None:
                        assert plain.evict(step) == block_id, f"seed {seed} step {step}"
                block_of[content] = block_id
            blocks.append(block_id)
        evictor.push_cached(
            FreedBlocks(blocks[::-1], list(range(len(blocks)))[::-1], contents[::-1]),
            Release(float(step), None, f"c{prefix}"),
        )
        if plain is not None:
            for block_id, content in zip(blocks[::-1], contents[::-1], strict=True):
                plain.release(block_id, content, step)
        assert len(evictor) == num_blocks
    return evictions


@pytest.mark.parametrize("cls", MECHANICS)
def test_each_pop_is_the_bare_caches_own_choice(cls: type[LearnedCacheEvictor]) -> None:
    evictor = cls(24)
    evictions = run_stream(evictor, PlainLearnedCache(cls.CACHE_CLASS), seed=1)
    assert evictions > 60
    evictor.check_invariants()


@pytest.mark.parametrize("cls", CLASSES)
def test_untrained_it_evicts_like_lru_under_the_block_manager(
    cls: type[LearnedCacheEvictor],
) -> None:
    """Until its first model (LRB: 131,072 labelled samples) a learned cache evicts the least
    recently requested object, and a release is a request: the block manager allocates
    exactly as with vLLM's LRU queue, hits, shared releases and evictions alike."""
    steps = random_stream(3, 300)
    learned = PrefixCacheBlockManager(48, block_size=4, evictor=cls(48))
    lru = PrefixCacheBlockManager(48, block_size=4, evictor=LRUEvictor(48))
    learned_trace, lru_trace = replay(learned, steps), replay(lru, steps)
    assert sum(len(a.evicted_block_ids) for a in learned_trace if a is not None) > 20
    assert learned_trace == lru_trace
    assert learned.counters == lru.counters


@pytest.mark.parametrize("cls", MECHANICS)
def test_the_contract_holds_and_free_block_ids_is_the_pop_order(
    cls: type[LearnedCacheEvictor],
) -> None:
    rng = random.Random(5)
    num_blocks = 20
    evictor = cls(num_blocks)
    evictor.reset(range(num_blocks))
    free, cached, held = set(range(num_blocks)), set(), []
    for step in range(120):
        op = rng.random()
        if op < 0.4 and free:
            chain = evictor.pop_n(rng.randint(1, min(5, len(free))), float(step))
            assert set(chain) <= free and len(set(chain)) == len(chain)
            free -= set(chain)
            cached -= set(chain)
            held.append(chain)
        elif op < 0.55 and cached & free:
            block = rng.choice(sorted(cached & free))
            evictor.remove(block)
            free.discard(block)
            held.append([block])
        elif held:
            chain = held.pop(rng.randrange(len(held)))
            if rng.random() < 0.2:
                evictor.push_uncached(chain)
                cached -= set(chain)
            else:
                hashes = [None if rng.random() < 0.2 else bytes([rng.randrange(8)]) for _ in chain]
                depths = list(range(len(chain)))[::-1]
                evictor.push_cached(FreedBlocks(chain[::-1], depths, hashes), Release(step))
                cached |= set(chain)
            free |= set(chain)
        assert len(evictor) == len(free)
        assert all((block in evictor) == (block in free) for block in range(num_blocks))
        if step % 30 == 29:
            evictor.check_invariants()
    order = evictor.free_block_ids()
    assert sorted(order) == sorted(free)
    assert evictor.pop_n(len(free), 200.0) == order
    assert len(evictor) == 0


@pytest.mark.parametrize("cls", CLASSES)
def test_a_used_cache_is_freed_without_aborting_the_process(
    cls: type[LearnedCacheEvictor],
) -> None:
    """libCacheSim 0.3.5 frees a pointer into the cache's parameters once `to_evict` has
    run; the evictor restores the original first (a regression would abort this process)."""
    evictor = cls(8)
    evictor.reset(range(8))
    blocks = evictor.pop_n(8)
    evictor.push_cached(FreedBlocks(blocks, [0] * 8, [bytes([b]) for b in blocks]), Release(1.0))
    evictor.pop_n(3)
    evictor.reset(range(8))  # drops the first cache
    evictor.push_cached(FreedBlocks([0], [0], [b"x"]), Release(2.0))
    evictor.pop_n(8)
    del evictor
    gc.collect()


def test_a_learned_cache_cannot_be_copied() -> None:
    with pytest.raises(TypeError, match="cannot be copied or pickled"):
        pickle.dumps(LRBEvictor(4))


@pytest.mark.parametrize("name", ["lrb", "3l-cache"])
def test_bad_sizes_are_refused_in_one_line(name: str) -> None:
    with pytest.raises(ValueError, match=rf"{name}: num_blocks must be an int >= 0") as error:
        make_evictor(name, -1)
    assert "\n" not in str(error.value)


def test_without_the_extra_it_says_which_pip_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "libcachesim", None)
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'lpc\[rivals\]'") as error:
        make_evictor("lrb", 4)
    assert error.value.name == "libcachesim"
