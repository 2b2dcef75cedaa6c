"""The LPC strategy inside SGLang 0.5.23's real radix caches (marked `sglang`).

In SGLang's venv (scripts/setup_sglang_venv.sh), with the plugin loaded by SGLang's own
entry-point loader (SGLANG_PLUGINS=lpc), `lpc.drivers.sglang_radix.RealRadixCache`
builds SGLang's `RadixCache` and `UnifiedRadixCache` (the tree of a served full-attention
model) on CPU with a real allocator and KV pool and `eviction_policy="lpc"`, which SGLang
resolves through `get_eviction_strategy`. The scenarios of `sglang_scenarios` run on both and
on the stand-in, and must give the expected results on all three; every run ends with the
allocator holding exactly the slots it started with.
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
