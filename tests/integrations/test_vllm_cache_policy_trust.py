"""The CPU tier's trust boundary, the GPU plugin's (`trust`): a probability in a request's
`kv_transfer_params` (the request body) is ignored by default and counted once per request;
it is used only when signed under `hint_key` or with `trust_request_hints`; the orchestrator's
`kv_hints` action is trusted; conversations are the GPU plugin's (namespaced by tenant) first,
then the context's namespaced by its tenant. The pin attack on the CPU tier alone, and one
tenant's pinned share capped (`pinned_share`): the pin experiment of test_trust.py on the
tier, and the pinned counts against a recount from the chunk records on random calls."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lpc.integrations.config import PluginConfigError
from lpc.integrations.cpu_tier_policy import (
    OTHER_TENANTS,
    EvictorCachePolicy,
    TierHints,
    request_release,
    tier_pinned_share,
    tier_trust,
)
from lpc.integrations.finished_releases import FinishedReleases
from lpc.integrations.request_hints import RequestHints
from lpc.integrations.stats import PluginStats
from lpc.integrations.trust import KV_HINT_ACTION, KV_HINT_VERSION, HintTrust, sign_hint
from lpc.integrations.vllm_queue import TenantRelease
from tests.integrations.report import REPORT

KEY = "router-key"


@dataclass
class Status:
    chunk_id: int
    ref_cnt: int = -1


@dataclass
class Context:
    """vLLM 0.33's ReqContext as the policy reads it, with its per-request scratch."""

    req_id: str
    kv_transfer_params: dict[str, Any] | None = None
    kv_hints: Any = None
    positions: dict[bytes, int] = field(default_factory=dict)
    _state: dict[type, Any] = field(default_factory=dict)

    def get_offload_key_position(self, key: bytes) -> int | None:
        return self.positions.get(key)

    def set_state(self, value: Any) -> None:
        self._state[type(value)] = value

    def get_state(self, cls: type) -> Any:
        return self._state.get(cls)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def kv_hint(probability: float, conversation: str) -> Any:
    action = SimpleNamespace(
        action_type=KV_HINT_ACTION,
        action_version=KV_HINT_VERSION,
        payload={"probability": probability, "conversation_id": conversation},
    )
    return SimpleNamespace(actions=[action])


def store(policy: EvictorCachePolicy, prefix: str, n: int, context: Context) -> list[bytes]:
    """A request's store and finish, as vLLM's manager calls the policy."""
    keys = [f"{prefix}-{i}".encode() for i in range(n)]
    for i, key in enumerate(keys):
        context.positions[key] = 16 * (i + 1)
        policy.insert(key, Status(i), context)
    for key in keys:
        policy.get(key).ref_cnt = 0  # the store completed
        policy.mark_evictable(key)
    policy.on_request_finished([keys], set(keys), set(), context)
    return keys


def test_a_body_probability_is_ignored_by_default_and_counted_once_per_request() -> None:
    stats = PluginStats()
    context = Context("r", {"lpc_probability": 1.0, "lpc_conversation_id": "c"})
    for now in (1.0, 2.0, 3.0):  # every access and the finish read the context again
        release = request_release(context, now, stats=stats)
        assert release.probability is None and release.conversation_id == "c"
    assert stats.untrusted_probabilities == 1
    assert context.get_state(TierHints) == TierHints(None, "c")


def test_a_signed_or_trusted_body_probability_is_used() -> None:
    stats = PluginStats()
    signed = {"lpc_probability": 0.9, "lpc_conversation_id": "c"}
    signed["lpc_signature"] = sign_hint(KEY, 0.9, "c", "")  # the context carries no tenant
    keyed = HintTrust(hint_key=KEY)
    assert request_release(Context("a", signed), 1.0, None, stats, keyed).probability == 0.9
    forged = {**signed, "lpc_probability": 1.0}  # the signature covers the probability
    assert request_release(Context("b", forged), 1.0, None, stats, keyed).probability is None
    assert stats.untrusted_probabilities == 1
    everyone = HintTrust(trust_request_hints=True)
    plain = Context("c", {"lpc_probability": 0.3})
    assert request_release(plain, 1.0, None, stats, everyone).probability == 0.3
    assert stats.untrusted_probabilities == 1


def test_the_orchestrators_kv_hints_are_trusted_and_come_before_the_body() -> None:
    stats = PluginStats()
    context = Context("r", {"lpc_probability": 1.0, "lpc_conversation_id": "body"})
    context.kv_hints = kv_hint(0.2, "router-conversation")
    release = request_release(context, 1.0, stats=stats)
    assert release.probability == 0.2 and release.conversation_id == "router-conversation"
    assert stats.untrusted_probabilities == 0  # the trusted p was there: nothing dropped


def test_conversations_are_the_gpu_plugins_then_namespaced_by_the_contexts_tenant() -> None:
    """The GPU plugin's hints of a running request carry its tenant-namespaced conversation
    (the CPU tier's context carries no tenant in vLLM 0.33); a context that did carry a
    `cache_salt` would namespace the body's conversation by it, as the GPU plugin does."""
    running = {"r": RequestHints(conversation_id="salt=a/c")}
    context = Context("r", {"lpc_conversation_id": "c"})
    assert request_release(context, 1.0, running=running.get).conversation_id == "salt=a/c"
    salted = SimpleNamespace(
        req_id="s", kv_transfer_params={"lpc_conversation_id": "c"}, cache_salt="b"
    )
    assert request_release(salted, 1.0).conversation_id == "salt=b/c"
    assert request_release(Context("q"), 1.0).conversation_id == "q"  # none: its own


def pin_attack(trust: HintTrust) -> list[bytes]:
    """An attacker stores its one-shot prompts with p = 1.0 in its body, then a victim
    stores its conversation; a third request's store needs room. What is evicted?"""
    clock = Clock()
    policy = EvictorCachePolicy(4, "lpc", clock=clock, trust=trust)
    store(policy, "attacker", 2, Context("attacker", {"lpc_probability": 1.0}))
    clock.now = 10.0
    store(policy, "victim", 2, Context("victim"))
    clock.now = 20.0
    evicted = policy.evict(2, set())
    assert evicted is not None
    return sorted(key for key, _ in evicted)


def test_the_pin_attack_leaves_the_victim_lrus_place() -> None:
    """Trusted, the attacker's p = 1.0 keeps its chunks over the victim's (at the fallback
    p); untrusted by default, its chunks take the fallback too and go first, the older ones,
    as LRU would evict."""
    assert pin_attack(HintTrust(trust_request_hints=True)) == [b"victim-0", b"victim-1"]
    assert pin_attack(HintTrust()) == [b"attacker-0", b"attacker-1"]


def test_the_tiers_trust_is_the_plugins_else_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("LPC_TRUST_REQUEST_HINTS", "LPC_HINT_KEY"):
        monkeypatch.delenv(name, raising=False)
    assert tier_trust(None) == HintTrust()  # by default nothing is trusted
    monkeypatch.setenv("LPC_HINT_KEY", KEY)
    assert tier_trust(None) == HintTrust(hint_key=KEY)
    monkeypatch.setenv("LPC_TRUST_REQUEST_HINTS", "maybe")
    with pytest.raises(PluginConfigError, match="trust_request_hints"):
        tier_trust(None)
    runtime = SimpleNamespace(trust=HintTrust(trust_request_hints=True))
    assert tier_trust(runtime) is runtime.trust  # type: ignore[arg-type]


# -- one tenant's pinned share ------------------------------------------------------------------
VICTIM, ATTACKER = "salt=victim", "salt=attacker"


class Manager:
    """vLLM 0.33's `CPUOffloadingManager` as it calls the policy for one request at a time,
    with the GPU plugin registered: while a request runs, the plugin's hints carry its tenant
    (`running`); when it finishes, the plugin's `TenantRelease` (`finished`) carries its p,
    tenant and whether the p is a trusted hint. A request looks up its prompt's chunks, loads
    the resident prefix, stores the rest (evicting with its keys protected) and finishes."""

    def __init__(self, capacity: int, evictor: str, pinned_share: float) -> None:
        self.clock = Clock()
        self.finished = FinishedReleases()
        self.running: dict[str, RequestHints] = {}
        self.policy = EvictorCachePolicy(
            capacity,
            evictor,
            clock=self.clock,
            finished=self.finished,
            running=self.running.get,
            pinned_share=pinned_share,
        )
        self.steps = 0

    def serve(self, tenant: str, keys: list[bytes], p: float | None) -> int:
        """The request's chunks that were resident (its hits)."""
        policy = self.policy
        self.clock.now = float(self.steps)
        rid = f"r{self.steps}"
        self.steps += 1
        context = Context(rid, positions={k: 16 * (i + 1) for i, k in enumerate(keys)})
        self.running[rid] = RequestHints(conversation_id=f"{tenant}/{rid}", tenant=tenant)
        hit = 0
        while hit < len(keys) and policy.get(keys[hit]) is not None:
            hit += 1
        loaded, stored = keys[:hit], keys[hit:]
        for key in loaded:
            policy.mark_non_evictable(key)
            policy.get(key).ref_cnt += 1
        if loaded:
            policy.on_request_access(loaded, context)
        for key in loaded:
            policy.get(key).ref_cnt -= 1
            policy.mark_evictable(key)
        if stored:
            policy.on_store_miss(stored, context)
            policy.on_request_access(stored, context)
            short = len(stored) - (policy.cache_capacity - len(policy))
            if short > 0:
                assert policy.evict(short, set(keys)) is not None
            for i, key in enumerate(stored):
                policy.insert(key, Status(i), context)
            for key in stored:
                policy.get(key).ref_cnt = 0  # the store completed
                policy.mark_evictable(key)
        self.finished.record(
            rid,
            TenantRelease(
                self.clock.now, p, f"{tenant}/{rid}", tenant=tenant, hinted=p is not None
            ),
        )
        del self.running[rid]
        policy.on_request_finished([keys], set(stored), set(loaded), context)
        return hit


# The pin experiment of test_trust.py in chunks: eight chats of the victim (4 chunks, 2 more
# each turn, six turns, round robin) and between any two of its requests two one-shot 4-chunk
# prompts of the attacker with a trusted p = 1.0, in a 128-chunk tier; 0.125: the cap that
# leaves LRU's order the 112 chunks the victim's repeats need (as there, chosen from the sizes).
CHATS, TURNS, SHOTS, TIER_CHUNKS, CAPPED_SHARE = 8, 6, 2, 128, 0.125


def pin_experiment(evictor: str, pinned_share: float) -> dict[str, float]:
    manager = Manager(TIER_CHUNKS, evictor, pinned_share)
    policy = manager.policy
    hits = total = shot = most_pinned = 0
    lengths = [4] * CHATS
    for turn in range(TURNS):
        for chat in range(CHATS):
            lengths[chat] += 2 if turn else 0
            keys = [f"v{chat}-{i}".encode() for i in range(lengths[chat])]
            hits += manager.serve(VICTIM, keys, None)
            total += len(keys)
            for _ in range(SHOTS):
                manager.serve(ATTACKER, [f"a{shot}-{i}".encode() for i in range(4)], 1.0)
                shot += 1
                policy.check_invariants()  # the pinned counts equal their recount
                most_pinned = max(most_pinned, policy.pinned_counts().get(ATTACKER, 0))
    return {
        "victim_hit_ratio": hits / total,
        "capped": policy.stats.pinned_share_capped,
        "most_pinned": most_pinned,
    }


def test_the_pin_experiment_on_the_cpu_tier_capped_uncapped_and_lru() -> None:
    """Uncapped, the attacker's p = 1.0 chunks fill the tier and the victim's hit ratio
    falls far below LRU's; capped, the attacker never holds more than its share pinned, and
    the victim keeps more of LRU's hits; a share of 0 is LRU's order exactly."""
    lru = pin_experiment("lru", 1.0)
    uncapped = pin_experiment("lpc", 1.0)
    half = pin_experiment("lpc", 0.5)
    capped = pin_experiment("lpc", CAPPED_SHARE)
    none = pin_experiment("lpc", 0.0)
    assert lru["victim_hit_ratio"] > 0, "the victim never hits: the workload tests nothing"
    assert uncapped["capped"] == 0 and uncapped["most_pinned"] == TIER_CHUNKS
    assert uncapped["victim_hit_ratio"] < lru["victim_hit_ratio"] / 2
    assert half["most_pinned"] == TIER_CHUNKS // 2
    assert capped["most_pinned"] == CAPPED_SHARE * TIER_CHUNKS
    assert capped["capped"] == CHATS * TURNS * SHOTS - 4  # its first four prompts pin
    assert capped["victim_hit_ratio"] > 2 * uncapped["victim_hit_ratio"]
    assert none["most_pinned"] == 0 and none["victim_hit_ratio"] == lru["victim_hit_ratio"]
    REPORT.append(
        f"CPU tier pin experiment ({TIER_CHUNKS} chunks, the attacker's p = 1.0 trusted): the "
        f"victim's hit ratio LRU {lru['victim_hit_ratio']:.3f}, uncapped "
        f"{uncapped['victim_hit_ratio']:.3f}, pinned_share 0.5 {half['victim_hit_ratio']:.3f}, "
        f"{CAPPED_SHARE} {capped['victim_hit_ratio']:.3f} ({capped['capped']} releases capped)"
    )


def test_a_lone_tenant_is_not_capped_and_a_second_one_makes_the_cap_bind() -> None:
    manager = Manager(8, "lpc", 0.25)
    for i in range(3):
        manager.serve(ATTACKER, [f"a{i}-0".encode(), f"a{i}-1".encode()], 1.0)
    assert manager.policy.pinned_counts() == {ATTACKER: 6}  # alone: counted, not capped
    manager.serve(VICTIM, [b"v-0"], None)  # a second tenant stores: the tier is shared
    manager.serve(ATTACKER, [b"a3-0", b"a3-1"], 1.0)  # 8 pinned > 0.25 x 8: capped
    assert manager.policy.stats.pinned_share_capped == 1
    assert manager.policy.pinned_counts() == {ATTACKER: 6}
    manager.serve(VICTIM, [b"v-1"], 0.9)  # under its own cap: pinned
    assert manager.policy.pinned_counts() == {ATTACKER: 6, VICTIM: 1}
    manager.policy.check_invariants()


def test_a_release_is_the_plugins_tenant_else_the_running_hints_else_the_contexts() -> None:
    finished = FinishedReleases()
    finished.record("a", TenantRelease(0.0, 0.9, "salt=x/c", tenant="salt=x", hinted=True))
    release = request_release(Context("a"), 1.0, finished)
    assert isinstance(release, TenantRelease)
    assert (release.tenant, release.hinted, release.probability) == ("salt=x", True, 0.9)
    running = {"b": RequestHints(conversation_id="salt=y/c", tenant="salt=y")}
    release = request_release(Context("b"), 1.0, finished, running=running.get)
    assert isinstance(release, TenantRelease)
    assert (release.tenant, release.hinted) == ("salt=y", False)
    salted = SimpleNamespace(req_id="s", kv_hints=kv_hint(0.8, "c"), cache_salt="z")
    release = request_release(salted, 1.0)
    assert isinstance(release, TenantRelease)
    assert (release.tenant, release.hinted, release.probability) == ("salt=z", True, 0.8)
    model = FinishedReleases()
    model.record("m", TenantRelease(0.0, 0.9, "m", tenant="salt=x"))  # the model's p
    assert request_release(Context("m"), 1.0, model).hinted is False  # not a hint: never pins


def test_the_tiers_pinned_share_is_the_plugins_else_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("LPC_PINNED_SHARE", raising=False)
    assert tier_pinned_share(None) == 0.5
    monkeypatch.setenv("LPC_PINNED_SHARE", "0.2")
    assert tier_pinned_share(None) == 0.2
    monkeypatch.setenv("LPC_PINNED_SHARE", "2")
    with pytest.raises(PluginConfigError, match="pinned_share"):
        tier_pinned_share(None)
    runtime = SimpleNamespace(config=SimpleNamespace(pinned_share=0.3))
    assert tier_pinned_share(runtime) == 0.3  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="pinned_share"):
        EvictorCachePolicy(4, pinned_share=1.5)


class StrictStats(PluginStats):
    """An error the policy would absorb (counted, the evictor rebuilt from the records, which
    recounts the pins) fails the test instead."""

    def plugin_error(self, where: str, error: BaseException) -> None:
        raise AssertionError(f"{where}: {error!r}") from error


@settings(max_examples=150, deadline=None)
@given(
    evictor=st.sampled_from(["lpc", "lpc-pooled"]),
    share=st.sampled_from([0.0, 0.25, 0.5, 1.0]),
    data=st.data(),
)
def test_the_pinned_counts_equal_a_recount_from_the_records(
    evictor: str, share: float, data: st.DataObject
) -> None:
    """Random vLLM calls (stores protecting resident chunks, loads held across other
    requests, with or without the request's first sight of them, failed stores, touches, finishes with the GPU plugin's releases of three tenants, hinted or not,
    evictions with protected keys, removals, clears): after each, every tenant's pinned
    count is the chunks the evictor holds under a key that tenant's trusted hint gave
    (`check_invariants` recounts), and every such chunk's release is that hint."""
    clock = Clock()
    finished = FinishedReleases()
    policy = EvictorCachePolicy(
        6, evictor, clock=clock, stats=StrictStats(), finished=finished, pinned_share=share
    )
    running: list[tuple[Context, list[bytes], list[bytes]]] = []
    next_key = 0
    for step in range(data.draw(st.integers(1, 40), label="steps")):
        action = data.draw(st.sampled_from(["request", "finish", "request", "touch", "other"]))
        if action == "request":
            context = Context(f"r{step}")
            ready = [k for k in policy if policy.get(k).ref_cnt >= 0]
            loaded = data.draw(st.lists(st.sampled_from(ready), unique=True)) if ready else []
            for key in loaded:
                if policy.get(key).ref_cnt == 0:
                    policy.mark_non_evictable(key)
                policy.get(key).ref_cnt += 1
            if loaded and data.draw(st.booleans()):  # vLLM's first sight of them (else seen)
                policy.on_request_access(loaded, context)
            new = [f"k{next_key + i}".encode() for i in range(data.draw(st.integers(0, 3)))]
            next_key += len(new)
            for depth, key in enumerate(loaded + new):
                context.positions[key] = depth
            # The store protects the request's keys, resident ones it did not load included.
            seen = data.draw(st.lists(st.sampled_from(ready), unique=True)) if ready else []
            short = len(new) - (policy.cache_capacity - len(policy))
            if short > 0 and policy.evict(short, {*loaded, *seen, *new}) is None:
                new = []
            for key in new:
                policy.insert(key, Status(0), context)
            fails = data.draw(st.booleans()) and data.draw(st.booleans())
            for key in new:
                if fails:
                    policy.remove(key)
                else:
                    policy.get(key).ref_cnt = 0
                    policy.mark_evictable(key)
            running.append((context, loaded + ([] if fails else new), loaded))
        elif action == "finish" and running:
            context, keys, loaded = running.pop(data.draw(st.integers(0, len(running) - 1)))
            tenant = data.draw(st.sampled_from(["", VICTIM, ATTACKER]))
            p = data.draw(st.sampled_from([1.0, 0.9, 0.2, None]))
            hinted = data.draw(st.sampled_from([True, True, False]))
            finished.record(
                context.req_id,
                TenantRelease(clock.now, p, f"{tenant}/{step}", tenant=tenant, hinted=hinted),
            )
            for key in loaded:
                if key in policy:
                    policy.get(key).ref_cnt -= 1
                    if policy.get(key).ref_cnt == 0:
                        policy.mark_evictable(key)
            keys = [k for k in keys if k in policy]
            policy.on_request_finished([keys], set(), set(), context)
        elif action == "touch" and running:
            context, keys, _ = data.draw(st.sampled_from(running))
            policy.touch([k for k in keys if k in policy], context)
        elif action == "other":
            clock.now += 1.0
            evictable = [k for k in policy if policy.get(k).ref_cnt == 0]
            if evictable and data.draw(st.booleans()):
                policy.evict(data.draw(st.integers(1, len(evictable))), set())
            elif data.draw(st.booleans()) and not running:
                policy.clear()
        policy.check_invariants()
        recount: dict[str, int] = {}
        for record in policy._chunks.values():
            if record.evictable and record.pin is not None:
                recount[record.pin] = recount.get(record.pin, 0) + 1
                release = record.release
                assert isinstance(release, TenantRelease) and release.hinted
                assert release.tenant == record.pin != OTHER_TENANTS
                assert release.probability is not None and release.probability > 0.5
        assert policy.pinned_counts() == recount
