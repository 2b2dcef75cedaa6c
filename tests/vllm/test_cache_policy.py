"""LPC as vLLM 0.33's CPU-tier `CachePolicy`, loaded by real vLLM by name and module path.

`CPUOffloadingManager` resolves `LPCCachePolicy` through `CachePolicyFactory` from
`lpc.integrations.vllm_cache_policy` and drives it through stores, finishes and a pinning
load (tests/vllm/cache_policy_driver.py). LPC must evict the request least likely to
continue where vLLM's own LRU evicts the oldest, and never a pinned chunk. With the GPU plugin registered in the same
process, the p comes from the plugin's release of each finished request (no
`kv_transfer_params`), and `LPCPooledCachePolicy` runs with the tier's own horizon.

Marked `vllm`: run with `pytest -m vllm tests/vllm` after `bash scripts/setup_vllm_venv.sh`.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm

REPO_ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("cache_policy_driver.py")


def drive(vllm_python: Path, *args: str, **variables: str) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), **variables}
    done = subprocess.run(
        [str(vllm_python), str(DRIVER), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def runs(vllm_python: Path) -> dict[str, list[dict]]:
    return {
        # No plugin: the requests' p in kv_transfer_params, from an API layer the operator
        # trusts (by default the CPU tier ignores a body's p).
        "lpc": drive(
            vllm_python,
            "LPCCachePolicy",
            "lpc.integrations.vllm_cache_policy",
            LPC_TRUST_REQUEST_HINTS="1",
        ),
        "untrusted": drive(
            vllm_python,
            "LPCCachePolicy",
            "lpc.integrations.vllm_cache_policy",
            LPC_TRUST_REQUEST_HINTS="0",
        ),
        "lru": drive(vllm_python, "lru"),
        "plugin": drive(
            vllm_python, "LPCCachePolicy", "lpc.integrations.vllm_cache_policy", "--plugin"
        ),
        "pooled": drive(
            vllm_python, "LPCPooledCachePolicy", "lpc.integrations.vllm_cache_policy", "--plugin"
        ),
        "access": drive(
            vllm_python,
            "LPCCachePolicy",
            "lpc.integrations.vllm_cache_policy",
            "--plugin",
            "--access",
            LPC_ACCESS_MODEL=str(REPO_ROOT / "models" / "mooncake-access"),
        ),
    }


def test_vllm_loads_lpc_by_name_and_evicts_the_unlikely_request(runs) -> None:
    plain = runs["lpc"][0]
    assert sorted(plain["evicted"]["third"]) == ["unlikely-0", "unlikely-1"]
    assert plain["resident"] == ["likely-0", "likely-1", "third-0", "third-1"]
    # vLLM's own LRU on the same calls evicts the oldest request instead.
    assert sorted(runs["lru"][0]["evicted"]["third"]) == ["likely-0", "likely-1"]


def test_an_untrusted_body_probability_leaves_lrus_order(runs) -> None:
    """Without the trust setting the same requests' p = 0.9 / 0.1 in kv_transfer_params are
    ignored: every chunk takes the fallback p, and the oldest go first, as vLLM's LRU."""
    assert runs["untrusted"][0]["evicted"] == runs["lru"][0]["evicted"]


def test_a_chunk_pinned_by_a_load_is_never_evicted(runs) -> None:
    pinned = runs["lpc"][1]
    assert "unlikely-0" in pinned["resident"]
    assert "unlikely-0" not in pinned["evicted"]["third"]
    # The other unlikely chunk goes first, then the likely request's tail.
    assert pinned["evicted"]["third"] == ["unlikely-1", "likely-1"]


def test_the_cpu_tier_takes_p_from_the_gpu_plugins_release(runs) -> None:
    """No kv_transfer_params: the p each request carried to the GPU plugin (`extra_args`)
    reaches the CPU tier through the plugin's release, and orders it as before."""
    for through_plugin, carried in zip(runs["plugin"], runs["lpc"], strict=True):
        assert through_plugin["evicted"] == carried["evicted"]
        assert through_plugin["resident"] == carried["resident"]
    stats = runs["plugin"][0]["stats"]
    assert stats["releases"] == 3 and stats["probabilities_from_request"] == 3
    assert stats["plugin_errors"] == 0 and stats["invalid_probabilities"] == 0


def test_the_pooled_policy_runs_with_the_tiers_own_horizon(runs) -> None:
    pooled = runs["pooled"][0]
    assert pooled["horizon_s"] == 900.0
    assert pooled["stats"]["plugin_errors"] == 0
    assert len(pooled["resident"]) == 4


def test_the_cpu_tier_uses_the_in_process_access_models_p(runs) -> None:
    """Requests with no p: the plugin's access model predicts each at its GPU release, and the
    CPU tier's chunks of that request carry the same p."""
    access = runs["access"][0]
    assert access["stats"]["predictions_in_process"] == 3
    assert access["stats"]["plugin_errors"] == 0
    assert access["cpu_p"]
    for name, p in access["cpu_p"].items():
        assert p is not None and p == access["gpu_p"][name.rsplit("-", 1)[0]]
