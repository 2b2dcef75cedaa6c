"""LHD (`eviction/lhd.py`) evicts exactly what a plain transcription of the authors' LHD
(libCacheSim `lhd.cpp`) evicts when every free block is a candidate: the lowest hit density
given its class and age, ranks from the same statistics, reconfigurations and explorers."""

from __future__ import annotations

import math

import pytest
from hypothesis import given

from eviction import FreedBlocks, LHDEvictor, Release
from eviction.lhd import MAX_AGE, hit_age_class, model_hit_densities
from lpc.blocks.block_manager import PrefixCacheBlockManager
from tests.eviction.kv_policy_streams import drive, exercised_enough
from tests.eviction.reference_kv_policies import PlainLHD
from tests.eviction.test_lpc_reference import replay
from tests.lpc.streams import random_stream
from tests.properties import SEEDS, examples, exercised


def compare_on_a_random_stream(seed: int, num_blocks: int, unit: float, period: int) -> None:
    fast = LHDEvictor(num_blocks, unit, period, seed=seed)
    plain = PlainLHD(num_blocks, unit, period, seed=seed)
    steps = 400 if num_blocks < 100 else 1500
    seen = drive(fast, plain, seed, num_blocks, steps=steps)
    exercised("reconfigurations", fast.reconfigurations, 3)
    exercised_enough(seen)


# (age unit, accesses per reconfiguration): a small pool with frequent models; ages that
# overflow MAX_AGE (tiny unit).
@pytest.mark.parametrize(("unit", "period"), [(0.5, 40), (0.01, 30)])
@examples(8)
@given(seed=SEEDS)
def test_victims_match_the_plain_reference_on_random_streams(
    seed: int, unit: float, period: int
) -> None:
    compare_on_a_random_stream(seed, 24, unit, period)


@examples(4)
@given(seed=SEEDS)
def test_victims_match_the_plain_reference_with_explorers(seed: int) -> None:
    """A pool large enough for explorers (1 %)."""
    compare_on_a_random_stream(seed, 300, 1.0, 25)


@examples(4)
@given(seed=SEEDS)
def test_block_manager_allocations_match_the_plain_reference(seed: int) -> None:
    steps = random_stream(seed, 400)
    fast = PrefixCacheBlockManager(48, block_size=4, evictor=LHDEvictor(48, 0.5, 50))
    plain = PrefixCacheBlockManager(48, block_size=4, evictor=PlainLHD(48, 0.5, 50))
    fast_trace = replay(fast, steps)
    plain_trace = replay(plain, steps)
    assert fast_trace == plain_trace
    assert fast.counters == plain.counters
    exercised("evictions", sum(len(a.evicted_block_ids) for a in fast_trace if a is not None), 20)


def test_hit_age_classes_are_libcachesims() -> None:
    assert hit_age_class(0) == 15
    assert hit_age_class(MAX_AGE) == 0  # a new block: lastLastHitAge = MAX_AGE
    assert hit_age_class(MAX_AGE - 1) == 1
    assert hit_age_class(MAX_AGE // 2) == 1
    assert hit_age_class(MAX_AGE // 2 - 1) == 2
    assert hit_age_class(1) == 10


def test_hit_density_is_expected_hits_over_expected_lifetime() -> None:
    hits = [0.0] * MAX_AGE
    evictions = [0.0] * MAX_AGE
    hits[2], hits[5], evictions[9] = 3.0, 1.0, 4.0  # 8 objects: 3 hit at 2, 1 at 5, 4 evicted
    densities = model_hit_densities(hits, evictions)
    # an object at age 0 lives on average (3·3 + 1·6 + 4·10) / 8 more ticks, hits 4/8 times
    assert densities[0] == pytest.approx(4 / (3 * 3 + 1 * 6 + 4 * 10))
    # at age 3 only the 5 that have not hit yet remain: 1 hit, lifetimes 3 and 7 ticks ahead
    assert densities[3] == pytest.approx(1 / (1 * 3 + 4 * 7))
    assert densities[6] == 0.0 and densities[10] == 0.0  # past every hit: nothing to expect


def chain(ids: list[int]) -> FreedBlocks:
    return FreedBlocks(ids[::-1], list(range(len(ids) - 1, -1, -1)), [None] * len(ids))


def test_blocks_past_the_ages_that_ever_hit_go_first() -> None:
    lhd = LHDEvictor(6, age_unit_s=1.0, accesses_per_reconfiguration=1)
    lhd.reset(range(6))
    b = lhd.pop_n(6)
    lhd.push_cached(chain(b[0:2]), Release(0.0))
    for _ in range(3):  # b0 and b1 come back every 10 s: hits at age 10, class 0 then others
        lhd.remove(b[0])
        lhd.remove(b[1])
        lhd.push_cached(chain(b[0:2]), Release(lhd._clock_s + 10.0))
    t = lhd._clock_s
    lhd.push_cached(chain(b[2:6]), Release(t + 1.0))  # four new blocks
    # at t + 30 the new blocks are 29 s old, b0/b1 30 s: no density is left for any of them
    # past age 10, so they tie at 0 and leave by age (b0/b1 first, deeper block first)
    assert lhd.pop_n(6, t + 30.0) == [b[1], b[0], b[5], b[4], b[3], b[2]]
    lhd.check_invariants()


def test_an_age_past_max_age_is_the_lowest_rank() -> None:
    lhd = LHDEvictor(4, age_unit_s=1.0)
    lhd.reset(range(4))
    b = lhd.pop_n(4)
    lhd.push_cached(chain(b[0:2]), Release(0.0))
    lhd.push_cached(chain(b[2:4]), Release(10.0))
    now = float(MAX_AGE - 1)
    assert lhd.hit_density(b[0], now) == -math.inf
    assert lhd.hit_density(b[2], now) > 0.0  # age MAX_AGE − 11: the initial (c+1)/(a+1)
    assert lhd.pop_n(2, now) == [b[1], b[0]]


def test_lhd_rejects_bad_parameters() -> None:
    with pytest.raises(ValueError, match="age_unit_s"):
        LHDEvictor(4, age_unit_s=0.0)
    with pytest.raises(ValueError, match="accesses_per_reconfiguration"):
        LHDEvictor(4, accesses_per_reconfiguration=0)
