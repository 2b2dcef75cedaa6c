"""Every policy honours the evictor contract: no block lost, duplicated or handed out twice."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eviction import POLICIES as REGISTRY
from eviction import FreedBlocks, FutureUses, Release, make_evictor
from tests.eviction.policy_marks import (
    LEARNED_CACHE_EXAMPLES,
    learned_caches,
    other_policies,
    policy_params,
)
from tests.properties import check_due

POLICIES = policy_params(REGISTRY)


def build(name: str, num_blocks: int):
    if REGISTRY[name].kind == "upper bound":
        return make_evictor(name, num_blocks, future=FutureUses())
    return make_evictor(name, num_blocks)


@pytest.mark.parametrize("name", other_policies(REGISTRY))
@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_random_operations_keep_the_free_set_exact(name: str, seed: int) -> None:
    check_random_operations(name, seed)


@pytest.mark.slow
@pytest.mark.parametrize("name", learned_caches(REGISTRY))
@settings(max_examples=LEARNED_CACHE_EXAMPLES, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_random_operations_keep_a_learned_caches_free_set_exact(name: str, seed: int) -> None:
    check_random_operations(name, seed)


def check_random_operations(name: str, seed: int) -> None:
    """200 random pops, hits and releases; the free set checked after each (size and
    membership of every block), the eviction order and the invariants every `CHECK_EVERY`
    steps and at the end."""
    rng = random.Random(seed)
    num_blocks = 30
    evictor = build(name, num_blocks)
    evictor.reset(range(num_blocks))
    blocks = range(num_blocks)
    free = set(blocks)
    cached: set[int] = set()
    held: list[list[int]] = []
    now = 0.0
    for step in range(200):
        now += rng.random()
        op = rng.random()
        if op < 0.4 and free:
            chain = evictor.pop_n(rng.randint(1, min(6, len(free))), now)
            assert len(set(chain)) == len(chain), "a block was handed out twice in one call"
            assert set(chain) <= free, f"handed out blocks that were not free: {chain}"
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
            if rng.random() < 0.3:
                evictor.push_uncached(chain)
                cached -= set(chain)
            else:
                released = chain[::-1]
                evictor.push_cached(
                    FreedBlocks(
                        released,
                        list(range(len(chain) - 1, -1, -1)),
                        # a few contents recur, so that policies with ghosts meet them again
                        [None if rng.random() < 0.2 else bytes([rng.randrange(12)]) for _ in chain],
                    ),
                    Release(now, rng.random(), f"c{rng.randrange(4)}"),
                )
                cached |= set(chain)
            free |= set(chain)
        assert len(evictor) == len(free)
        members = [block in evictor for block in blocks]
        assert members == [block in free for block in blocks], f"step {step}: membership"
        if check_due(step):
            evictor.check_invariants()
            assert sorted(evictor.free_block_ids()) == sorted(free)
    evictor.check_invariants()
    assert sorted(evictor.free_block_ids()) == sorted(free)
    drained = evictor.pop_n(len(free), now)
    assert sorted(drained) == sorted(free)
    assert len(evictor) == 0


@pytest.mark.parametrize("name", POLICIES)
def test_uncached_blocks_are_reused_before_cached_ones(name: str) -> None:
    evictor = build(name, 6)
    evictor.reset(range(6))
    chain = evictor.pop_n(6)
    evictor.push_cached(FreedBlocks(chain[:3], [2, 1, 0], [None] * 3), Release(0.0, 0.1, "a"))
    evictor.push_uncached(chain[3:])
    assert evictor.pop_n(3) == chain[3:]


@pytest.mark.parametrize("name", POLICIES)
def test_free_block_ids_is_the_pop_order(name: str) -> None:
    rng = random.Random(7)
    evictor = build(name, 40)
    evictor.reset(range(40))
    blocks = evictor.pop_n(40)
    for start in range(0, 40, 8):
        chain = blocks[start : start + 8]
        evictor.push_cached(
            FreedBlocks(chain[::-1], list(range(7, -1, -1)), [None] * 8),
            Release(float(start), rng.random(), f"c{start}"),
        )
    expected = evictor.free_block_ids()
    assert evictor.pop_n(40, 100.0) == expected


def test_unknown_policy_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown eviction policy 'mru'.*lru"):
        make_evictor("mru", 4)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"scale_per_s": -1.0}, "scale_per_s"),
        ({"scale_per_s": float("nan")}, "scale_per_s"),
        ({"fallback_probability": 1.5}, "fallback_probability"),
        ({"fallback_probability": float("nan")}, "fallback_probability"),
        ({"probability_floor": 0.0}, "probability_floor"),
    ],
)
def test_lpc_rejects_bad_configuration(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_evictor("lpc", 4, **kwargs)
