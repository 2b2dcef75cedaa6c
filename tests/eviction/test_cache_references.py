"""S3-FIFO, SIEVE and ARC pick exactly the victims of their plain pseudo-code references."""

from __future__ import annotations

import random

import pytest
from hypothesis import given

from eviction import FreedBlocks, Release, make_evictor
from lpc.blocks.block_manager import PrefixCacheBlockManager
from tests.eviction.reference_caches import PLAIN_REFERENCES
from tests.eviction.test_lpc_reference import replay
from tests.lpc.streams import random_stream
from tests.properties import SEEDS, check_due, examples, exercised

POLICIES = sorted(PLAIN_REFERENCES)


def ghost_hashes(evictor) -> set[bytes]:
    """The hashes the fast evictor remembers as evicted (to count ghost hits)."""
    ghosts = [getattr(evictor, name, {}) for name in ("_ghost", "_b1", "_b2")]
    return {h for ghost in ghosts for h in ghost}


def drive(name: str, seed: int, num_blocks: int = 24, steps: int = 400) -> tuple[int, int]:
    """One random operation stream into both implementations; pops compared one by one, the
    fast one's invariants every `CHECK_EVERY` steps and at the end.

    Returns (cached evictions, releases whose content was in a ghost) so callers can check
    the stream reached the paths that matter.
    """
    rng = random.Random(seed)
    fast = make_evictor(name, num_blocks)
    plain = PLAIN_REFERENCES[name](num_blocks)
    for evictor in (fast, plain):
        evictor.reset(range(num_blocks))
    free = set(range(num_blocks))
    cached: set[int] = set()
    held: list[list[int]] = []
    evictions = ghost_hits = 0
    now = 0.0
    for step in range(steps):
        now += 1.0
        op = rng.random()
        if op < 0.4 and free:
            n = rng.randint(1, min(6, len(free)))
            chain = fast.pop_n(n, now)
            expected = plain.pop_n(n, now)
            assert chain == expected, f"{name} seed {seed} step {step}: {chain} != {expected}"
            evictions += len(set(chain) & cached)
            free -= set(chain)
            cached -= set(chain)
            held.append(chain)
        elif op < 0.6 and cached & free:
            block = rng.choice(sorted(cached & free))
            fast.remove(block)
            plain.remove(block)
            free.discard(block)
            held.append([block])
        elif held:
            chain = held.pop(rng.randrange(len(held)))
            if rng.random() < 0.15:
                fast.push_uncached(chain)
                plain.push_uncached(chain)
                cached -= set(chain)
            else:
                released = chain[::-1]
                hashes = [None if rng.random() < 0.1 else bytes([rng.randrange(40)]) for _ in chain]
                ghost_hits += len(ghost_hashes(fast) & set(hashes))
                freed = FreedBlocks(released, list(range(len(chain) - 1, -1, -1)), hashes)
                release = Release(now, rng.random(), f"c{rng.randrange(4)}")
                fast.push_cached(freed, release)
                plain.push_cached(freed, release)
                cached |= set(chain)
            free |= set(chain)
        assert len(fast) == len(plain) == len(free)
        if check_due(step):
            fast.check_invariants()
    fast.check_invariants()
    assert fast.pop_n(len(free), now) == plain.pop_n(len(free), now)
    return evictions, ghost_hits


@pytest.mark.parametrize("name", POLICIES)
@examples(30)
@given(seed=SEEDS)
def test_victims_match_the_plain_reference_on_random_streams(name: str, seed: int) -> None:
    evictions, ghost_hits = drive(name, seed)
    # the stream puts the cache under pressure and (SIEVE keeps no ghosts) brings evicted
    # content back
    exercised("cached evictions", evictions, 30)
    if name != "sieve":
        exercised("releases of ghost content", ghost_hits, 5)


@pytest.mark.parametrize("name", POLICIES)
@examples(8)
@given(seed=SEEDS)
def test_block_manager_allocations_match_the_plain_reference(name: str, seed: int) -> None:
    steps = random_stream(seed, 400)
    fast = PrefixCacheBlockManager(48, block_size=4, evictor=make_evictor(name, 48))
    plain = PrefixCacheBlockManager(48, block_size=4, evictor=PLAIN_REFERENCES[name](48))
    fast_trace = replay(fast, steps)
    plain_trace = replay(plain, steps)
    for i, (a, b) in enumerate(zip(fast_trace, plain_trace, strict=True)):
        assert a == b, f"{name} seed {seed}, allocation {i}: {a} != reference {b}"
    assert fast.counters == plain.counters
    evictions = sum(len(a.evicted_block_ids) for a in fast_trace if a is not None)
    exercised("evictions", evictions, 20)  # the stream puts the pool under pressure
