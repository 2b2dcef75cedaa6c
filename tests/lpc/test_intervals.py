"""Gains over LRU carry a 95 % interval: a paired bootstrap over conversations.

The per-request hits a replay keeps add up to its totals; the interval of a replay against
itself is a point at zero; a policy that hits more in every conversation has an interval above
zero that contains its measured gain; the interval is seeded (the same replay, the same
interval); replays of different requests cannot be paired.
"""

from __future__ import annotations

import numpy as np
import pytest

from lpc.replay.ab import compare
from lpc.replay.intervals import paired_gain_interval
from lpc.replay.simulator import RequestHits
from tests.lpc.test_ab import grid  # noqa: F401  (the module fixture)


def test_per_request_hits_add_up_to_the_totals(grid) -> None:  # noqa: F811
    _, _, _, results = grid
    for result in results:
        assert result.per_request is not None
        assert int(result.per_request.hit_tokens.sum()) == result.hit_tokens
        assert len(result.per_request.conversations) == result.requests
        assert "per_request" not in result.to_dict()


def test_intervals_in_the_comparison(grid) -> None:  # noqa: F811
    _, _, sizes, results = grid
    comparison = compare(results)
    assert "lru" not in comparison.gain_over_lru_ci95
    for size in sizes:
        low, high = comparison.gain_over_lru_ci95["oracle"][size]
        gain = comparison.gain_over_lru["oracle"][size]
        assert low <= gain <= high and low > 0, (size, low, gain, high)
        low, high = comparison.gain_over_lru_ci95["belady"][size]
        assert low > 0


def hits(values: list[int], conversations: list[int]) -> RequestHits:
    return RequestHits(np.array(values, dtype=np.int64), np.array(conversations, dtype=np.int64))


def test_a_replay_against_itself_is_a_point_at_zero() -> None:
    same = hits([5, 0, 7, 3, 9, 1], [0, 0, 1, 2, 2, 3])
    interval = paired_gain_interval(same, same)
    assert interval is not None
    assert (interval.gain, interval.low, interval.high) == (0.0, 0.0, 0.0)


def test_more_hits_everywhere_is_a_gain_above_zero_and_seeded() -> None:
    rng = np.random.default_rng(3)
    conversations = np.repeat(np.arange(200), 3)
    base = rng.integers(10, 100, size=len(conversations))
    better = hits(list(base * 1.2 + rng.integers(0, 5, size=len(base))), list(conversations))
    interval = paired_gain_interval(better, hits(list(base), list(conversations)))
    assert interval is not None and 0.15 < interval.low < interval.gain < interval.high < 0.3
    again = paired_gain_interval(better, hits(list(base), list(conversations)))
    assert again == interval


def test_replays_of_different_requests_cannot_be_paired() -> None:
    with pytest.raises(ValueError, match="same counted requests"):
        paired_gain_interval(hits([1, 2], [0, 1]), hits([1, 2], [1, 0]))
    assert paired_gain_interval(hits([1, 2], [0, 0]), hits([1, 2], [0, 0])) is None
    assert paired_gain_interval(hits([1, 2], [0, 1]), hits([0, 0], [0, 1])) is None


def test_a_resample_without_baseline_hits_leaves_the_interval_undefined() -> None:
    # conversation 0 holds every baseline hit: a resample without it has no ratio
    interval = paired_gain_interval(
        hits([5, 0, 0, 1], [0, 1, 2, 3]), hits([3, 0, 0, 0], [0, 1, 2, 3])
    )
    assert interval is not None and interval.gain == 1.0
    assert np.isnan(interval.low) and np.isnan(interval.high)
