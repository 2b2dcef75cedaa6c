"""WA (`eviction/wa.py`) evicts exactly what the plain reading of vLLM PR #22236 evicts:
the free block with the lowest predicted reuse probability, every block scored; the fast
version scores only the head of each category's queue."""

from __future__ import annotations

import math

import pytest
from hypothesis import given

from eviction import FreedBlocks, Release, WAEvictor
from eviction.wa import reuse_probability
from lpc.blocks.block_manager import PrefixCacheBlockManager
from tests.eviction.kv_policy_streams import drive, exercised_enough, replay_with_turns
from tests.eviction.reference_kv_policies import PlainWA
from tests.lpc.streams import random_stream
from tests.properties import SEEDS, examples, exercised

FITTED = {
    "chat_1": (0.3, 1 / 20),
    "chat_2": (0.7, 1 / 5),
    "file_1": (0.9, 1 / 60),
    "chat_3": (0.5, 1 / 2),
}


@examples(40)
@given(seed=SEEDS)
def test_victims_match_the_plain_reference_on_random_streams(seed: int) -> None:
    fast = WAEvictor(24, FITTED, default=(0.4, 1 / 10), window_weight=0.2)
    plain = PlainWA(24, FITTED, default=(0.4, 1 / 10), window_weight=0.2)
    seen = drive(fast, plain, seed, 24, max_step_s=3.0)
    exercised_enough(seen)


@examples(8)
@given(seed=SEEDS)
def test_block_manager_allocations_match_the_plain_reference(seed: int) -> None:
    steps = random_stream(seed, 400)
    params = {"chat_1": (0.2, 0.5), "chat_2": (0.8, 0.2), "doc_1": (0.6, 2.0), "doc_3": (1.0, 1.0)}
    fast = PrefixCacheBlockManager(48, block_size=4, evictor=WAEvictor(48, params))
    plain = PrefixCacheBlockManager(48, block_size=4, evictor=PlainWA(48, params))
    fast_trace = replay_with_turns(fast, steps, types=("chat", "doc"))
    plain_trace = replay_with_turns(plain, steps, types=("chat", "doc"))
    assert fast_trace == plain_trace
    assert fast.counters == plain.counters
    exercised("evictions", sum(len(a.evicted_block_ids) for a in fast_trace if a is not None), 20)


def test_reuse_probability_is_the_conditional_of_the_exponential_model() -> None:
    p, rate, t, w = 0.4, 0.1, 7.0, 12.0
    reused_later = p * math.exp(-rate * t)  # P(reuse after t)
    reused_in_window = p * (math.exp(-rate * t) - math.exp(-rate * (t + w)))
    expected = reused_in_window / (1 - p + reused_later)
    assert reuse_probability(p, rate, t, w) == pytest.approx(expected, rel=1e-12)
    assert reuse_probability(0.0, rate, t, w) == 0.0
    assert reuse_probability(1.0, rate, t, w) == pytest.approx(1 - math.exp(-rate * w))
    # an infinite window: the chance the block is ever reused (LPC's decayed probability)
    assert reuse_probability(p, rate, t, math.inf) == pytest.approx(
        reused_later / (1 - p + reused_later)
    )
    values = [reuse_probability(p, rate, idle, w) for idle in range(0, 200, 5)]
    assert values == sorted(values, reverse=True), "P must fall with idle time"


def freed(ids: list[int]) -> FreedBlocks:
    return FreedBlocks(ids[::-1], list(range(len(ids) - 1, -1, -1)), [None] * len(ids))


def test_the_head_least_likely_to_return_goes_first_not_the_oldest() -> None:
    # "chat_1" rarely returns, "chat_2" nearly always comes back, quickly.
    wa = WAEvictor(8, {"chat_1": (0.1, 1 / 50), "chat_2": (0.95, 1 / 50)})
    wa.reset(range(8))
    blocks = wa.pop_n(8)
    wa.push_cached(freed(blocks[:4]), Release(0.0, None, "a", "chat_2"))
    wa.push_cached(freed(blocks[4:]), Release(10.0, None, "b", "chat_1"))
    # the newer chat_1 chain goes before the older chat_2 one, deepest block first
    assert wa.pop_n(4, 20.0) == blocks[4:][::-1]
    assert wa.pop_n(4, 20.0) == blocks[:4][::-1]


def test_an_untagged_release_uses_the_default_and_one_category_is_lru() -> None:
    wa = WAEvictor(6, default=(0.5, 1 / 100))
    wa.reset(range(6))
    blocks = wa.pop_n(6)
    for i, block in enumerate(blocks):
        wa.push_cached(freed([block]), Release(float(i), None, None, None))
    wa.remove(blocks[2])
    assert wa.pop_n(5, 50.0) == [blocks[0], blocks[1], blocks[3], blocks[4], blocks[5]]


def test_the_window_follows_the_ages_of_evicted_blocks() -> None:
    wa = WAEvictor(4, window_weight=0.5)
    wa.reset(range(4))
    blocks = wa.pop_n(4)
    wa.push_cached(freed(blocks), Release(0.0, None, "a", "chat_1"))
    assert wa.window_s == math.inf
    wa.pop_n(1, 10.0)
    assert wa.window_s == 10.0
    wa.pop_n(1, 30.0)
    assert wa.window_s == pytest.approx(20.0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"default": (1.5, 0.1)}, "default reuse probability"),
        ({"default": (0.5, 0.0)}, "default reuse rate"),
        ({"categories": {"x": (0.5, float("nan"))}}, "category 'x' reuse rate"),
        ({"window_weight": 0.0}, "window_weight"),
    ],
)
def test_wa_rejects_bad_parameters(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        WAEvictor(4, **kwargs)
