"""The LPC strategy inside SGLang 0.5.23's real radix caches (marked `sglang`).

In SGLang's venv (scripts/setup_sglang_venv.sh), with the plugin loaded by SGLang's own
entry-point loader (SGLANG_PLUGINS=lpc), `lpc.drivers.sglang_radix.RealRadixCache`
builds SGLang's `RadixCache` and `UnifiedRadixCache` (the tree of a served full-attention
model) on CPU with a real allocator and KV pool and `eviction_policy="lpc"`, which SGLang
resolves through `get_eviction_strategy`. The scenarios of `sglang_scenarios` run on both and
on the stand-in, and must give the expected results on all three; every run ends with the
allocator holding exactly the slots it started with. The pin experiment runs on both real
trees, each request under its tenant's `cache_salt`: one tenant's pinned share capped.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integrations import sglang_scenarios
from tests.integrations.report import REPORT
from tests.integrations.snippets import entry_point_site, run_snippet
from tests.integrations.test_sglang_strategy import (
    EXPECTED_LOCKED,
    EXPECTED_ORDER,
    EXPECTED_POOLED_ORDER,
    EXPECTED_SPLITS,
    StandInLRU,
    standin,
)

SEEDS = 20
CAPACITY_TOKENS = 4096

REAL_RADIX = f"""
import json, warnings
warnings.filterwarnings("ignore")
from sglang.srt.plugins import load_plugins
load_plugins()
from lpc.drivers.sglang_radix import KINDS, RealRadixCache
from lpc.integrations.sglang_strategy import LPCStrategy
from tests.integrations import sglang_scenarios as s

CONFIG = {{"scale_per_s": 0.01, "fallback_probability": 0.5, "trust_request_priority": True}}
out = {{}}
for kind in KINDS:
    trees = []
    def new_tree(clock, policy="lpc"):
        tree = RealRadixCache(kind, {CAPACITY_TOKENS}, policy,
                              CONFIG if policy == "lpc" else None, clock)
        trees.append(tree)
        return tree
    lru = lambda clock: new_tree(clock, "lru")
    r = {{}}
    r["order"] = s.order_by_key(new_tree)["order"]
    r["pooled"] = s.max_pooling(new_tree)
    r["locked"] = s.locked_never_evicted(new_tree)
    r["splits"] = s.partial_node_splits(new_tree)
    r["decayed"] = [s.evicts_lowest_decayed_probability(new_tree, seed)
                    for seed in range({SEEDS})]
    r["lru"] = [s.random_operations(lru, seed, False) for seed in range({SEEDS})]
    r["lpc_no_p"] = [s.random_operations(new_tree, seed, False) for seed in range({SEEDS})]
    r["lpc_p"] = [s.random_operations(new_tree, seed, True) for seed in range({SEEDS})]
    r["strategies"] = sorted({{type(t.strategy).__name__ for t in trees}})
    r["is_lpc"] = all(isinstance(t.strategy, LPCStrategy) for t in trees if t.strategy is not None
                      and type(t.strategy).__name__ != "LRUStrategy")
    r["cache_types"] = sorted({{type(t.cache).__name__ for t in trees}})
    r["slots_lost"] = [t.capacity_tokens - t.available_slots() for t in trees]
    r["evictable_left"] = [t.evictable_tokens() for t in trees]
    for t in trees:
        t.close()
    out[kind] = r
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def real(sglang_python: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    site = entry_point_site(tmp_path_factory.mktemp("site"), "sglang.srt.plugins")
    stdout = run_snippet(sglang_python, REAL_RADIX, {"SGLANG_PLUGINS": "lpc"}, site)
    out = json.loads(stdout.splitlines()[-1])
    for kind, r in out.items():
        line = (
            f"SGLang {r['cache_types']} ({kind}) with the LPC strategy from SGLang's registry: "
            f"eviction order {r['order']} (LRU would say A, C, B, D); pooled "
            f"{r['pooled']['order']}; locked B: {r['locked']['while_locked']} then "
            f"{r['locked']['after_unlock']}; splits {r['splits']['order']}"
        )
        print(line)
        REPORT.append(line)
    return out


KINDS = ("radix", "unified")


@pytest.mark.sglang
@pytest.mark.parametrize("kind", KINDS)
def test_real_cache_uses_sglangs_registry_strategy(real: dict, kind: str) -> None:
    r = real[kind]
    expected = {"radix": ["RadixCache"], "unified": ["UnifiedRadixCache"]}[kind]
    assert r["cache_types"] == expected
    assert r["strategies"] == ["LPCStrategy", "LRUStrategy"] and r["is_lpc"]


@pytest.mark.sglang
@pytest.mark.parametrize("kind", KINDS)
def test_real_cache_evicts_by_lpc_key(real: dict, kind: str) -> None:
    assert real[kind]["order"] == EXPECTED_ORDER


@pytest.mark.sglang
@pytest.mark.parametrize("kind", KINDS)
def test_real_cache_shared_prefix_keeps_the_max_p(real: dict, kind: str) -> None:
    pooled = real[kind]["pooled"]
    assert pooled["order"] == EXPECTED_POOLED_ORDER
    assert pooled["shared_priority"] == 900_000
    assert pooled["shared_key"] == pytest.approx(
        sglang_scenarios.max_pooling(standin())["shared_key"], abs=1e-6
    )


@pytest.mark.sglang
@pytest.mark.parametrize("kind", KINDS)
def test_real_cache_never_evicts_a_locked_node(real: dict, kind: str) -> None:
    assert real[kind]["locked"] == EXPECTED_LOCKED


@pytest.mark.sglang
@pytest.mark.parametrize("kind", KINDS)
def test_real_cache_partial_node_splits_match_the_stand_in(real: dict, kind: str) -> None:
    assert real[kind]["splits"] == EXPECTED_SPLITS
    assert sglang_scenarios.partial_node_splits(standin()) == EXPECTED_SPLITS


@pytest.mark.sglang
@pytest.mark.parametrize("kind", KINDS)
def test_real_cache_evicts_the_lowest_decayed_probability(real: dict, kind: str) -> None:
    for result in real[kind]["decayed"]:
        assert result["checked"] > 10 and result["violations"] == []


@pytest.mark.sglang
@pytest.mark.parametrize("kind", KINDS)
def test_real_cache_lru_matches_lpc_without_predictions_and_the_stand_in(
    real: dict, kind: str
) -> None:
    r = real[kind]
    for seed in range(SEEDS):
        stand_in_lru = sglang_scenarios.random_operations(standin(StandInLRU()), seed, False)
        assert r["lru"][seed] == r["lpc_no_p"][seed], f"seed {seed}"
        assert r["lru"][seed] == json.loads(json.dumps(stand_in_lru)), f"seed {seed}"
        stand_in_lpc = sglang_scenarios.random_operations(standin(), seed, True)
        assert r["lpc_p"][seed] == json.loads(json.dumps(stand_in_lpc)), f"seed {seed}"
    assert r["lpc_p"] != r["lru"], "the predictions must change SGLang's eviction order"


@pytest.mark.sglang
@pytest.mark.parametrize("kind", KINDS)
def test_real_cache_allocator_ends_where_it_started(real: dict, kind: str) -> None:
    r = real[kind]
    assert r["slots_lost"] == [0] * len(r["slots_lost"])
    assert r["evictable_left"] == [0] * len(r["evictable_left"])


RUST_CORE = """
import json, warnings
warnings.filterwarnings("ignore")
from sglang.srt.plugins import load_plugins
load_plugins()
import torch
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
from sglang.srt.mem_cache.unified_cache.components import ComponentType
from sglang.srt.mem_cache.unified_cache.tree_core_registry import select_tree_core_backend
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
pool = MHATokenToKVPool(size=64, page_size=1, dtype=torch.float16, head_num=1, head_dim=4,
                        layer_num=1, device="cpu", enable_memory_saver=False)
allocator = TokenToKVPoolAllocator(size=64, dtype=torch.float16, device="cpu", kvcache=pool,
                                   need_sort=False)
out = {}
for policy in ("lru", "lpc"):
    params = CacheInitParams(disable=False, req_to_token_pool=None,
                             token_to_kv_pool_allocator=allocator, page_size=1,
                             eviction_policy=policy, tree_components=(ComponentType.FULL,))
    out["default_backend"] = select_tree_core_backend(params)
    try:
        out[policy] = type(UnifiedRadixCache(params).tree_core).__name__
    except ValueError as error:
        out[policy] = str(error)
print(json.dumps(out))
"""


@pytest.mark.sglang
def test_the_default_rust_tree_core_refuses_lpc(sglang_python: Path, tmp_path: Path) -> None:
    """Why docs/serving.md says SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python: SGLang's
    default tree core for UnifiedRadixCache is native and knows only its own policies."""
    site = entry_point_site(tmp_path, "sglang.srt.plugins")
    out = json.loads(
        run_snippet(sglang_python, RUST_CORE, {"SGLANG_PLUGINS": "lpc"}, site).splitlines()[-1]
    )
    assert out["default_backend"] == "rust"
    assert out["lru"] == "RustUnifiedTreeCore"
    assert out["lpc"].startswith("Unknown eviction policy: lpc")


PIN_EXPERIMENT = """
import json, warnings
warnings.filterwarnings("ignore")
from sglang.srt.plugins import load_plugins
load_plugins()
from lpc.drivers.sglang_radix import KINDS, FakeClock, RealRadixCache
from lpc.integrations.sglang_strategy import PassCap, node_tenant, probability_to_priority

CHATS, TURNS, SHOTS, TOKENS = 8, 6, 2, 2048
ATTACK = probability_to_priority(1.0)

class Recording(PassCap):
    # Each evaluation SGLang asks for: (window, tenant, tokens, keyed above the fallback p,
    # whether two tenants had been evaluated before it: the cap binds).
    def __init__(self, share):
        super().__init__(share)
        self.log = []
    def keeps(self, node, pins):
        shared = self._shared
        kept = super().keeps(node, pins)
        self.log.append((self.windows, node_tenant(node), len(node.key), pins and kept, shared))
        return kept

def worst_window(log, share):
    # The largest (a tenant's tokens keyed above the fallback) - share x (the window's tokens)
    # over the windows that began with the cap binding.
    windows, unbound = {}, {e[0] for e in log if not e[4]}
    for window, tenant, tokens, pinned, _ in log:
        if window in unbound:
            continue
        total, by_tenant = windows.setdefault(window, [0, {}])
        windows[window][0] += tokens
        by_tenant[tenant] = by_tenant.get(tenant, 0) + (tokens if pinned else 0)
    return max((max(t.values()) - share * total for total, t in windows.values()), default=0)

def run(kind, policy, config):
    # The victim's chats (64 tokens, 32 more each turn) and between any two of its requests
    # two one-shot 64-token prompts of the attacker with a trusted p = 1.0, each request under
    # its tenant's cache_salt, one at a time (arrive: match, lock, allocate; complete: insert).
    clock = FakeClock()
    tree = RealRadixCache(kind, TOKENS, policy, config, clock)
    share = (config or {}).get("pinned_share", 0.5)
    if policy == "lpc" and share < 1.0:
        tree.strategy.pass_cap = Recording(share)
    hits = total = shot = 0
    prompts = {c: [c * 10_000 + i for i in range(64)] for c in range(CHATS)}
    for turn in range(TURNS):
        for c in range(CHATS):
            if turn:
                prompts[c] = prompts[c] + [c * 10_000 + 32 * (turn + 1) + i for i in range(32)]
            requests = [("victim", prompts[c], 0)]
            for _ in range(SHOTS):
                requests.append(("attacker", [10**6 + 64 * shot + i for i in range(64)], ATTACK))
                shot += 1
            for salt, tokens, priority in requests:
                clock.now += 1.0
                held = tree.arrive(tokens, len(tokens), priority, cache_salt=salt)
                assert held is not None
                tree.complete(held)
                if salt == "victim":
                    hits, total = hits + held.prefix_len, total + len(tokens)
    cap = getattr(tree.strategy, "pass_cap", None)
    log = cap.log if cap is not None else []
    lost = tree.capacity_tokens - tree.available_slots() - tree.evictable_tokens()
    tree.close()
    return {"victim_hit_ratio": hits / total, "capped": cap.capped if cap else 0,
            "evaluations": len(log), "windows": len({e[0] for e in log}),
            "pinned_tokens": sum(e[2] for e in log if e[3]),
            "worst_window": worst_window(log, share), "slots_held": lost}

trusted = {"scale_per_s": 0.01, "fallback_probability": 0.5, "trust_request_priority": True}
out = {kind: {"lru": run(kind, "lru", None),
              "uncapped": run(kind, "lpc", {**trusted, "pinned_share": 1.0}),
              "capped": run(kind, "lpc", trusted),
              "none": run(kind, "lpc", {**trusted, "pinned_share": 0.0})} for kind in KINDS}
print(json.dumps(out))
"""


@pytest.mark.sglang
def test_real_caches_cap_one_tenants_pinned_share(sglang_python: Path, tmp_path: Path) -> None:
    """The pin experiment in both real trees, every evaluation SGLang asks for recorded:
    with the default `pinned_share` (0.5, `PassCap`) no tenant's tokens keyed above the
    fallback p pass half of any window's evaluated tokens, and with 0 none are; uncapped,
    the attacker's p = 1.0 nodes cost the victim most of LRU's hits, capped it keeps more.
    Which of the attacker's nodes keep their p follows SGLang's order of evaluation (a set
    of nodes, by address), so the capped hit ratio varies from run to run (0.09 to 0.17
    seen) and only its bound and its direction are checked."""
    site = entry_point_site(tmp_path, "sglang.srt.plugins")
    stdout = run_snippet(sglang_python, PIN_EXPERIMENT, {"SGLANG_PLUGINS": "lpc"}, site)
    out = json.loads(stdout.splitlines()[-1])
    for kind, r in out.items():
        lru, uncapped, capped, none = (r[k] for k in ("lru", "uncapped", "capped", "none"))
        assert lru["victim_hit_ratio"] > 0, kind
        assert uncapped["capped"] == 0
        assert uncapped["victim_hit_ratio"] < lru["victim_hit_ratio"] / 2, kind
        assert capped["capped"] > 0 and capped["windows"] > 10, kind
        assert capped["worst_window"] <= 0 and none["worst_window"] <= 0, kind
        assert capped["pinned_tokens"] > none["pinned_tokens"], kind
        assert capped["victim_hit_ratio"] > uncapped["victim_hit_ratio"], kind
        assert {run["slots_held"] for run in r.values()} == {0}, "a slot outlived its request"
        line = (
            f"SGLang {kind} pin experiment (2048 tokens, the attacker's p = 1.0 trusted): the "
            f"victim's hit ratio LRU {lru['victim_hit_ratio']:.3f}, uncapped "
            f"{uncapped['victim_hit_ratio']:.3f}, pinned_share 0.5 "
            f"{capped['victim_hit_ratio']:.3f} ({capped['capped']} of "
            f"{capped['evaluations']} evaluations capped, {capped['windows']} windows)"
        )
        print(line)
        REPORT.append(line)
