"""vLLM's ARC as the replay runs it (`lpc.replay.vllm_arc_policy`, the CPU tier's `vllm-arc`):
the contract of vLLM 0.33's `ARCCachePolicy`, each rule in a case where a wrong transcription
decides otherwise. The statements themselves are compared with vLLM's source in
tests/integrations/test_two_tier_agreement_sample.py, and the replay with the real manager
running vLLM's `arc` there and in tests/vllm/test_two_tier_agreement.py."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from lpc.replay.ab import ReplayConstants
from lpc.replay.cache_policy_tier import CachePolicyTier
from lpc.replay.policies import parse_policy
from lpc.replay.simulator import prepare
from lpc.replay.two_tier import host_tier, replay_two_tier
from lpc.replay.vllm_arc_policy import ReplayARCCachePolicy, order_request_keys
from lpc.workload import WorkloadConfig, open_loop_requests
from tests.lpc.synthetic import conversations


@dataclass
class Chunk:
    """vLLM's `ChunkStatus`: -1 while its store is in flight, then the loads reading it."""

    ref_cnt: int = 0

    @property
    def is_ready(self) -> bool:
        return self.ref_cnt >= 0


@dataclass
class Context:
    """A request context with each key's end-token position (none: unknown)."""

    positions: dict[str, int]

    def get_offload_key_position(self, key: str) -> int | None:
        return self.positions.get(key)


NO_POSITIONS = Context({})


def arc(capacity: int, *keys: str) -> ReplayARCCachePolicy:
    """A policy holding `keys`, stored and ready, in T1 (oldest first)."""
    policy = ReplayARCCachePolicy(capacity)
    for key in keys:
        policy.insert(key, Chunk(), NO_POSITIONS)
    return policy


def state(policy: ReplayARCCachePolicy) -> tuple:
    return (
        list(policy.t1),
        list(policy.t2),
        list(policy.b1),
        list(policy.b2),
        policy.target_t1_size,
    )


def evicted_keys(policy: ReplayARCCachePolicy, n: int, protected: set[str] = frozenset()) -> list:
    result = policy.evict(n, set(protected))
    assert result is not None
    return [key for key, _ in result]


def test_each_ghost_list_is_cut_to_the_capacity_oldest_first() -> None:
    policy = arc(2, "a", "b")
    assert evicted_keys(policy, 2) == ["a", "b"]
    policy.insert("c", Chunk(), NO_POSITIONS)
    policy.insert("d", Chunk(), NO_POSITIONS)
    assert evicted_keys(policy, 2) == ["c", "d"]
    assert list(policy.b1) == ["c", "d"]  # a and b, the oldest ghosts, are gone
    policy.check_invariants()


def test_ghost_lists_stay_within_the_capacity_on_a_random_stream() -> None:
    rng = random.Random(7)
    capacity = 6
    policy = ReplayARCCachePolicy(capacity)
    most_ghosts = 0
    for _ in range(3000):
        keys = [f"k{rng.randrange(20)}" for _ in range(rng.randint(1, 3))]
        new = [k for k in dict.fromkeys(keys) if policy.get(k) is None]
        policy.on_store_miss(new, NO_POSITIONS)
        overflow = len(policy) + len(new) - capacity
        if overflow > 0 and policy.evict(overflow, set(keys)) is None:
            continue
        for key in new:
            policy.insert(key, Chunk(), NO_POSITIONS)
        reused = {k for k in keys if k not in new}
        policy.on_request_finished((keys,), set(new), reused, NO_POSITIONS)
        policy.check_invariants()
        most_ghosts = max(most_ghosts, len(policy.b1), len(policy.b2))
    assert most_ghosts == capacity  # the bound is reached, and held
    assert policy.t2 and policy.target_t1_size > 0  # reuse and adaptation happened


def test_evict_returns_none_and_changes_nothing_when_too_few_are_evictable() -> None:
    policy = arc(5, "a", "b", "c", "d")
    policy.t1["b"].ref_cnt = 1  # a load reads it
    policy.t1["c"].ref_cnt = -1  # its store is in flight
    policy.on_request_finished((["a"],), set(), {"a"}, NO_POSITIONS)  # a: T2
    before = state(policy)
    assert policy.evict(3, {"d"}) is None  # a alone is evictable
    assert state(policy) == before
    assert policy.evict(0, set()) == []
    assert evicted_keys(policy, 1, {"d"}) == ["a"]


def test_protected_pinned_and_pending_chunks_are_never_evicted() -> None:
    rng = random.Random(11)
    for _ in range(200):
        keys = [f"k{i}" for i in range(8)]
        policy = arc(8, *keys)
        policy.on_request_finished((keys[::2],), set(), set(keys[::2]), NO_POSITIONS)
        for key in keys:
            policy.get(key).ref_cnt = rng.choice([-1, 0, 0, 0, 1, 2])
        protected = set(rng.sample(keys, 2))
        evictable = [k for k in keys if policy.get(k).ref_cnt == 0 and k not in protected]
        n = rng.randint(1, 8)
        result = policy.evict(n, protected)
        if n > len(evictable):
            assert result is None
            continue
        assert result is not None and len(result) == n
        assert {key for key, _ in result} <= set(evictable)
        for key, chunk in result:
            assert policy.get(key) is None and chunk.ref_cnt == 0


def test_reuse_moves_a_ready_chunk_to_t2_and_keeps_a_pending_one_in_t1() -> None:
    policy = arc(4, "ready", "pending", "other")
    policy.t1["pending"].ref_cnt = -1
    policy.touch(["ready", "pending"], NO_POSITIONS)
    assert list(policy.t2) == ["ready"]
    assert list(policy.t1) == ["other", "pending"]  # not promoted, now most recent in T1
    policy.touch(["ready"], NO_POSITIONS)
    assert list(policy.t2) == ["ready"]


def test_a_finished_request_promotes_what_it_reused_not_what_it_stored() -> None:
    policy = arc(6, "r0", "r1", "s0", "x")
    context = Context({"r0": 16, "r1": 32, "s0": 48})
    # Seen in store order, finished in prefix order: r0, r1 reused, s0 stored by the request.
    policy.on_request_finished((["s0", "r1", "r0"],), {"s0"}, {"r0", "r1"}, context)
    assert list(policy.t1) == ["x", "s0"]  # the stored chunk stays in T1, moved up
    assert list(policy.t2) == ["r1", "r0"]  # tail first: the head is the most recent
    policy.on_request_finished((["r0", "r1"],), set(), {"r0", "r1"}, context)
    assert list(policy.t2) == ["r1", "r0"]  # reused again: T2's recency, no double promotion
    policy.on_request_finished((["x"],), set(), set(), NO_POSITIONS)  # seen, neither
    assert list(policy.t1) == ["x", "s0"]


def test_the_target_of_t1_moves_on_store_misses_in_the_ghost_lists() -> None:
    policy = arc(4, "a", "b", "c", "d")
    policy.on_request_finished((["c", "d"],), set(), {"c", "d"}, NO_POSITIONS)  # T2: d, c
    assert evicted_keys(policy, 2) == ["a", "b"]  # |T1| 2 >= target 0: from T1
    policy.insert("e", Chunk(), NO_POSITIONS)
    policy.insert("f", Chunk(), NO_POSITIONS)
    policy.target_t1_size = 3.5  # |T1| 2 is under its target: from T2
    assert evicted_keys(policy, 1) == ["d"]
    policy.target_t1_size = 2.5  # |T1| 2 >= int(2.5): from T1, though T2 holds c
    assert evicted_keys(policy, 1) == ["e"]
    assert list(policy.b1) == ["a", "b", "e"] and list(policy.b2) == ["d"]
    policy.target_t1_size = 1.0
    policy.on_store_miss(["a", "zzz"], NO_POSITIONS)  # B1 hit: + max(1, |B2| / |B1|) = 1
    assert policy.target_t1_size == 2.0 and list(policy.b1) == ["b", "e", "a"]
    policy.target_t1_size = 4.0
    policy.on_store_miss(["d"], NO_POSITIONS)  # B2 hit: - max(1, |B1| / |B2|) = 3
    assert policy.target_t1_size == 1.0
    policy.on_store_miss(["d"], NO_POSITIONS)  # floored at 0
    assert policy.target_t1_size == 0.0
    for _ in range(10):
        policy.on_store_miss(["b"], NO_POSITIONS)
    assert policy.target_t1_size == 4  # capped at the capacity
    policy.insert("b", Chunk(-1), NO_POSITIONS)  # the store removes its ghost
    assert "b" not in policy.b1 and list(policy.t1)[-1] == "b"
    policy.check_invariants()


def test_order_request_keys_sorts_by_position_only_when_every_key_has_one() -> None:
    groups = (["c", "a"], ["b"])
    assert order_request_keys(groups, Context({"a": 1, "b": 2, "c": 3})) == ["a", "b", "c"]
    assert order_request_keys(groups, Context({"a": 1, "b": 2})) == ["c", "a", "b"]


def test_the_replay_runs_vllm_arc_in_the_cpu_tier_and_refuses_it_in_the_gpu_tier() -> None:
    convs = conversations(40, seed=4)
    workload = prepare(open_loop_requests(convs, WorkloadConfig(duration_s=300)), 16, {})
    settings = ReplayConstants()
    cpu = host_tier(workload, parse_policy("vllm-arc"), 1600, settings, store_threshold=2)
    assert isinstance(cpu, CachePolicyTier) and type(cpu.policy) is ReplayARCCachePolicy
    assert cpu.policy.cache_capacity == cpu.num_chunks == 100 and cpu.store_threshold == 2
    results = {
        name: replay_two_tier(
            workload, parse_policy("lru"), parse_policy(name), 800, 1600, settings
        )
        for name in ("vllm-arc", "arc", "lru")
    }
    ours = results["vllm-arc"]
    assert ours.offload_policy == "vllm-arc" and ours.host_hit_tokens > 0
    assert ours.host_evictions > 0
    # vLLM's ARC is neither LRU nor the replay's FAST'03 ARC on this workload.
    assert ours.host_hit_tokens != results["lru"].host_hit_tokens
    assert ours.host_hit_tokens != results["arc"].host_hit_tokens
    with pytest.raises(ValueError, match="not a GPU prefix-cache evictor"):
        replay_two_tier(
            workload, parse_policy("vllm-arc"), parse_policy("lru"), 800, 1600, settings
        )


def test_a_random_stream_keeps_the_vllm_arc_tier_consistent() -> None:
    rng = random.Random(5)
    for threshold in (0, 2):
        cpu = CachePolicyTier.running_vllm("vllm-arc", 12, 16, threshold)
        running: list[str] = []
        for r in range(300):
            prompt = [f"s{i}".encode() for i in range(2)]
            prompt += [f"c{r % 5}-{i}".encode() for i in range(rng.randint(0, 6))]
            hit = cpu.lookup(prompt, 1, len(prompt))
            cpu.load(f"r{r}", prompt, 1, hit, float(r))
            cpu.offer(f"r{r}", prompt, float(r))
            running.append(f"r{r}")
            cpu.check_invariants()
            while running and rng.random() < 0.5:
                rid = running.pop(rng.randrange(len(running)))
                cpu.finish(rid, r + 0.5, None, rid)
                cpu.check_invariants()
        assert set(cpu) == set(cpu.policy.t1) | set(cpu.policy.t2) and len(cpu) == len(set(cpu))
        assert cpu.policy.t2 and cpu.policy.b1
        assert cpu.counters.evictions > 0 and cpu.counters.loaded_chunks > 0
