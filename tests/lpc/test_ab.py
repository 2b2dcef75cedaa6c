"""The A/B grid on synthetic chats: sanity of the policies and of the comparisons."""

from __future__ import annotations

import functools

import pytest

from lpc.replay.ab import ReplayConstants, compare, run_grid, size_to_reach
from lpc.replay.policies import parse_policies, parse_policy
from lpc.replay.probability import OracleSource, TurnsSource
from lpc.replay.simulator import prepare
from lpc.workload import WorkloadConfig, open_loop_requests
from tests.lpc.synthetic import conversations


@pytest.fixture(scope="module")
def grid():
    """The grid, read-only; tests/lpc/test_intervals.py reads the same one."""
    return _grid()


@functools.cache  # built once per process, whichever module asks first
def _grid():
    convs = conversations(300, seed=11)
    requests = open_loop_requests(
        convs, WorkloadConfig(duration_s=450, max_active_conversations=40)
    )
    turns = [r.turn for r in requests]
    sources = {
        "oracle": OracleSource().predict(turns),
        "turns": TurnsSource.fit([len(c) for c in conversations(300, seed=12)]).predict(turns),
    }
    workload = prepare(requests, 16, sources)
    specs = parse_policies("lru,fifo,lfu,lpc-turns,lpc-const,oracle,belady")
    sizes = [4000, 8000, 16000, 32000]
    results = run_grid(workload, specs, sizes, ReplayConstants(), workers=1)
    return workload, specs, sizes, results


def test_every_policy_ran_at_every_size(grid) -> None:
    _, specs, sizes, results = grid
    assert [(r.policy, r.cache_tokens) for r in results] == [
        (s.label, z) for s in specs for z in sizes
    ]
    assert all(r.requests == results[0].requests for r in results)  # one identical trace


def test_sanity_of_the_policies(grid) -> None:
    _, _, sizes, results = grid
    comparison = compare(results)
    lru = [comparison.hit_ratio["lru"][s] for s in sizes]
    assert lru == sorted(lru) and lru[0] < lru[-1], "LRU must grow with the cache"
    for s in sizes:
        best = max(comparison.hit_ratio[p][s] for p in comparison.hit_ratio)
        assert comparison.hit_ratio["belady"][s] == best
        assert abs(comparison.hit_ratio["lpc-const"][s] - comparison.hit_ratio["lru"][s]) < 0.005
        assert comparison.hit_ratio["oracle"][s] > comparison.hit_ratio["lru"][s]
        assert comparison.gap_closed["oracle"][s] == pytest.approx(1.0)
        assert comparison.gap_closed["lru"][s] == pytest.approx(0.0)


def test_serial_and_parallel_grids_agree(grid) -> None:
    workload, specs, sizes, results = grid
    parallel = run_grid(workload, specs[:2], sizes[:2], ReplayConstants(), workers=2)
    serial = {(r.policy, r.cache_tokens): r.hit_tokens for r in results}
    assert [(r.policy, r.cache_tokens) for r in parallel] == [
        (s.label, z) for s in specs[:2] for z in sizes[:2]
    ]
    assert all(serial[(r.policy, r.cache_tokens)] == r.hit_tokens for r in parallel)


def test_size_to_reach_interpolates_and_extends_to_the_origin() -> None:
    sizes, ratios = [100, 200, 300], [0.2, 0.4, 0.5]
    assert size_to_reach(sizes, ratios, 0.3) == pytest.approx(150)
    assert size_to_reach(sizes, ratios, 0.1) == pytest.approx(50)
    assert size_to_reach(sizes, ratios, 0.5) == pytest.approx(300)
    assert size_to_reach(sizes, ratios, 0.6) is None


def test_policy_parsing_errors_are_specific() -> None:
    assert parse_policy("lpc-const=0.25").constant == 0.25
    with pytest.raises(ValueError, match="unknown policy 'mru'"):
        parse_policy("mru")
    with pytest.raises(ValueError, match="must be in"):
        parse_policy("lpc-const=1.5")
    with pytest.raises(ValueError, match="listed twice: lru"):
        parse_policies("lru,fifo,lru")
