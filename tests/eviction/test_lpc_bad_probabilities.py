"""Probabilities that are not numbers in [0, 1] reach neither evictor's keys as NaN.

A NaN p used to pass the clamp (`NaN < floor` and `NaN > 1 − floor` are both false), give its
blocks a NaN key and break the heap's order for every other block: with 5 % NaN releases the
valid blocks came out misordered in every trial. The rule now (docs/design.md "LPC's key"): a
NaN p is no prediction, the evictor's fallback p (counted in `fallbacks_used`); ±inf and
finite values outside [0, 1] are clamped to [floor, 1 − floor] like any other p.
"""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given

from eviction import FreedBlocks, LPCEvictor, PooledLPCEvictor, Release, static_key
from tests.properties import SEEDS, examples

NAN = float("nan")
NUM_BLOCKS = 200


def release_all(evictor: LPCEvictor, probabilities: list[float | None]) -> None:
    """One single-block release per probability, at times 1, 2, 3, ... (distinct keys); every
    free block is then cached."""
    evictor.reset(range(len(probabilities)))
    taken = evictor.pop_n(len(probabilities))
    for i, (block, p) in enumerate(zip(taken, probabilities, strict=True)):
        evictor.push_cached(FreedBlocks([block], [0], [None]), Release(1.0 + i, p, f"c{i}"))


def eviction_order(evictor: LPCEvictor, count: int) -> list[int]:
    order = evictor.pop_n(count)
    evictor.check_invariants()
    return order


@examples(50)
@given(seed=SEEDS)
def test_nan_probabilities_do_not_misorder_the_valid_blocks(seed: int) -> None:
    """5 % NaN among random p: the valid blocks leave in the order of their keys, and a NaN
    block exactly where a release without a prediction would have put it."""
    rng = random.Random(seed)
    n = 120
    probabilities: list[float | None] = [
        NAN if rng.random() < 0.05 else rng.uniform(0.01, 0.99) for _ in range(n)
    ]
    if not any(p != p for p in probabilities):  # every trial has at least one NaN
        probabilities[rng.randrange(n)] = NAN
    evictor = LPCEvictor(NUM_BLOCKS, scale_per_s=0.01, fallback_probability=0.4)
    release_all(evictor, probabilities)
    taken_ids = list(range(n))  # pop_n(n) of a fresh evictor hands out ids 0..n-1 in order
    order = evictor.pop_n(n)
    keys = {
        block: static_key(p, 1.0 + i, 0.01, 1e-6)
        for i, (block, p) in enumerate(zip(taken_ids, probabilities, strict=True))
        if p == p
    }
    valid = [block for block in order if block in keys]
    assert valid == sorted(keys, key=keys.get), "the valid blocks left out of key order"
    evictor.check_invariants()
    # A NaN p behaves exactly as no prediction: the order equals the one with None there.
    again = LPCEvictor(NUM_BLOCKS, scale_per_s=0.01, fallback_probability=0.4)
    release_all(again, [None if p != p else p for p in probabilities])
    assert order == eviction_order(again, n)
    assert evictor.fallbacks_used == sum(1 for p in probabilities if p != p)


@pytest.mark.parametrize("evictor_class", [LPCEvictor, PooledLPCEvictor])
def test_no_key_is_nan_whatever_the_probability(evictor_class: type[LPCEvictor]) -> None:
    values = [NAN, math.inf, -math.inf, -0.5, 1.5, 0.0, 1.0, None, 0.3]
    evictor = evictor_class(NUM_BLOCKS, fallback_probability=0.4)
    release_all(evictor, values)
    for block in range(len(values)):
        key = evictor.pooled_key(block)
        assert key is not None and not math.isnan(key)
    evictor.check_invariants()
    assert len(eviction_order(evictor, len(values))) == len(values)
    # Shared releases (max or OR pooling) of blocks in use, then their last release.
    shared = FreedBlocks([0, 1], [1, 0], [b"x", b"y"])
    evictor.note_shared_release(shared, Release(50.0, 0.2, "a"))
    evictor.note_shared_release(shared, Release(51.0, NAN, "b"))
    evictor.push_cached(shared, Release(52.0, math.inf, "c"))
    assert not any(math.isnan(evictor.pooled_key(b)) for b in (0, 1))
    evictor.check_invariants()
    assert sorted(eviction_order(evictor, 2)) == [0, 1]


def test_a_nan_p_keys_like_the_fallback_and_infinities_clamp() -> None:
    evictor = LPCEvictor(4, scale_per_s=0.01, fallback_probability=0.4, probability_floor=1e-6)
    assert evictor.key_for(Release(10.0, NAN)) == evictor.key_for(Release(10.0, None))
    assert evictor.key_for(Release(10.0, math.inf)) == evictor.key_for(Release(10.0, 1.0))
    assert evictor.key_for(Release(10.0, -math.inf)) == evictor.key_for(Release(10.0, 0.0))
    assert static_key(NAN, 10.0, 0.01, 1e-6) == static_key(0.5, 10.0, 0.01, 1e-6)
    assert static_key(NAN, 10.0, 0.01, 1e-6, fallback=0.4) == static_key(0.4, 10.0, 0.01, 1e-6)


def test_nan_does_not_poison_the_pooled_trust_gate() -> None:
    """The gate scores the model's p against labels: a NaN p is no prediction there too, or
    one NaN would make the model's loss NaN and the model untrusted for ever."""
    evictor = PooledLPCEvictor(NUM_BLOCKS, scale_per_s=0.0, model_min_labels=2, horizon_s=10.0)
    evictor.reset(range(NUM_BLOCKS))
    blocks = iter(evictor.pop_n(NUM_BLOCKS))
    t = 0.0
    for step in range(60):
        t += 1.0
        # Regulars come back (p 0.9 is right), one-off conversations do not (p 0.1 is).
        regular = step % 2 == 0
        conversation = f"r{step % 4}" if regular else f"once-{step}"
        p = NAN if step % 7 == 0 else (0.9 if regular else 0.1)
        evictor.push_cached(FreedBlocks([next(blocks)], [0], [None]), Release(t, p, conversation))
    assert not math.isnan(evictor.model_loss_nats)
    assert evictor.model_trusted
    evictor.check_invariants()
