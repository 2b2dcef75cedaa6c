"""LPC as vLLM's CPU-tier `CachePolicy`, without vLLM: the hooks' effect on the evictor
(probability order, protected keys, atomic failure, pinned chunks, fallback p), chain order
(tail before head, a shared prefix after its suffixes), where p and the conversation come
from (the GPU plugin's release, kv_transfer_params, kv_hints), the tier's horizon, and the
fail-safe (bad p, raising evictor, context and clock). The requests here carry their p in
`kv_transfer_params` as an API layer the operator trusts sets it (`trust_request_hints`);
what an untrusted body gets is in test_vllm_cache_policy_trust.py."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from eviction import Release
from eviction.lpc_pooled import DEFAULT_SHARED_HORIZON_S
from lpc.integrations import cpu_tier_policy, vllm_plugin
from lpc.integrations.config import PluginConfigError
from lpc.integrations.cpu_tier_policy import (
    CACHE_POLICY_EVICTORS,
    EvictorCachePolicy,
    cache_policy_class,
    hinted_conversation,
    request_release,
    tier_evictor_options,
    tier_horizon_s,
)
from lpc.integrations.finished_releases import FinishedReleases
from lpc.integrations.stats import PluginStats
from lpc.integrations.trust import HintTrust
from lpc.integrations.vllm_queue import TenantRelease
from tests.integrations.test_fail_safe import Request as FakeRequest
from tests.integrations.test_fail_safe import make_runtime, with_model

TRUSTED = HintTrust(trust_request_hints=True)


def trusted_policy(*args: Any, **kwargs: Any) -> EvictorCachePolicy:
    """A policy whose requests' `kv_transfer_params` come from a trusted API layer."""
    return EvictorCachePolicy(*args, trust=TRUSTED, **kwargs)


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
    kv_hints: Any = None

    def get_offload_key_position(self, key: bytes) -> int | None:
        return self.positions.get(key)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def store(policy: EvictorCachePolicy, prefix: str, n: int, context: Context) -> list[bytes]:
    """insert + complete_store + on_request_finished of one request's n chunks."""
    keys = store_running(policy, prefix, n, context)
    policy.on_request_finished([keys], set(keys), set(), context)
    return keys


def request(rid: str, p: object) -> Context:
    return Context(rid, {"lpc_probability": p, "lpc_conversation_id": f"conv-{rid}"})


@pytest.fixture
def policy() -> EvictorCachePolicy:
    return trusted_policy(6, "lpc", clock=Clock())


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
    policy = trusted_policy(2, "lru")
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


def test_each_vllm_class_is_written_out_on_its_evictor() -> None:
    """vLLM resolves `eviction_policy` with `getattr(module, name)`: every name of
    `CACHE_POLICY_EVICTORS` is a class of `vllm_cache_policy` (read here without importing
    vLLM), on the base `cache_policy_class` gives its evictor, built with that evictor; the
    module synthesises nothing."""
    source = Path(cpu_tier_policy.__file__).with_name("vllm_cache_policy.py").read_text()
    tree = ast.parse(source)
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    assert set(classes) == set(CACHE_POLICY_EVICTORS)
    assert not any(isinstance(n, ast.FunctionDef) for n in tree.body)  # no __getattr__
    for name, evictor in CACHE_POLICY_EVICTORS.items():
        bases = [ast.unparse(base) for base in classes[name].bases]
        expected = cache_policy_class(evictor)
        assert expected is not None and bases == [expected.__name__, "CachePolicy"], name
        calls = [
            node
            for node in ast.walk(classes[name])
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "init_for_engine"
        ]
        assert [ast.literal_eval(call.args[2]) for call in calls] == [evictor], name


# -- chain order ------------------------------------------------------------------------------
def evicted_order(policy: EvictorCachePolicy) -> list[bytes]:
    """Every evictable chunk, one eviction at a time."""
    order = []
    while (evicted := policy.evict(1, set())) is not None:
        order.extend(key for key, _ in evicted)
    return order


@pytest.mark.parametrize("evictor", ["lpc", "lpc-pooled"])
def test_a_conversations_tail_goes_before_its_head(evictor: str) -> None:
    policy = trusted_policy(6, evictor, clock=Clock())
    keys = store(policy, "a", 4, request("a", 0.7))
    assert evicted_order(policy) == keys[::-1]


def store_after(
    policy: EvictorCachePolicy, prefix: list[bytes], suffix: str, context: Context
) -> list[bytes]:
    """A request that reuses the resident `prefix` and stores one chunk of its own after it."""
    key = f"{suffix}1".encode()
    for i, k in enumerate(prefix):
        context.positions[k] = 16 * (i + 1)
    context.positions[key] = 16 * (len(prefix) + 1)
    policy.insert(key, Status(9), context)
    policy.get(key).ref_cnt = 0
    policy.mark_evictable(key)
    policy.on_request_finished([[*prefix, key]], {key}, set(prefix), context)
    return [key]


@pytest.mark.parametrize(("p_first", "p_second"), [(0.9, 0.1), (0.1, 0.9), (0.5, 0.5)])
def test_a_shared_prefix_outlives_its_suffixes(p_first: float, p_second: float) -> None:
    """Max pooling: the prefix two conversations share keeps the larger of their keys, so it
    goes after both suffixes (at a tie on the key, the deeper chunk goes first)."""
    clock = Clock()
    policy = trusted_policy(6, "lpc", clock=clock)
    prefix = store(policy, "s", 1, request("first", p_first))
    first = store_after(policy, prefix, "x", request("first", p_first))
    clock.now = 10.0
    second = store_after(policy, prefix, "y", request("second", p_second))
    order = evicted_order(policy)
    assert sorted(order[:2]) == sorted(first + second) and order[2:] == prefix


# -- where p and the conversation come from ----------------------------------------------------
def test_the_gpu_plugins_release_comes_first_then_kv_transfer_params() -> None:
    finished = FinishedReleases(8)
    finished.record("a", Release(0.0, 0.05, "conv-a"))
    finished.record("b", Release(0.0, None, "b"))  # the plugin fell back: no p, no conversation
    params = {"lpc_probability": 0.9, "lpc_conversation_id": "params-a"}
    release = request_release(Context("a", params), 3.0, finished, trust=TRUSTED)
    assert release == Release(3.0, 0.05, "conv-a")
    release = request_release(Context("b", params), 3.0, finished, trust=TRUSTED)
    assert release == TenantRelease(3.0, 0.9, "params-a", hinted=True)  # a trusted hint
    assert request_release(Context("c"), 3.0, finished) == Release(3.0, None, "c")


def test_the_conversation_may_come_from_kv_hints() -> None:
    action = SimpleNamespace(payload={"conversation_id": "hinted"})
    hints = SimpleNamespace(actions=[SimpleNamespace(payload="not a mapping"), action])
    assert request_release(Context("r", kv_hints=hints), 1.0).conversation_id == "hinted"
    params = {"lpc_conversation_id": "params"}
    assert request_release(Context("r", params, kv_hints=hints), 1.0).conversation_id == "params"
    assert hinted_conversation(None) is None


def test_predictions_come_from_the_plugins_in_process_access_model() -> None:
    """The GPU plugin predicts each finished request with its access model at the release; the
    CPU tier orders the same request's chunks by that p (nothing in kv_transfer_params)."""
    runtime = with_model(make_runtime(), lambda i: 0.9 if i == 0 else 0.1)
    for index, rid in enumerate(["likely", "unlikely"]):
        runtime.release_for(FakeRequest(rid, index, {"lpc_conversation_id": f"c-{rid}"}))
    assert runtime.finished.get("unlikely") is not None
    policy = trusted_policy(6, "lpc", clock=Clock(), finished=runtime.finished)
    likely = store(policy, "a", 2, Context("likely"))
    unlikely = store(policy, "b", 2, Context("unlikely"))
    assert sorted(k for k, _ in policy.evict(2, set()) or []) == sorted(unlikely)
    assert all(policy.get(k) is not None for k in likely)
    assert policy._chunks[likely[0]].release.conversation_id == "c-likely"


def test_the_finished_releases_are_bounded() -> None:
    finished = FinishedReleases(2)
    for rid in "abc":
        finished.record(rid, Release(0.0, 0.5, rid))
    assert len(finished) == 2 and finished.get("a") is None and finished.get("c") is not None
    with pytest.raises(ValueError, match="capacity"):
        FinishedReleases(0)


# -- the tier's horizon -----------------------------------------------------------------------
def test_the_tiers_horizon_is_its_own_setting_else_the_models() -> None:
    runtime = with_model(make_runtime(), lambda i: 0.5)  # the fake model's horizon: 180 s
    runtime.access.predictor.horizon_s = 240.0
    assert tier_horizon_s(None) == DEFAULT_SHARED_HORIZON_S
    assert tier_horizon_s(runtime) == 240.0
    runtime.kv_connector_extra_config = {"lpc_horizon_s": 1200}
    options = tier_evictor_options("lpc-pooled", runtime)
    assert options["horizon_s"] == 1200.0 and options["memory_window_s"] == 1200.0
    assert options["fallback_probability"] == runtime.config.fallback_probability
    policy = trusted_policy(4, "lpc-pooled", **options)
    assert policy.evictor.horizon_s == 1200.0
    # Chunks stored one by one are no chain's contiguous tail: the tier keeps the hash memory.
    assert policy.evictor.memory == "content"
    assert trusted_policy(4, "lpc-pooled").evictor.memory == "content"
    assert "horizon_s" not in tier_evictor_options("lpc", runtime)
    for bad in (0, -5.0, float("nan"), "long", True):
        runtime.kv_connector_extra_config = {"lpc_horizon_s": bad}
        with pytest.raises(PluginConfigError, match="lpc_horizon_s"):
            tier_horizon_s(runtime)


def test_the_scheduler_class_hands_the_connector_config_to_the_tier() -> None:
    """Before vLLM's constructor builds the connector (and the CPU tier's policy in it), the
    LPC scheduler class notes the engine's `kv_connector_extra_config` in the runtime
    (`vllm_plugin.note_engine`), where the tier's policy reads its `lpc_*` keys."""
    runtime = make_runtime()
    transfer = SimpleNamespace(kv_connector_extra_config={"lpc_horizon_s": 900})
    config = SimpleNamespace(speculative_config=None, kv_transfer_config=transfer)
    vllm_plugin.note_engine(runtime, config)
    assert runtime.kv_connector_extra_config == {"lpc_horizon_s": 900}
    assert tier_horizon_s(runtime) == 900


# -- fail-safe --------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -0.2, 1.5, True])
def test_a_bad_probability_is_counted_and_takes_the_fallback(bad: object) -> None:
    stats = PluginStats()
    policy = trusted_policy(6, "lpc", clock=Clock(), stats=stats)
    store(policy, "a", 2, request("a", 0.3))
    store(policy, "b", 2, request("b", bad))  # the fallback 0.5: outlives a
    assert {k[:1] for k, _ in policy.evict(2, set()) or []} == {b"a"}
    assert stats.invalid_probabilities >= 1


def test_a_bad_probability_in_the_plugins_release_is_counted() -> None:
    stats = PluginStats()
    finished = FinishedReleases()
    finished.record("r", Release(0.0, float("nan"), "c"))
    context = Context("r", {"lpc_probability": 0.2})
    release = request_release(context, 1.0, finished, stats, TRUSTED)
    assert release.probability == 0.2 and stats.invalid_probabilities == 1


class RaisingContext(Context):
    def get_offload_key_position(self, key: bytes) -> int | None:
        raise RuntimeError("no positions")

    @property
    def kv_hints(self) -> Any:  # type: ignore[override]
        raise RuntimeError("no hints")

    @kv_hints.setter
    def kv_hints(self, value: Any) -> None:
        pass


def test_a_broken_request_context_costs_only_the_prediction() -> None:
    stats = PluginStats()
    policy = trusted_policy(4, "lpc", clock=Clock(), stats=stats)
    context = RaisingContext("r")
    policy.insert(b"k", Status(0, ref_cnt=0), context)
    policy.touch([b"k"], context)
    assert stats.plugin_errors >= 2
    assert policy.get(b"k") is not None
    assert [k for k, _ in policy.evict(1, set()) or []] == [b"k"]


def fail_once(target: Any, name: str) -> list[int]:
    """Make `target.name` raise on its next call only; the list counts the failures."""
    original = getattr(target, name)
    failures: list[int] = []

    def failing(*args: Any, **kwargs: Any) -> Any:
        if not failures:
            failures.append(1)
            raise RuntimeError(f"{name} failed")
        return original(*args, **kwargs)

    setattr(target, name, failing)
    return failures


@pytest.mark.parametrize("method", ["push_cached", "remove"])
def test_an_evictor_that_raises_in_a_hook_is_rebuilt(method: str) -> None:
    stats = PluginStats()
    policy = trusted_policy(6, "lpc", clock=Clock(), stats=stats)
    store(policy, "a", 2, request("a", 0.9))
    context = request("b", 0.1)
    unlikely = store_running(policy, "b", 2, context)
    policy.touch([], request("c", 0.5))  # queues b's chunks, provisional, before its finish
    fail_once(policy.evictor, method)
    # the finish takes b's chunks out (remove) and queues them with its p (push_cached)
    policy.on_request_finished([unlikely], set(unlikely), set(), context)
    assert stats.plugin_errors == 1
    policy.evictor.check_invariants()
    assert len(policy.evictor) == 4
    assert sorted(k for k, _ in policy.evict(2, set()) or []) == sorted(unlikely)


def test_a_raising_eviction_falls_back_to_lru_atomically() -> None:
    clock = Clock()
    stats = PluginStats()
    policy = trusted_policy(6, "lpc", clock=clock, stats=stats)
    old = store(policy, "a", 2, request("a", 0.9))
    clock.now = 5.0
    store(policy, "b", 2, request("b", 0.1))
    fail_once(policy.evictor, "pop_n")
    evicted = policy.evict(2, set())
    assert [k for k, _ in evicted or []] == old[::-1]  # LRU: the oldest release, tail first
    assert stats.plugin_errors == 1 and not policy.degraded
    assert len(policy.evictor) == 2 and all(policy.get(k) is None for k in old)
    assert policy.evict(3, set()) is None


def test_an_evictor_that_cannot_be_rebuilt_leaves_the_tier_in_lru_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = Clock()
    stats = PluginStats()
    policy = trusted_policy(6, "lpc", clock=clock, stats=stats)
    monkeypatch.setattr(cpu_tier_policy, "make_evictor", failing_make_evictor)
    fail_once(policy.evictor, "push_cached")
    old = store(policy, "a", 2, request("a", 0.1))
    assert policy.degraded and stats.plugin_errors == 2
    clock.now = 5.0
    store(policy, "b", 2, request("b", 0.9))
    policy.get(old[1]).ref_cnt = 1
    policy.mark_non_evictable(old[1])  # a load pins it: never evicted
    assert [k for k, _ in policy.evict(2, {b"b1"}) or []] == [old[0], b"b0"]
    assert policy.evict(2, set()) is None


def failing_make_evictor(*args: Any, **kwargs: Any) -> Any:
    raise MemoryError("no evictor")


def test_a_tier_whose_evictor_never_existed_stores_and_finishes_in_lru_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Degraded from the start (no evictor was ever built): a request's finish, with its
    chunks still waiting to be queued, reaches no evictor and raises nothing."""
    monkeypatch.setattr(cpu_tier_policy, "make_evictor", failing_make_evictor)
    clock = Clock()
    stats = PluginStats()
    policy = trusted_policy(6, "lpc", clock=clock, stats=stats)
    assert policy.degraded and stats.plugin_errors == 1
    old = store(policy, "a", 2, request("a", 0.9))
    clock.now = 5.0
    store(policy, "b", 2, request("b", 0.1))
    assert stats.plugin_errors == 1
    assert [k for k, _ in policy.evict(2, set()) or []] == old[::-1]


# -- provisional releases (a request still running) ---------------------------------------------
def test_the_final_release_replaces_a_provisional_one_of_another_conversation() -> None:
    """Stores while a request runs carry no p yet; when it finishes, the GPU plugin's release
    (its own conversation id, not the request id) re-keys them outright: no max pooling with
    the provisional key, and the tail still goes first."""
    clock = Clock()
    finished = FinishedReleases()
    policy = trusted_policy(6, "lpc", clock=clock, finished=finished)
    for rid, p in [("moderate", 0.3), ("unlikely", 0.1)]:
        context = Context(rid)
        keys = [f"{rid}-{i}".encode() for i in range(2)]
        for i, key in enumerate(keys):
            context.positions[key] = 16 * (i + 1)
            policy.insert(key, Status(i), context)  # the request runs: provisional
            policy.get(key).ref_cnt = 0
            policy.mark_evictable(key)
        assert all(policy._chunks[k].provisional for k in keys)
        finished.record(rid, Release(clock.now, p, f"conversation-{rid}"))
        policy.on_request_finished([keys], set(keys), set(), context)
        clock.now += 1.0
    assert evicted_order(policy) == [b"unlikely-1", b"unlikely-0", b"moderate-1", b"moderate-0"]


def test_a_running_requests_touch_moves_only_its_own_chunks() -> None:
    clock = Clock()
    policy = trusted_policy(6, "lpc", clock=clock)
    unlikely = store(policy, "u", 2, request("u", 0.1))
    likely = store(policy, "l", 2, request("l", 0.9))
    clock.now = 50.0
    policy.touch(unlikely, Context("running"))  # a running request reads u's chunks
    assert evicted_order(policy) == unlikely[::-1] + likely[::-1]


def test_a_removed_chunks_slot_forgets_its_release() -> None:
    """vLLM removes a chunk whose store failed; the next chunk in its slot must not inherit
    the old chunk's key through max pooling."""
    policy = trusted_policy(3, "lpc", clock=Clock())
    (old,) = store(policy, "o", 1, request("o", 0.99))
    slot = policy._chunks[old].slot
    policy.get(old).ref_cnt = 1
    policy.mark_non_evictable(old)
    policy.remove(old)
    (new,) = store(policy, "n", 1, request("n", 0.01))
    assert policy._chunks[new].slot == slot
    middle = store(policy, "m", 1, request("m", 0.5))
    assert evicted_order(policy) == [new, *middle]
    with pytest.raises(ValueError, match="queued"):
        queued = store(policy, "q", 1, request("q", 0.5))
        policy.evictor.forget(policy._chunks[queued[0]].slot)


class TickingClock:
    """An engine's clock: every read is a microsecond later."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1e-6
        return self.now


def store_running(policy: EvictorCachePolicy, prefix: str, n: int, context: Context) -> list[bytes]:
    """One `prepare_store` of a running request (n inserts), then `complete_store`."""
    keys = [f"{prefix}{i}".encode() for i in range(n)]
    for i, key in enumerate(keys):
        context.positions[key] = 16 * (i + 1)
        policy.insert(key, Status(i), context)
    for key in keys:
        policy.get(key).ref_cnt = 0
        policy.mark_evictable(key)
    return keys


@pytest.mark.parametrize("evictor", ["lpc", "lpc-pooled"])
def test_a_running_requests_store_goes_tail_first_on_an_engines_clock(evictor: str) -> None:
    """Each insert reads a later instant; the run of one store shares its first release, so
    the chain's tail goes before its head (one release per chunk would send the head first)."""
    policy = trusted_policy(8, evictor, clock=TickingClock())
    keys = store_running(policy, "a", 4, request("a", 0.5))
    evicted = [key for key, _ in policy.evict(4, set()) or []]
    assert evicted == keys[::-1]


def test_any_other_hook_ends_a_run_of_inserts() -> None:
    """A later store of the same request, after another hook, is a release of its own: its
    chunks are newer, so they stay after the first store's."""
    clock = Clock()
    policy = trusted_policy(8, "lpc", clock=clock)
    context = request("a", 0.5)
    first = store_running(policy, "a", 2, context)
    policy.on_store_miss([b"x"], context)  # the next step's prepare_store begins
    clock.now = 5.0
    second = store_running(policy, "b", 2, context)
    evicted = [key for key, _ in policy.evict(4, set()) or []]
    assert evicted == first[::-1] + second[::-1]


# -- a protected or pinned chunk goes back to its place -----------------------------------------
def shared_chunk(policy: EvictorCachePolicy, clock: Clock) -> bytes:
    """A prefix chunk two conversations released (OR-pooled and shared in `lpc-pooled`)."""
    prefix = store(policy, "s", 1, request("first", 0.6))
    clock.now = 5.0
    store_after(policy, prefix, "y", request("second", 0.6))
    return prefix[0]


@pytest.mark.parametrize("evictor", ["lpc", "lpc-pooled"])
def test_a_store_that_protects_a_chunk_leaves_its_key(evictor: str) -> None:
    """`evict(n, protected)` takes the protected chunks out and puts them back as they were,
    not as a second release of their last request (which `lpc-pooled` would OR-pool with
    itself, raising a shared chunk's key at every store that protects it)."""
    clock = Clock()
    policy = trusted_policy(8, evictor, clock=clock)
    key = shared_chunk(policy, clock)
    slot = policy._chunks[key].slot
    before = policy.evictor.pooled_key(slot)
    for i in range(4):
        clock.now += 1.0
        store(policy, f"n{i}-", 2, request(f"r{i}", 0.5))
        assert policy.evict(1, {key}) is not None
    assert policy.evictor.pooled_key(slot) == before
    policy.check_invariants()


@pytest.mark.parametrize("evictor", ["lpc", "lpc-pooled"])
def test_a_load_leaves_the_chunks_key(evictor: str) -> None:
    """A load pins a chunk (out of the evictor) and unpins it: it goes back to its place."""
    clock = Clock()
    policy = trusted_policy(8, evictor, clock=clock)
    key = shared_chunk(policy, clock)
    slot = policy._chunks[key].slot
    before = policy.evictor.pooled_key(slot)
    for i in range(4):
        clock.now += 1.0
        policy.get(key).ref_cnt = 1
        policy.mark_non_evictable(key)
        policy.get(key).ref_cnt = 0
        policy.mark_evictable(key)
        store(policy, f"n{i}-", 1, request(f"r{i}", 0.5))  # its finish pushes the unpinned chunk
    assert policy.evictor.pooled_key(slot) == before
    policy.check_invariants()


def test_a_running_requests_protected_store_keeps_its_provisional_place() -> None:
    """A provisional chunk a later store protects goes back with its own protected key, not
    one raised by the likelier releases since (as LRU keeps a running request's rank)."""
    clock = Clock()
    policy = trusted_policy(8, "lpc", clock=clock)
    running = store_running(policy, "a", 1, request("running", 0.5))
    clock.now = 1.0
    store(policy, "b", 1, request("likely", 0.99))  # pushes both; raises the highest logit
    slot = policy._chunks[running[0]].slot
    before = policy.evictor.pooled_key(slot)
    assert [key for key, _ in policy.evict(1, set(running)) or []] == [b"b0"]
    assert policy.evictor.pooled_key(slot) == before
    policy.check_invariants()


# -- a running request holds the chunks it reads -----------------------------------------------
def test_a_running_request_holds_what_it_reads_and_its_finish_restores_their_pooling() -> None:
    """`on_request_access` (a load, or a store that finds resident chunks) queues a running
    request's resident chunks provisionally, as vLLM's lru ranks them with the request: the
    unlikely prefix it reads outlives a likelier chunk while it runs; at its finish the
    chunks pool with what they held before (max pooling with the first conversation)."""
    clock = Clock()
    policy = trusted_policy(4, "lpc", clock=clock)
    prefix = store(policy, "s", 1, request("first", 0.05))
    clock.now = 1.0
    likely = store(policy, "l", 1, request("likely", 0.9))
    before = policy.evictor.pooled_key(policy._chunks[prefix[0]].slot)
    clock.now = 2.0
    reader = request("reader", 0.01)
    policy.on_request_access(prefix, reader)
    assert [key for key, _ in policy.evict(1, set()) or []] == likely
    clock.now = 3.0
    policy.on_request_finished([prefix], set(), set(prefix), reader)
    assert policy.evictor.pooled_key(policy._chunks[prefix[0]].slot) == before
    policy.check_invariants()


def test_a_fault_while_holding_a_read_chunk_falls_back_to_lru() -> None:
    stats = PluginStats()
    clock = Clock()
    policy = trusted_policy(4, "lpc", clock=clock, stats=stats)
    prefix = store(policy, "s", 2, request("first", 0.5))
    fail_once(policy.evictor, "metadata")
    clock.now = 1.0
    policy.on_request_access(prefix, request("reader", 0.5))
    assert stats.plugin_errors == 1
    policy.check_invariants()
    clock.now = 2.0
    store(policy, "n", 2, request("new", 0.5))
    assert sorted(k for k, _ in policy.evict(2, set()) or []) == sorted(prefix)
