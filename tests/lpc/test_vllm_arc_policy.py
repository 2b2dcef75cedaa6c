"""vLLM's ARC as the replay runs it (`lpc.replay.vllm_arc_policy`, the CPU tier's `vllm-arc`):
the contract of vLLM 0.33's `ARCCachePolicy`, each rule in a case where a wrong transcription
decides otherwise. The statements themselves are compared with vLLM's source in
tests/integrations/test_two_tier_agreement_sample.py, and the replay with the real manager
running vLLM's `arc` there and in tests/vllm/test_two_tier_agreement.py."""

from __future__ import annotations

import random
from dataclasses import dataclass

from lpc.replay.vllm_arc_policy import ReplayARCCachePolicy, order_request_keys


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
