"""LPC as vLLM's CPU-tier `CachePolicy`, without vLLM: the hooks' effect on the evictor
(probability order, protected keys, atomic failure, pinned chunks, fallback p)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from lpc.integrations import vllm_cache_policy
from lpc.integrations.vllm_cache_policy import EvictorCachePolicy


@dataclass
class Status:
    """vLLM's ChunkStatus: -1 while the store is in flight, then a count of readers."""

    chunk_id: int
    ref_cnt: int = -1


@dataclass
class Context:
    """The parts of vLLM's ReqContext the policy reads."""

    req_id: str
    kv_transfer_params: dict[str, Any] | None = None
    positions: dict[bytes, int] = field(default_factory=dict)

    def get_offload_key_position(self, key: bytes) -> int | None:
        return self.positions.get(key)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def store(policy: EvictorCachePolicy, prefix: str, n: int, context: Context) -> list[bytes]:
    """insert + complete_store + on_request_finished of one request's n chunks."""
    keys = [f"{prefix}{i}".encode() for i in range(n)]
    for i, key in enumerate(keys):
        context.positions[key] = 16 * (i + 1)
        policy.insert(key, Status(i), context)
    for key in keys:
        policy.get(key).ref_cnt = 0
        policy.mark_evictable(key)
    policy.on_request_finished([keys], set(keys), set(), context)
    return keys


def request(rid: str, p: object) -> Context:
    return Context(rid, {"lpc_probability": p, "lpc_conversation_id": f"conv-{rid}"})


@pytest.fixture
def policy() -> EvictorCachePolicy:
    return EvictorCachePolicy(6, "lpc", clock=Clock())


def test_the_least_likely_request_is_evicted_first(policy: EvictorCachePolicy) -> None:
    likely = store(policy, "a", 2, request("a", 0.9))
    unlikely = store(policy, "b", 2, request("b", 0.1))
    evicted = policy.evict(2, set())
    assert evicted is not None
    assert sorted(key for key, _ in evicted) == sorted(unlikely)
    assert all(policy.get(k) is not None for k in likely)
    assert all(policy.get(k) is None for k in unlikely)


def test_protected_keys_stay_and_keep_their_order(policy: EvictorCachePolicy) -> None:
    likely = store(policy, "a", 2, request("a", 0.9))
    unlikely = store(policy, "b", 2, request("b", 0.1))
    evicted = policy.evict(2, set(unlikely))
    assert sorted(key for key, _ in evicted or []) == sorted(likely)
    # Back in the evictor with their old release: still the first to go.
    assert sorted(key for key, _ in policy.evict(2, set()) or []) == sorted(unlikely)


def test_an_eviction_that_cannot_be_met_changes_nothing(policy: EvictorCachePolicy) -> None:
    likely = store(policy, "a", 2, request("a", 0.9))
    unlikely = store(policy, "b", 2, request("b", 0.1))
    assert policy.evict(3, set(likely)) is None
    assert sorted(key for key, _ in policy.evict(2, set()) or []) == sorted(unlikely)


def test_pinned_chunks_are_not_evicted(policy: EvictorCachePolicy) -> None:
    store(policy, "a", 2, request("a", 0.9))
    unlikely = store(policy, "b", 2, request("b", 0.1))
    policy.get(unlikely[0]).ref_cnt = 1
    policy.mark_non_evictable(unlikely[0])  # a load reads it
    evicted = [key for key, _ in policy.evict(2, set()) or []]
    assert unlikely[0] not in evicted and unlikely[1] in evicted
    assert policy.evict(3, set()) is None  # only two evictable chunks left


def test_a_request_without_a_valid_probability_takes_the_fallback(
    policy: EvictorCachePolicy,
) -> None:
    store(policy, "a", 2, request("a", "high"))  # not a number: the fallback 0.5
    store(policy, "b", 2, request("b", 0.1))
    store(policy, "c", 2, Context("c"))  # no kv_transfer_params at all
    assert {key[:1] for key, _ in policy.evict(2, set()) or []} == {b"b"}


def test_remove_frees_the_slot_and_capacity_is_enforced() -> None:
    policy = EvictorCachePolicy(2, "lru")
    context = Context("r")
    policy.insert(b"k0", Status(0), context)  # a store in flight: not evictable
    policy.insert(b"k1", Status(1), context)
    with pytest.raises(RuntimeError, match="capacity of 2"):
        policy.insert(b"k2", Status(2), context)
    policy.remove(b"k0")  # the store failed
    policy.insert(b"k2", Status(2), context)
    assert policy.get(b"k0") is None and policy.get(b"k2") is not None
    assert policy.evict(1, set()) is None  # nothing completed its store
    policy.clear()
    assert policy.get(b"k1") is None and len(policy.evictor) == 0


def test_the_module_names_only_its_policies() -> None:
    with pytest.raises(AttributeError, match="NoSuchPolicy"):
        vllm_cache_policy.NoSuchPolicy  # noqa: B018
