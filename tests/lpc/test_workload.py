"""The two-phase workload: seeded, bounded concurrency, arrivals after completion + think time."""

from __future__ import annotations

import itertools
import math

import pytest

from lpc.workload import (
    LatencyModel,
    WorkloadConfig,
    draw_scripts,
    open_loop_requests,
    run_schedule,
)
from tests.lpc.synthetic import conversations


def test_same_seed_same_timeline_and_other_seed_differs() -> None:
    convs = conversations(300, seed=1)
    config = WorkloadConfig(duration_s=600, max_active_conversations=20, seed=3)
    a = open_loop_requests(convs, config)
    b = open_loop_requests(convs, config)
    c = open_loop_requests(
        convs, WorkloadConfig(duration_s=600, max_active_conversations=20, seed=4)
    )
    key = [(r.request_id, r.arrival_s, r.completion_s) for r in a]
    assert key == [(r.request_id, r.arrival_s, r.completion_s) for r in b]
    assert key != [(r.request_id, r.arrival_s, r.completion_s) for r in c]


def test_concurrency_bound_window_and_turn_order() -> None:
    convs = conversations(400, seed=2)
    config = WorkloadConfig(duration_s=900, max_active_conversations=15, mean_think_time_s=50)
    requests = open_loop_requests(convs, config)
    assert requests and all(r.arrival_s < 900 for r in requests)
    spans: dict[str, list[float]] = {}
    for r in requests:
        span = spans.setdefault(r.conversation_id, [math.inf, -math.inf])
        span[0] = min(span[0], r.arrival_s)
        span[1] = max(span[1], r.completion_s)
    edges = sorted([(s, 1) for s, _ in spans.values()] + [(e, -1) for _, e in spans.values()])
    active = peak = 0
    for _, delta in edges:
        active += delta
        peak = max(peak, active)
    assert peak <= 15
    by_conv: dict[str, list] = {}
    for r in requests:
        by_conv.setdefault(r.conversation_id, []).append(r)
    for turns in by_conv.values():
        assert [r.turn.turn_index for r in turns] == list(range(len(turns)))
        for prev, nxt in itertools.pairwise(turns):
            assert nxt.arrival_s > prev.completion_s  # the user waits for the reply, then thinks


def test_think_times_are_exponential_with_the_configured_mean() -> None:
    convs = conversations(1000, seed=5, max_turns=8)
    scripts = list(draw_scripts(convs, WorkloadConfig(mean_think_time_s=100.0, seed=9)))
    gaps = [g for s in scripts for g in s.think_times_s]
    mean = sum(gaps) / len(gaps)
    assert len(gaps) > 3000
    assert 90 < mean < 110  # ~±3 standard errors for this many samples


def test_closed_loop_hits_shorten_requests() -> None:
    convs = conversations(50, seed=3)
    latency = LatencyModel(prefill_tokens_per_s=100.0, closed_loop=True)
    config = WorkloadConfig(duration_s=None, max_active_conversations=5, latency=latency)

    def run(hits: int) -> list:
        return run_schedule(draw_scripts(convs, config), config, lambda r: hits, lambda r: None)

    slow, fast = run(0), run(50)
    assert len(slow) == len(fast) == sum(len(c) for c in convs)
    assert sum(r.completion_s - r.arrival_s for r in fast) < sum(
        r.completion_s - r.arrival_s for r in slow
    )
    with pytest.raises(ValueError, match="closed-loop"):
        open_loop_requests(convs, config)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mean_think_time_s": 0}, "mean_think_time_s"),
        ({"max_active_conversations": 0}, "max_active_conversations"),
        ({"duration_s": -5}, "duration_s"),
    ],
)
def test_bad_workload_config(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        WorkloadConfig(**kwargs)


def test_bad_latency_model() -> None:
    with pytest.raises(ValueError, match="prefill_tokens_per_s"):
        LatencyModel(prefill_tokens_per_s=0)
    with pytest.raises(ValueError, match="overhead_s"):
        LatencyModel(overhead_s=float("nan"))


def test_closed_loop_replay_hits_more_than_a_cold_cache_and_refuses_belady() -> None:
    from lpc.replay.policies import parse_policy
    from lpc.replay.probability import OracleSource
    from lpc.replay.simulator import replay_closed_loop

    convs = conversations(80, seed=8)
    latency = LatencyModel(prefill_tokens_per_s=500.0, closed_loop=True)
    config = WorkloadConfig(duration_s=None, max_active_conversations=10, latency=latency)
    oracle = OracleSource()

    def run(policy: str, tokens: int):
        return replay_closed_loop(
            draw_scripts(convs, config),
            config,
            parse_policy(policy),
            tokens,
            16,
            lambda turn: oracle.predict([turn])[0],
        )

    small, large = run("lru", 2000), run("lru", 60000)
    assert small.requests == large.requests == sum(len(c) for c in convs)
    assert large.token_hit_ratio > small.token_hit_ratio
    assert run("oracle", 8000).token_hit_ratio >= run("lru", 8000).token_hit_ratio - 0.02
    with pytest.raises(ValueError, match="belady needs a fixed trace"):
        run("belady", 8000)


def test_estimated_scale_is_one_over_the_mean_observed_think_time() -> None:
    from lpc.workload import estimated_scale_per_s, observed_think_times

    convs = conversations(1000, seed=6, max_turns=8)
    for mean in (50.0, 200.0):
        config = WorkloadConfig(
            mean_think_time_s=mean, duration_s=None, max_active_conversations=300
        )
        requests = open_loop_requests(convs, config)
        gaps = observed_think_times(requests)
        assert all(g > 0 for g in gaps)
        assert estimated_scale_per_s(requests) == pytest.approx(1 / mean, rel=0.06)
    assert estimated_scale_per_s([], default=0.01) == 0.01
