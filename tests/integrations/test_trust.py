"""The trust boundary (`lpc.integrations.trust`): a client's body cannot move another tenant.

The unmarked tests need no vLLM. The `vllm`-marked one is the pin attack on real vLLM 0.33.0's
`KVCacheManager`: one tenant sends p = 1.0 on one-shot prompts; with the defaults the other
tenant keeps stock vLLM's prefix hits exactly, trusting every client (the operator's
explicit choice) shows what the attack would do, and a small enough `pinned_share` how much
of it the cap holds off.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from lpc.integrations.config import PluginConfig, load_config
from lpc.integrations.request_hints import parse_hints
from lpc.integrations.stats import PluginStats
from lpc.integrations.trust import (
    KV_HINT_ACTION,
    HintTrust,
    kv_hint_of,
    namespaced,
    sign_hint,
    tenant_of,
)
from lpc.integrations.vllm_plugin import PluginRuntime
from lpc.integrations.vllm_queue import QueueRuntime
from tests.integrations.report import REPORT
from tests.integrations.snippets import run_snippet

KEY = "router-secret"


def request(
    extra_args: dict[str, Any] | None = None,
    *,
    salt: str | None = None,
    lora: str | None = None,
    session: str | None = None,
    kv_hints: Any = None,
) -> SimpleNamespace:
    """What the plugin reads of a vLLM `Request`."""
    return SimpleNamespace(
        request_id="r1",
        sampling_params=SimpleNamespace(extra_args=extra_args),
        cache_salt=salt,
        lora_request=SimpleNamespace(lora_name=lora) if lora else None,
        session_id=session,
        kv_hints=kv_hints,
    )


def envelope(payload: dict[str, Any], action_type: str = KV_HINT_ACTION, version: str = "1"):
    action = SimpleNamespace(
        action_id="a", action_type=action_type, action_version=version, payload=payload
    )
    return SimpleNamespace(protocol_version="1", message_id="m", actions=[action])


def used(trust: HintTrust, req: SimpleNamespace) -> tuple[float | None, str | None, bool]:
    hints, dropped = trust.apply(req, parse_hints(req.sampling_params.extra_args))
    return hints.probability, hints.conversation_id, dropped


def test_tenants_are_what_separates_vllm_s_prefix_cache() -> None:
    assert tenant_of(request()) == ""
    assert tenant_of(request(salt="acme")) == "salt=acme"
    assert tenant_of(request(salt="acme", lora="sql")) == "salt=acme|lora=sql"
    assert namespaced("", "c1") == "c1"
    assert namespaced("salt=acme", "c1") == "salt=acme/c1"


def test_a_body_probability_is_ignored_by_default() -> None:
    body = {"lpc_probability": 1.0, "lpc_conversation_id": "c1"}
    assert used(HintTrust(), request(body)) == (None, "c1", True)
    assert used(HintTrust(), request({"lpc_conversation_id": "c1"})) == (None, "c1", False)
    assert used(HintTrust(trust_request_hints=True), request(body)) == (1.0, "c1", False)


def test_a_router_signed_probability_is_used_and_a_forged_one_is_not() -> None:
    trust = HintTrust(hint_key=KEY)
    signature = sign_hint(KEY, 0.8, "c1", "salt=acme")
    body = {"lpc_probability": 0.8, "lpc_conversation_id": "c1", "lpc_signature": signature}
    assert used(trust, request(body, salt="acme")) == (0.8, "salt=acme/c1", False)
    # The same signature on another p, conversation or tenant, or under another key: dropped.
    for forged, salt in (
        ({**body, "lpc_probability": 1.0}, "acme"),
        ({**body, "lpc_conversation_id": "c2"}, "acme"),
        (body, "other"),
    ):
        assert used(trust, request(forged, salt=salt))[0] is None
    assert used(HintTrust(hint_key="another-key"), request(body, salt="acme"))[0] is None
    assert used(HintTrust(), request(body, salt="acme"))[0] is None  # no key configured


def test_the_orchestrator_channel_is_trusted_and_session_ids_name_conversations() -> None:
    hinted = request(
        {"lpc_probability": 0.1, "lpc_conversation_id": "body"},
        salt="acme",
        session="sess",
        kv_hints=envelope({"probability": 0.9, "conversation_id": "orch"}),
    )
    assert used(HintTrust(), hinted) == (0.9, "salt=acme/orch", False)
    # vLLM's session_id (X-Session-ID) before the body's id; both namespaced by tenant.
    assert used(HintTrust(), request({"lpc_conversation_id": "body"}, lora="a", session="s")) == (
        None,
        "lora=a/s",
        False,
    )
    # Another action type or version, or a bad payload, is not LPC's hint.
    assert kv_hint_of(request(kv_hints=envelope({"probability": 0.9}, "other.action"))) is None
    assert kv_hint_of(request(kv_hints=envelope({"probability": 0.9}, version="2"))) is None
    bad = kv_hint_of(request(kv_hints=envelope({"probability": 7, "conversation_id": ""})))
    assert bad is not None and (bad.probability, bad.conversation_id) == (None, None)


def test_the_plugin_counts_what_it_ignored_and_keys_the_release_by_tenant() -> None:
    config = PluginConfig(stats_log_interval_s=0.0)
    stats = PluginStats()
    runtime = PluginRuntime(config, stats, QueueRuntime(config, stats, lambda: 5.0), None, None)
    req = request({"lpc_probability": 1.0, "lpc_conversation_id": "c1"}, salt="attacker")
    req.is_finished = lambda: True
    release, source = runtime.release_and_source(req)
    assert (release.probability, release.conversation_id, source) == (
        None,
        "salt=attacker/c1",
        "fallback",
    )
    assert stats.untrusted_probabilities == 1 and stats.invalid_hints == 0
    assert stats.invalid_probabilities == 0


def test_the_settings_are_validated_and_the_key_masked() -> None:
    config = load_config({"LPC_TRUST_REQUEST_HINTS": "yes", "LPC_HINT_KEY": KEY})
    assert config.trust_request_hints is True and config.hint_key == KEY
    assert config.as_dict()["hint_key"] == "***"
    assert PluginConfig().trust_request_hints is False  # the safe default
    with pytest.raises(ValueError, match="LPC_TRUST_REQUEST_HINTS='maybe'"):
        load_config({"LPC_TRUST_REQUEST_HINTS": "maybe"})


# -- the pin attack on real vLLM -------------------------------------------------------------
PIN_ATTACK = """
import json, sys
from dataclasses import replace
sys.path.insert(0, "scripts")
import vllm_replay as vr
from lpc.integrations import vllm_plugin
from lpc.integrations.config import PluginConfig
from lpc.integrations.scheduler_lpc import attach_manager

v = vr.load_vllm(allow_other_version=False)
BLOCK, NUM_BLOCKS, CONVERSATIONS, TURNS, SHOTS = 16, 129, 8, 6, 2

def workload():
    # The victim's chats (a 64-token start, 32 tokens more each turn, round robin), and
    # between any two of its requests SHOTS one-shot 64-token prompts sent with p = 1.0.
    items, token, prompts = [], 1_000_000, {c: [c * 10_000 + i for i in range(64)]
                                            for c in range(CONVERSATIONS)}
    for turn in range(TURNS):
        for c in range(CONVERSATIONS):
            if turn:
                prompts[c] = prompts[c] + [c * 10_000 + 64 + 32 * turn + i for i in range(32)]
            items.append(("victim", list(prompts[c]), {"lpc_conversation_id": f"v{c}"}))
            for _ in range(SHOTS):
                items.append(("attacker", list(range(token, token + 64)),
                              {"lpc_probability": 1.0, "lpc_conversation_id": f"a{token}"}))
                token += 64
    return items

def run(config):
    clock = {"now": 0.0}
    plugin = None
    if config is not None:
        plugin = vllm_plugin.install_runtime(config, clock=lambda: clock["now"])
    kv = v.KVCacheConfig(num_blocks=NUM_BLOCKS, kv_cache_tensors=[], kv_cache_groups=[
        v.KVCacheGroupSpec(["layer0"], v.FullAttentionSpec(
            block_size=BLOCK, num_kv_heads=1, head_size=1, dtype=v.torch.float32))])
    manager = v.KVCacheManager(kv, max_model_len=4096, scheduler_block_size=BLOCK,
                               hash_block_size=BLOCK, enable_caching=True)
    free = manager.free  # stock; with LPC, the scheduler class's free path
    if plugin is not None:
        free = attach_manager(manager, plugin).free
    hasher = v.get_request_block_hasher(BLOCK, v.hash_fn)
    hits = {"victim": [0, 0], "attacker": [0, 0]}
    for step, (tenant, prompt, extra) in enumerate(workload()):
        clock["now"] = float(step)
        request = v.Request(request_id=f"r{step}", prompt_token_ids=prompt,
                            sampling_params=v.SamplingParams(max_tokens=1, extra_args=extra),
                            pooling_params=None, arrival_time=float(step),
                            cache_salt=tenant, block_hasher=hasher)
        computed, hit, _ = manager.get_computed_blocks(request)
        blocks = manager.allocate_slots(request, num_new_tokens=request.num_tokens - hit,
                                        num_new_computed_tokens=hit, new_computed_blocks=computed)
        assert blocks is not None, f"step {step}: allocation failed"
        request.status = v.RequestStatus.FINISHED_STOPPED
        free(request)
        hits[tenant][0] += hit
        hits[tenant][1] += len(prompt)
    stats = vllm_plugin.stats_snapshot() if config is not None else {}
    if config is not None:
        vllm_plugin.unregister()
    return {"victim_hit_ratio": hits["victim"][0] / hits["victim"][1],
            "victim_hit_tokens": hits["victim"][0],
            "untrusted": stats.get("untrusted_probabilities"),
            "from_request": stats.get("probabilities_from_request"),
            "capped": stats.get("pinned_share_capped")}

base = PluginConfig(evictor="lpc", scale_per_s=0.01, fallback_probability=0.5,
                    stats_log_interval_s=0.0)
trusting = replace(base, trust_request_hints=True)
print(json.dumps({"stock": run(None), "plugin": run(base),
                  "trusting": run(replace(trusting, pinned_share=1.0)),
                  "capped": run(replace(trusting, pinned_share=CAPPED_SHARE)),
                  "half": run(replace(trusting, pinned_share=0.5))}))
"""
# The cap that binds in the pin attack, from its sizes (chosen before it was run): between
# two turns of one victim chat come 16 one-shot prompts (64 blocks) and the 8 chats' turns
# (8 x 6 blocks at turn 1): 112 of the pool's 128 usable blocks must stay in LRU's order for
# the victim's first repeat to hit as with stock vLLM, which leaves 16 blocks to pin: 16 of
# the 129 blocks the queue is built with, 0.125 (the attacker's first four prompts).
CAPPED_SHARE = 0.125


@pytest.mark.vllm
def test_the_pin_attack_leaves_the_other_tenant_stock_s_hit_ratio(vllm_python: Path) -> None:
    snippet = PIN_ATTACK.replace("CAPPED_SHARE", repr(CAPPED_SHARE))
    out = json.loads(run_snippet(vllm_python, snippet).splitlines()[-1])
    stock, plugin, trusting, capped = out["stock"], out["plugin"], out["trusting"], out["capped"]
    assert stock["victim_hit_tokens"] > 0, "the victim never hits: the workload tests nothing"
    # The defaults: the attacker's p = 1.0 is ignored (counted), the victim's hits are stock's.
    assert plugin["victim_hit_tokens"] == stock["victim_hit_tokens"]
    assert plugin["untrusted"] == 96 and plugin["from_request"] == 0
    # Trusting every client (an operator's explicit choice) lets the attack through: the
    # check above can fail.
    assert trusting["from_request"] == 96 and trusting["capped"] == 0  # pinned_share 1.0
    assert trusting["victim_hit_ratio"] < stock["victim_hit_ratio"] / 2
    # Trusting every client, with one tenant's pinned share capped: its first four prompts
    # pin 16 blocks, never evicted (their key stays above every fallback key over the run's
    # 144 s), so its other 92 are keyed at the fallback p, and the victim's hit ratio is well
    # above the uncapped run's (not stock's: the 16 pinned blocks still cost it the repeats
    # whose reuse distance lies between 112 and 128 blocks).
    assert capped["from_request"] == 96 and capped["capped"] == 92
    assert capped["victim_hit_ratio"] > 2 * trusting["victim_hit_ratio"]
    REPORT.append(
        f"pin attack (one tenant sends p = 1.0 on one-shot prompts): the other tenant's hit "
        f"ratio stock {stock['victim_hit_ratio']:.3f}, plugin (defaults) "
        f"{plugin['victim_hit_ratio']:.3f} (equal; 96 untrusted p ignored), plugin trusting "
        f"every client {trusting['victim_hit_ratio']:.3f} (pinned_share 1.0), "
        f"{capped['victim_hit_ratio']:.3f} with pinned_share {CAPPED_SHARE} "
        f"({capped['capped']} releases capped), "
        f"{out['half']['victim_hit_ratio']:.3f} with 0.5"
    )
