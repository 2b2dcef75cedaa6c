"""`LPCReturnCachePolicy` without vLLM: the return-window evictor as vLLM's CPU-tier policy.

Each request's curve comes from the GPU plugin's release (`FinishedReleases`), its chunks are
released at its store-time accesses without one (the fallback score) and at its finish with
it, as the two-tier replay's CPU tier does; a store-time claim made under another
conversation id is dropped at the finish; the policy refuses to run without the plugin's
return-time model. A stand-in for vLLM's `CPUOffloadingManager` (the calls it makes on its
policy for lookups, loads and stores, store threshold 0) replays a synthetic workload beside
`lpc.replay.two_tier`: every request's CPU hit must agree. The real manager's counterpart is
tests/integrations/test_two_tier_agreement_sample.py (a Mooncake sample, real vLLM)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from eviction import Release
from eviction.return_window import ReturnWindowEvictor
from lpc.integrations.config import PluginConfigError
from lpc.integrations.cpu_tier_policy import (
    CACHE_POLICY_EVICTORS,
    ReturnEvictorCachePolicy,
    check_return_tier,
    request_release,
    tier_evictor_options,
)
from lpc.integrations.finished_releases import FinishedReleases
from lpc.replay.ab import ReplayConstants
from lpc.replay.policies import parse_policy
from lpc.replay.return_sources import true_return_curves
from lpc.replay.simulator import prepare
from lpc.replay.two_tier import RequestTiers, replay_two_tier
from lpc.workload import ARRIVAL, WorkloadConfig, open_loop_requests
from predictor.return_curve import ReturnCurve
from tests.integrations.test_fail_safe import make_runtime
from tests.integrations.test_vllm_cache_policy import Clock, Context, Status
from tests.lpc.synthetic import conversations


def curve(return_s: float) -> ReturnCurve:
    """The conversation comes back exactly `return_s` after the release."""
    return ReturnCurve(np.array([0.0, return_s * (1 - 1e-9), return_s]), np.array([1, 1, 0.0]))


def stored(policy: ReturnEvictorCachePolicy, prefix: str, n: int, context: Context) -> list:
    """A request's store (insert + complete_store) of n chunks, head to tail."""
    keys = [f"{prefix}{i}".encode() for i in range(n)]
    for i, key in enumerate(keys):
        context.positions[key] = 16 * (i + 1)
        policy.insert(key, Status(i), context)
        policy.get(key).ref_cnt = 0
        policy.mark_evictable(key)
    return keys


def finish(
    policy: ReturnEvictorCachePolicy,
    finished: FinishedReleases,
    context: Context,
    keys: list,
    release: Release,
) -> None:
    """The GPU plugin releases the request, then the connector reports it finished."""
    finished.record(context.req_id, release)
    policy.on_request_finished([keys], set(keys), set(), context)


def new_policy(capacity: int = 8) -> tuple[ReturnEvictorCachePolicy, FinishedReleases, Clock]:
    clock, finished = Clock(), FinishedReleases()
    policy = ReturnEvictorCachePolicy(capacity, clock=clock, finished=finished)
    assert isinstance(policy.evictor, ReturnWindowEvictor)
    return policy, finished, clock


def claims(policy: ReturnEvictorCachePolicy, key: bytes) -> list[tuple[Any, ...]]:
    if policy._pending:
        policy._flush()  # what the next hook does first
    slot = policy._chunks[key].slot
    return [(c.conversation_id, c.curve) for c in policy.evictor._state[slot].tag]


def test_the_curve_reaches_a_requests_chunks_with_the_plugins_release() -> None:
    policy, finished, clock = new_policy()
    soon, late = curve(10.0), curve(5000.0)
    a = stored(policy, "a", 2, Context("a", {"lpc_conversation_id": "A"}))
    b = stored(policy, "b", 2, Context("b", {"lpc_conversation_id": "B"}))
    assert claims(policy, b"a0") == [("A", None)], "stored while running: no curve yet"
    clock.now = 1.0
    finish(
        policy,
        finished,
        Context("a", {"lpc_conversation_id": "A"}),
        a,
        Release(1, None, "A", None, soon),
    )
    finish(
        policy,
        finished,
        Context("b", {"lpc_conversation_id": "B"}),
        b,
        Release(1, None, "B", None, late),
    )
    assert claims(policy, b"a0") == [("A", soon)]
    clock.now = 2.0
    evicted = [key for key, _ in policy.evict(2, set()) or []]
    assert evicted == b[::-1], "B does not come back within W: its chunks go, tail first"


def test_a_store_time_claim_under_the_request_id_is_dropped_at_its_finish() -> None:
    """The tier stores a running request's chunks under its id (its conversation is only in
    `extra_args`); the plugin's release names the conversation: the request-id claim does
    not stay to pool with the final one at the fallback score."""
    policy, finished, clock = new_policy()
    context = Context("r1")
    keys = stored(policy, "k", 2, context)
    assert claims(policy, b"k0") == [("r1", None)]
    clock.now = 1.0
    finish(policy, finished, context, keys, Release(1.0, None, "conv", None, curve(5000.0)))
    assert [c for c, _ in claims(policy, b"k0")] == ["conv"]
    # Another request of the conversation reuses the chunks (its store-time access) and
    # finishes: one claim per conversation, the newest.
    second = Context("r2", {"lpc_conversation_id": "conv"})
    policy.on_request_access(keys, second)
    assert claims(policy, b"k0") == [("conv", None)]
    finish(policy, finished, second, keys, Release(2.0, None, "conv", None, curve(1.0)))
    assert [c for c, _ in claims(policy, b"k0")] == ["conv"]


def test_the_policy_needs_the_plugins_return_model() -> None:
    assert CACHE_POLICY_EVICTORS["LPCReturnCachePolicy"] == "lpc-return"
    with pytest.raises(PluginConfigError, match="LPC_RETURN_MODEL"):
        check_return_tier(None)
    with pytest.raises(PluginConfigError, match="--scheduler-cls naming the LPC scheduler class"):
        check_return_tier(make_runtime())  # registered, no return model
    assert tier_evictor_options("lpc-return", make_runtime()) == {}, "its own constants"


def test_the_plugins_release_brings_its_curve() -> None:
    finished = FinishedReleases()
    late = curve(5000.0)
    finished.record("a", Release(0.0, None, "A", None, late))
    assert request_release(Context("a"), 3.0, finished) == Release(3.0, None, "A", None, late)
    assert request_release(Context("b"), 3.0, finished).return_curve is None


# -- agreement with the two-tier replay, through a stand-in manager ------------------------------
class StandInManager:
    """The calls vLLM 0.33's `CPUOffloadingManager` makes on its policy for the lookups, loads,
    stores and finishes of tests/vllm/two_tier_driver.py (store threshold 0): a load pins its
    chunks (`mark_non_evictable`) and reports its first access (`on_request_access`); a store
    reports the new and resident keys' first access, evicts the chunks the free slots lack with
    every offered key protected (all-or-nothing), inserts, and completes; a finish hands over
    every key the request saw, head to tail."""

    def __init__(self, policy: ReturnEvictorCachePolicy, num_chunks: int) -> None:
        self.policy = policy
        self.num_chunks = num_chunks
        self.seen: dict[str, list[Any]] = {}

    def lookup(self, key: Any) -> bool:
        chunk = self.policy.get(key)
        return chunk is not None and chunk.ref_cnt >= 0

    def _access(self, keys: list[Any], context: Context) -> None:
        seen = self.seen.setdefault(context.req_id, [])
        new = [key for key in keys if key not in seen]
        seen.extend(new)
        if new:
            self.policy.on_request_access(new, context)

    def load(self, keys: list[Any], context: Context) -> None:
        for key in keys:
            chunk = self.policy.get(key)
            if chunk.ref_cnt == 0:
                self.policy.mark_non_evictable(key)
            chunk.ref_cnt += 1
        self._access(keys, context)
        for key in keys:
            chunk = self.policy.get(key)
            chunk.ref_cnt -= 1
            if chunk.ref_cnt == 0:
                self.policy.mark_evictable(key)

    def store(self, keys: list[Any], context: Context) -> tuple[int, int] | None:
        policy = self.policy
        new = [key for key in keys if policy.get(key) is None]
        self._access([key for key in keys if key in new or self.lookup(key)], context)
        if not new:
            return 0, 0
        need = len(new) - (self.num_chunks - len(policy._chunks))
        evicted = []
        if need > 0:
            evicted = policy.evict(need, set(keys))
            if evicted is None:
                return None
        for key in new:
            policy.insert(key, Status(-1), context)
        for key in new:
            policy.get(key).ref_cnt = 0
            policy.mark_evictable(key)
        return len(new), len(evicted)

    def finish(self, context: Context) -> None:
        keys = sorted(self.seen.pop(context.req_id, []), key=context.positions.__getitem__)
        self.policy.on_request_finished([keys], set(), set(), context)


def test_the_policy_gives_every_request_the_replays_cpu_hit() -> None:
    requests = open_loop_requests(
        conversations(120, seed=4), WorkloadConfig(duration_s=400, max_active_conversations=20)
    )
    curves = true_return_curves(requests)
    workload = prepare(requests, 16, {}, curves={"true-return": curves})
    gpu_tokens, cpu_tokens = 2000, 4000
    served: list[RequestTiers] = []
    ours = replay_two_tier(
        workload,
        parse_policy("lru"),
        parse_policy("lpc-return-true"),
        gpu_tokens,
        cpu_tokens,
        ReplayConstants(),
        per_request=served,
    )
    assert ours.host_hit_tokens > 100 * 16 and ours.host_evictions > 100, "no pressure"
    num_chunks = cpu_tokens // 16  # the replay's CPU tier: one chunk per block, as vLLM's
    policy, finished, clock = new_policy(num_chunks)
    manager = StandInManager(policy, num_chunks)
    by_index = {r.index: r for r in served}
    contexts: dict[str, Context] = {}
    hits: dict[int, int] = {}
    stored_chunks = evicted_chunks = 0
    for time_s, kind, i in workload.events:
        tiers = by_index.get(i)
        if tiers is None:
            continue
        request, rid = workload.requests[i], workload.requests[i].request_id
        clock.now = time_s
        if kind != ARRIVAL:
            finished.record(rid, Release(time_s, None, request.conversation_id, None, curves[i]))
            manager.finish(contexts.pop(rid))
            continue
        context = contexts[rid] = Context(rid, {"lpc_conversation_id": request.conversation_id})
        hashes = workload.cache_requests[i].block_hashes
        keys = hashes[: request.turn.num_prompt_tokens // 16]
        for depth, key in enumerate(keys):
            context.positions[key] = 16 * (depth + 1)
        hit = 0
        for key in keys[tiers.device_blocks : tiers.max_blocks]:
            if not manager.lookup(key):
                break
            hit += 1
        if hit:
            manager.load(keys[tiers.device_blocks : tiers.device_blocks + hit], context)
        hits[i] = hit
        counts = manager.store(list(keys), context)
        if counts is not None:
            stored_chunks += counts[0]
            evicted_chunks += counts[1]
    assert hits == {r.index: r.host_blocks for r in served}
    assert (stored_chunks, evicted_chunks) == (ours.host_stored_chunks, ours.host_evictions)
    assert policy.stats.plugin_errors == 0 and policy.evictor.rekeys > 0
