"""The CPU tier's trust boundary, the GPU plugin's (`trust`): a probability in a request's
`kv_transfer_params` (the request body) is ignored by default and counted once per request;
it is used only when signed under `hint_key` or with `trust_request_hints`; the orchestrator's
`kv_hints` action is trusted; conversations are the GPU plugin's (namespaced by tenant) first,
then the context's namespaced by its tenant. The pin attack on the CPU tier alone."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from lpc.integrations.config import PluginConfigError
from lpc.integrations.cpu_tier_policy import (
    EvictorCachePolicy,
    TierHints,
    request_release,
    tier_trust,
)
from lpc.integrations.request_hints import RequestHints
from lpc.integrations.stats import PluginStats
from lpc.integrations.trust import KV_HINT_ACTION, KV_HINT_VERSION, HintTrust, sign_hint

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
