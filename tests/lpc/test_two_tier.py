"""The two-tier replay on synthetic chats, and the latency model's arithmetic."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lpc.errors import InvalidInputError
from lpc.replay.ab import ReplayConstants
from lpc.replay.latency import QWEN3_8B, TierLatency, summarise_ttft
from lpc.replay.policies import parse_policies, parse_policy
from lpc.replay.probability import TurnsSource
from lpc.replay.simulator import prepare, replay
from lpc.replay.two_tier import TierSettings, replay_two_tier, run_two_tier_grid
from lpc.workload import WorkloadConfig, open_loop_requests
from tests.lpc.synthetic import conversations


@pytest.fixture(scope="module")
def workload():
    convs = conversations(300, seed=5)
    requests = open_loop_requests(
        convs, WorkloadConfig(duration_s=600, max_active_conversations=30)
    )
    turns = [r.turn for r in requests]
    turns_p = TurnsSource.fit([len(c) for c in conversations(200, seed=6)]).predict(turns)
    return prepare(requests, 16, {"turns": turns_p}, first_counted=len(requests) // 4)


@pytest.mark.parametrize("policy", ["lru", "arc", "lpc-turns"])
def test_the_gpu_tier_is_the_single_tier_replay(workload, policy: str) -> None:
    spec = parse_policy(policy)
    single = replay(workload, spec, 4000)
    two = replay_two_tier(workload, spec, parse_policy("lru"), 4000, 40_000, ReplayConstants())
    assert two.device_hit_tokens == single.hit_tokens
    assert two.queried_tokens == single.queried_tokens
    assert two.requests == single.requests
    assert two.allocation_failures == single.allocation_failures


def test_the_cpu_tier_serves_what_the_gpu_evicted(workload) -> None:
    lru = parse_policy("lru")
    small = replay_two_tier(workload, lru, lru, 4000, 16, ReplayConstants())
    large = replay_two_tier(workload, lru, lru, 4000, 400_000, ReplayConstants())
    assert large.host_hit_tokens > 0 and large.host_evictions == 0
    assert large.hit_ratio == pytest.approx(large.device_hit_ratio + large.host_hit_ratio)
    assert large.hit_ratio > small.hit_ratio
    # A host hit costs a copy, a miss a prefill: more host hits, lower TTFT.
    assert large.ttft_p90_s <= small.ttft_p90_s
    assert large.prefill_gpu_s_saved > small.prefill_gpu_s_saved


def test_an_unbounded_cpu_tier_lies_between_prompts_seen_and_an_unbounded_gpu(workload) -> None:
    """A CPU tier that never evicts holds every earlier prompt block, so each request hits at
    least the longest prefix of its prompt that earlier prompts held; both tiers hold only
    blocks some earlier request computed, so never more than an unbounded GPU cache hits."""
    lru = parse_policy("lru")
    bs = workload.block_size
    # room for every block of every request: a cache this large never evicts (checked below)
    unbounded = bs * sum(-(-len(r.turn.token_ids) // bs) for r in workload.requests)
    result = replay_two_tier(workload, lru, lru, 12_000, unbounded, ReplayConstants())
    seen: set[bytes] = set()
    lower = 0
    arrivals = sorted(
        range(len(workload.requests)), key=lambda i: (workload.requests[i].arrival_s, i)
    )
    for i in arrivals:
        request = workload.cache_requests[i]
        hashes = request.block_hashes
        hit = 0
        for h in hashes[: (request.num_prompt_tokens - 1) // bs]:
            if h not in seen:
                break
            hit += 1
        if i >= workload.first_counted:
            lower += hit * bs
        seen.update(hashes[: request.num_prompt_tokens // bs])
    assert result.allocation_failures == 0 and result.host_evictions == 0
    assert result.host_hit_tokens > 0
    unbounded_gpu = replay(workload, lru, unbounded)
    assert unbounded_gpu.evictions == 0 and unbounded_gpu.allocation_failures == 0
    upper = unbounded_gpu.hit_tokens
    assert lower <= result.device_hit_tokens + result.host_hit_tokens <= upper
    assert lower < upper  # the bounds differ: the GPU also caches outputs


def test_the_grid_replays_every_pair_on_one_trace(workload) -> None:
    tiers = TierSettings((1600, 8000), tuple(parse_policies("lru,arc")))
    results = run_two_tier_grid(
        workload, tuple(parse_policies("lru,fifo")), (4000,), tiers, ReplayConstants()
    )
    assert [(r.policy, r.offload_policy, r.offload_tokens) for r in results] == [
        (g, c, s) for g in ("lru", "fifo") for c in ("lru", "arc") for s in (1600, 8000)
    ]
    assert len({r.queried_tokens for r in results}) == 1


def test_kv_bytes_of_qwen3_8b() -> None:
    assert QWEN3_8B.bytes_per_token == 2 * 36 * 8 * 128 * 2 == 147_456


def test_ttft_is_prefill_of_misses_plus_copies_of_host_hits() -> None:
    latency = TierLatency(
        kv_bytes_per_token=100_000,
        host_to_device_bytes_per_s=1e9,
        prefill_tokens_per_s=10_000,
        prefill_s_per_token_pair=0.0,
    )
    ttft = latency.ttft_s(np.array([500.0]), np.array([300.0]), np.array([300.0]))
    assert ttft[0] == pytest.approx(0.02 + 500 / 10_000 + 300 * 100_000 / 1e9)
    assert latency.offload_gib(2**30 // 100_000) == pytest.approx(1.0, rel=1e-4)


def test_a_missed_token_costs_more_the_longer_the_context_it_attends_to() -> None:
    """The prefill after a cached prefix is the whole prompt's prefill less the prefix's."""
    latency = TierLatency(prefill_tokens_per_s=1000.0, prefill_s_per_token_pair=1e-6)

    def whole(tokens: float) -> float:
        return tokens / 1000.0 + 1e-6 * tokens**2

    cached, new = np.array([0.0, 4000.0]), np.array([1000.0, 1000.0])
    got = latency.suffix_prefill_s(cached, new)
    assert got.tolist() == pytest.approx([whole(1000), whole(5000) - whole(4000)])
    assert got[1] > got[0]  # the same 1,000 tokens after 4,000 cached ones cost more
    ttft = latency.ttft_s(new, np.array([0.0, 4000.0]), cached)
    assert ttft.tolist() == pytest.approx(
        [0.02 + got[0], 0.02 + got[1] + 4000 * latency.load_s_per_token]
    )
    assert latency.prefill_s(4000.0) == pytest.approx(whole(4000))


def test_ttft_summary_percentiles_and_savings() -> None:
    latency = TierLatency(
        kv_bytes_per_token=1e6,
        host_to_device_bytes_per_s=1e9,
        prefill_tokens_per_s=1000,
        prefill_s_per_token_pair=0.0,
        overhead_s=0.0,
    )
    # Misses 1000, 0, 500 tokens; host hits 0, 1000, 0.
    s = summarise_ttft(latency, [1000, 1000, 1000], [0, 0, 500], [0, 1000, 0])
    ttfts = [1.0, 1.0, 0.5]
    assert s.p50_s == pytest.approx(float(np.percentile(ttfts, 50)))
    assert s.p90_s == pytest.approx(float(np.percentile(ttfts, 90)))
    assert s.prefill_gpu_s_saved == pytest.approx(1.5)
    assert s.load_s == pytest.approx(1.0)
    with pytest.raises(ValueError, match="more hit tokens"):
        summarise_ttft(latency, [10], [8], [8])


def test_savings_count_each_requests_cached_prefix_with_its_attention() -> None:
    latency = TierLatency(prefill_tokens_per_s=1000.0, prefill_s_per_token_pair=1e-6)
    s = summarise_ttft(latency, [3000, 3000], [1000, 0], [1000, 500])
    # Cached prefixes of 2,000 and 500 tokens, each a prefill from scratch.
    assert s.prefill_gpu_s_saved == pytest.approx(
        2000 / 1000 + 1e-6 * 2000**2 + 500 / 1000 + 1e-6 * 500**2
    )


@pytest.mark.parametrize(
    "field",
    ["kv_bytes_per_token", "prefill_tokens_per_s", "prefill_s_per_token_pair", "overhead_s"],
)
def test_bad_latency_figures_name_the_field(field: str) -> None:
    value = -1.0 if field in ("overhead_s", "prefill_s_per_token_pair") else math.inf
    with pytest.raises(InvalidInputError, match=field):
        TierLatency(**{field: value})
